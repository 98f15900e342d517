"""The kernel attach modes, one module each (issue 44): a module holds everything about its mode (its record, its
feature probe, which programs load and how, how they attach) as a module-level MODE, an AttachMode. The registry,
kernel/attach_modes.py, finds them by listing this package; base.py is what they share, not a mode."""

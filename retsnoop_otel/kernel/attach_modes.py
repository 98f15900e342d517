"""The registry of attach modes. The kernel modes are the modules of kernel/modes/, one each (issue 44): found by
listing that package, so a new mode is its module, its BPF flavour and its tests. The user-space modes are records
in kernel/uprobes.py. Importing it loads no libbpf (the probes run only when the feature checks call them)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from retsnoop_otel.kernel import modes, uprobes
from retsnoop_otel.kernel.modes.base import AttachMode
from retsnoop_otel.kernel.uprobes import UserAttachMode


def _kernel_modes() -> tuple[AttachMode, ...]:
    """MODE of each module of kernel/modes/ (listed, not through pkgutil: that imports inspect, 0.3 s of a start
    under emulation)."""
    found = []
    names = {n.partition(".")[0] for d in modes.__path__ for n in os.listdir(d) if n.endswith((".py", ".pyc"))}
    for name in sorted(names - {"__init__"}):
        mode = getattr(importlib.import_module(f"{modes.__name__}.{name}"), "MODE", None)
        if isinstance(mode, AttachMode):
            found.append(mode)
    return tuple(sorted(found, key=lambda m: (m.position, m.name)))


MODES: tuple[AttachMode, ...] = _kernel_modes()
# Measured in the VM (bench/probe_cost.py, README "Attach modes"): kprobe.session and kprobe.multi attach
# and detach a set in one call; kprobe.session also costs least per traced call (one program, and no
# exit probe at all for calls outside a session). Single kprobes attach 3x faster than per-function
# fentry clones (each clone is verified) and never fire inside our own BPF programs. Each mode's auto_rank
# and offer_rank place it.
AUTO_ORDER: tuple[str, ...] = tuple(m.name for m in sorted((m for m in MODES if m.auto_rank is not None),
                                                           key=lambda m: m.auto_rank or 0))  # first usable wins
OFFER_ORDER: tuple[str, ...] = tuple(m.name for m in sorted((m for m in MODES if m.offer_rank is not None),
                                                            key=lambda m: m.offer_rank or 0))  # a refusal's
# whether any mode can trace, asked in the order that probes least (build_facts.ModeFacts): the automatic choice's first
CHECK_ORDER: tuple[str, ...] = tuple(dict.fromkeys((*AUTO_ORDER, *OFFER_ORDER)))
BASIC: tuple[str, ...] = tuple(m.name for m in MODES if m.basic)  # when none works, their refusals say why
BY_NAME: dict[str, AttachMode] = {m.name: m for m in MODES}
# the Features fields the modes read, each with the first mode that reads it (whose probe finds out): modes may share
# one, a kernel capability used in different ways
FEATURES: dict[str, AttachMode] = {}
for _mode in MODES:
    FEATURES.setdefault(_mode.feature, _mode)
NAMES: tuple[str, ...] = tuple(BY_NAME)
ASKED: tuple[str, ...] = tuple(m.name for m in MODES if m.flags)  # the others are flavours the runtime picks (cheaper)
PROGRAMS: dict[str, tuple[str, ...]] = {m.name: m.programs for m in MODES}
TRAMPOLINE: frozenset[str] = frozenset(m.name for m in MODES if m.trampoline)
BY_ADDRESS: frozenset[str] = frozenset(m.name for m in MODES if m.by_address)


def cheapest(mode: str, available: Callable[[str], bool]) -> str:
    """The mode that runs for `mode`: its cheaper flavour where `available` says the kernel has it (--origins-only's
    returns by fexit.multi on 7.2+), else itself."""
    m = BY_NAME.get(mode)
    return m.cheaper if m is not None and m.cheaper and available(m.cheaper) else mode


# the user-space modes: records of kernel/uprobes.py, which attaches them
USER_MODES: tuple[UserAttachMode, ...] = uprobes.RECORDS
USER_NAMES: tuple[str, ...] = uprobes.USER_MODES

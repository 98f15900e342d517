"""Text for people: retsnoop's stack, call table and LBR views, JSON lines and Chrome trace events."""

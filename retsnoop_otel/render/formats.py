"""How the console writes stacks and arguments: retsnoop's stacks.* and args.fmt-* -C keys, as plain data
(runtime/config.py's ConsoleConfig holds them; render/ reads them, and the runtime hands the argument ones to
symbols/args.py's formatter)."""

from typing import NamedTuple


class StackFormat(NamedTuple):
    """How stack and LBR rows are written (retsnoop's stacks.* keys)."""

    unfiltered: bool = False  # keep the tracer's own frames (and every LBR record)
    emit_addrs: bool = False  # each frame's address first, '~' before those the filter would drop
    dec_offs: bool = False  # symbol offsets in decimal


PLAIN_STACKS = StackFormat()  # the default, for functions' defaults


class ArgsFormat(NamedTuple):
    """How -A arguments are written on the console (retsnoop's args.fmt-* and args.capture-raw-ptrs keys)."""

    mode: str = "compact"  # compact: one line (the calls table's CONTEXT column) | multiline | verbose
    max_width: int = 120  # characters of one argument's value (compact, multiline); 0: no limit
    raw_ptrs: bool = False  # a pointer argument's own value before what it points to

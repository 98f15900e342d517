"""The guest batch's progress lines: printed by tests/vm/guest_batch.py, read on the host by guest_crash (which
scenario a crash hit) and guest_stall (how long the guest may stay silent). One format, kept here for all three."""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "[batch] "
_START = re.compile(re.escape(PREFIX) + r"(\S+): start \(budget ([\d.]+) s\)")
_END = re.compile(re.escape(PREFIX) + r"(\S+): (\w+) in [\d.]+ s")


@dataclass(frozen=True)
class Progress:
    """A scenario started (with its budget) or ended (with its status)."""

    name: str
    started: bool
    budget_s: float = 0.0
    status: str = ""


def start(name: str, budget_s: float) -> str:
    return f"{PREFIX}{name}: start (budget {budget_s:g} s)"


def end(name: str, status: str, seconds: float) -> str:
    return f"{PREFIX}{name}: {status} in {seconds:.1f} s"


def parse(line: str) -> Progress | None:
    """A start or end line's record; None for any other line (the batch's own, a scenario's output)."""
    if m := _START.match(line):
        return Progress(m.group(1), True, budget_s=float(m.group(2)))
    if m := _END.match(line):
        return Progress(m.group(1), False, status=m.group(2))
    return None

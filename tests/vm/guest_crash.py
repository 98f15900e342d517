"""A guest kernel crash in a VM batch: find it in the console, name the scenario it hit, decide what boots again.

Pure functions over recorded text; tests/vm/conftest.py feeds them one boot's output and console, and the host
tests (tests/vm/test_harness.py) feed them recorded ones.

A boot's output is tests/vm/run's: a "tests/vm/run: booting RELEASE (...)" line per boot attempt, the batch's
lines ("[batch] NAME: start", "[batch] NAME: ok in 1.0 s", the scenarios' own), and, when the VM stopped
without an exit code, "... without an exit code; last console lines:" and the console's tail. Only the last
attempt counts: tests/vm/run boots again by itself when a guest died before the command started, so what an
earlier attempt printed is over. Its console is the whole of console.log (tests/vm/run starts that file anew
at each attempt) or, without it, the tail in the output.

A crash is a kernel console line that starts (after its timestamp) with "Oops:", "Kernel panic - not syncing",
"BUG:", "general protection fault", "kernel BUG at" (arm64: "Unable to handle kernel", "Internal error:"), or
is a die() header of an x86 kernel older than 6.9 (no "Oops:" prefix then: "int3: 0000 [#1] SMP NOPTI").
Lockup reports ("BUG: soft lockup", "BUG: workqueue lockup") are watchdog warnings after which the kernel goes
on, not crashes.

A crash of an attempt whose batch had not started a scenario yet ("[batch] NAME: start") happened while the guest
booted or the batch got ready: nothing of ours had run in that kernel (GuestCrash.before_scenarios).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.vm import batch_lines

BOOTING = "tests/vm/run: booting "
CONSOLE_TAIL = "last console lines:"  # tests/vm/run's line before the console tail of a VM without an exit code
FINISHED = ("ok", "error", "timeout")  # guest_batch's statuses: the scenario ran to an outcome
MARKERS = ("Oops:", "Kernel panic - not syncing", "BUG:", "general protection fault", "kernel BUG at",
           "Unable to handle kernel", "Internal error:")  # the last two: arm64's
NOT_CRASHES = ("BUG: soft lockup", "BUG: workqueue lockup")
PANIC = "Kernel panic - not syncing"
MAX_EXCERPT = 40  # console lines kept from the first crash line on

_TIMESTAMP = re.compile(r"^\s*\[\s*\d+\.\d+\]\s?")
_DIE_HEADER = re.compile(r"^[\w ]+: [0-9a-f]{4} \[#\d+\]")  # int3: 0000 [#1] SMP NOPTI (before 6.9)
_RIP = re.compile(r"\bRIP: 0010:(\S+)")  # the kernel's (0033: user space, after a syscall)
_COMM = re.compile(r"\bComm: (\S+)")


@dataclass(frozen=True)
class GuestCrash:
    """A guest kernel crash: its first console line (without the timestamp), where it hit, the console excerpt,
    the scenario that was running (None: none was), and when none was, the last one that attempt finished (None:
    the attempt had started none, e.g. it crashed while booting)."""

    line: str
    excerpt: str
    scenario: str | None = None
    release: str = ""
    rip: str = ""
    comm: str = ""
    after: str | None = None

    @property
    def headline(self) -> str:
        """'Oops: int3: 0000 [#1] SMP NOPTI (RIP __schedule+0x2a7/0x1070, in kworker/u8:4)'"""
        where = ", ".join(p for p in (f"RIP {self.rip}" if self.rip else "", f"in {self.comm}" if self.comm else "")
                          if p)
        return f"{self.line} ({where})" if where else self.line

    @property
    def before_scenarios(self) -> bool:
        """The crashed attempt had not started a scenario: our code cannot have caused it."""
        return self.scenario is None and self.after is None

    @property
    def during(self) -> str:
        if self.scenario:
            return f"during scenario {self.scenario!r}"
        if self.after:
            return f"after scenario {self.after!r}, before the next one started"
        return "before any scenario started"


def message(line: str) -> str:
    """A console line without its printk timestamp."""
    return _TIMESTAMP.sub("", line, count=1).rstrip()


def is_crash_line(line: str) -> bool:
    msg = message(line)
    if msg.startswith(NOT_CRASHES):
        return False
    return msg.startswith(MARKERS) or _DIE_HEADER.match(msg) is not None


def last_boot(output: str) -> str:
    """The output of tests/vm/run's last boot attempt (all of it when no attempt line is there)."""
    at = output.rfind(BOOTING)
    return output if at < 0 else output[at:]


def release_of(output: str) -> str:
    """The kernel release the last attempt booted ('7.2.13+deb14-amd64'), or ''."""
    first = last_boot(output).partition("\n")[0]
    return first.removeprefix(BOOTING).split(" ", 1)[0] if first.startswith(BOOTING) else ""


def console_tail(output: str) -> str:
    """The console tail tests/vm/run printed after the last attempt stopped without an exit code, or ''."""
    boot = last_boot(output)
    at = boot.rfind(CONSOLE_TAIL)
    return "" if at < 0 else boot[at + len(CONSOLE_TAIL):].lstrip("\n")


def _progress(output: str) -> tuple[str | None, str | None]:
    """From the last attempt's '[batch]' lines: (the scenario it started and did not finish, the last it finished)."""
    started: list[str] = []
    finished: list[str] = []
    for line in last_boot(output).splitlines():
        if p := batch_lines.parse(line):
            (started if p.started else finished).append(p.name)
    unfinished = [n for n in started if n not in finished]
    return (unfinished[-1] if unfinished else None), (finished[-1] if finished else None)


def running_scenario(output: str) -> str | None:
    """The scenario the last attempt started and did not finish, from the batch's '[batch]' lines."""
    return _progress(output)[0]


def attempts(output: str) -> int:
    """How many times tests/vm/run booted the guest in this output (its 'booting' lines)."""
    return sum(1 for line in output.splitlines() if line.startswith(BOOTING))


def find_crash(console: str) -> GuestCrash | None:
    """The first crash in a console text: its line, and the lines from there to the end of the report (the
    '---[ end trace' line, or the panic line), at most MAX_EXCERPT, plus the panic line when it comes later."""
    lines = console.splitlines()
    start = next((i for i, line in enumerate(lines) if is_crash_line(line)), None)
    if start is None:
        return None
    end = len(lines) - 1
    for j in range(start, len(lines)):
        msg = message(lines[j])
        if msg.startswith("---[ end ") or (j > start and msg.startswith(PANIC)):
            end = j
            break
    block = lines[start:min(end, start + MAX_EXCERPT - 1) + 1]
    panic = next((j for j in range(start, len(lines)) if message(lines[j]).startswith(PANIC)), None)
    if panic is not None and panic >= start + len(block):
        block += ["[...]", lines[panic]]
    text = "\n".join(block)
    rip = _RIP.search(text)
    comm = _COMM.search(text)
    return GuestCrash(message(lines[start]), "\n".join(line.rstrip() for line in block),
                      rip=rip.group(1) if rip else "", comm=comm.group(1) if comm else "")


def detect(output: str, console: str = "") -> GuestCrash | None:
    """The crash that ended the last boot attempt, with the scenario it hit: searched in that attempt's whole
    console (console.log) when given, else in the console tail of the output."""
    crash = find_crash(console) if console else None
    if crash is None:
        crash = find_crash(console_tail(output))
    if crash is None:
        return None
    running, finished = _progress(output)
    return GuestCrash(crash.line, crash.excerpt, running, release_of(output), crash.rip, crash.comm,
                      None if running else finished)


def unfinished(order: Iterable[str], statuses: Mapping[str, Mapping]) -> list[str]:
    """The scenarios (in run order) the batch holds no outcome for."""
    return [n for n in order if statuses.get(n, {}).get("status") not in FINISHED]


def assess(order: Iterable[str], statuses: Mapping[str, Mapping], output: str,
           console: str = "") -> tuple[GuestCrash | None, list[str]]:
    """After one boot: (the guest kernel crash that stopped the batch, the scenarios to run in a fresh boot).

    Only a crash earns a fresh boot, and only for the scenarios without an outcome: the crashed one and those
    after it. A scenario that failed or overran its budget has its outcome and never runs again; scenarios left
    without a crash in the console (a VM timeout, QEMU killed) are not run again either. A crash in a batch that
    still finished every scenario is not this function's business (nothing is missing): (None, [])."""
    left = unfinished(order, statuses)
    crash = detect(output, console) if left else None
    return crash, (left if crash is not None else [])


def boot_crashes(output: str) -> list[GuestCrash]:
    """Crashes of the attempts before the last one in a tests/vm/run output: guests that died before the command
    started, which tests/vm/run booted again after by itself."""
    attempts = output.split(BOOTING)[1:-1]
    found = [detect(BOOTING + attempt) for attempt in attempts]
    return [c for c in found if c is not None]

"""The syscall preset's session boundaries (bpf/syscalls.bpf.h): raw tracepoints at every syscall's entry and exit,
which start and end the sessions of the entry functions whose syscall numbers are known, in place of a probe on
each of those functions. A cheap syscall cost several times its own time with a kprobe.session on its entry function
(bench/RESULTS.md "Syscall preset"); a raw tracepoint and an array lookup by number cost a fraction of that.

Only the preset's entry functions go this way (CaptureConfig.syscall_entries): they are what it enters by, and it
knows every syscall's. Raw tracepoints exist on every kernel from 5.10 on. --origins-only (no sessions) hooks the
exit alone, where a failing syscall counts its error chain's origin (bpf/origins.bpf.h).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import libbpf as lb

if TYPE_CHECKING:
    from retsnoop_otel.kernel.modes.base import AttachMode

# program -> tracepoint: the sessions' (exits first: none starts unended), and --origins-only's (bpf/origins.bpf.h),
# where a syscall's exit ends its error chain and counts a failure
SESSIONS = {"sys_exit_session": "sys_exit", "sys_enter_session": "sys_enter"}
ORIGINS = {"origin_sys_exit": "sys_exit"}
PROGRAMS = {**SESSIONS, **ORIGINS}
MAX_SYSCALL_NR = 1024  # bpf/syscalls.bpf.h


def for_mode(mode: AttachMode | None) -> dict[str, str]:
    """The programs of a mode's syscall entries: sessions, or the origin counts of a mode without them."""
    return SESSIONS if mode is None or mode.sessions else ORIGINS


def hooked(funcs: Sequence[TracedFunc], entries: Mapping[str, Sequence[int]]) -> dict[int, tuple[int, ...]]:
    """Function id -> syscall numbers, for the entry functions the tracepoints start sessions for (kernel
    functions only; numbers the map cannot hold are dropped)."""
    out = {}
    for f in funcs:
        if f.is_entry and f.binary is None and f.module is None:
            nrs = tuple(n for n in entries.get(f.name, ()) if 0 <= n < MAX_SYSCALL_NR)
            if nrs:
                out[f.id] = nrs
    return out


def configure(obj: lb.BpfObject, hooks: Mapping[int, Sequence[int]], programs: Mapping[str, str]) -> None:
    """Before load: `programs` (for_mode) load only when there are syscalls to hook, the others never."""
    for name in PROGRAMS:
        obj.program(name).set_autoload(bool(hooks) and name in programs)


def fill(obj: lb.BpfObject, hooks: Mapping[int, Sequence[int]]) -> None:
    """After load: each hooked syscall's number -> its entry function's id + 1."""
    if not hooks:
        return
    ids = obj.map("nr_ids")
    for fid, nrs in hooks.items():
        for nr in nrs:
            ids.update(struct.pack("<I", nr), struct.pack("<I", fid + 1))


def attach(obj: lb.BpfObject, hooks: Mapping[int, Sequence[int]], links: list[lb.Link],
           programs: Mapping[str, str]) -> None:
    """Attach the tracepoints (appending their links), or raise: without them the hooked entries have no sessions
    (no counts)."""
    if hooks:
        for name, tracepoint in programs.items():
            links.append(obj.program(name).attach_raw_tracepoint(tracepoint))


def running(obj: lb.BpfObject, links: list[lb.Link], programs: Mapping[str, str]) -> list[tuple[str, int]]:
    """(name, fd) of the programs while attached, for their run counts and times."""
    return [(name, obj.program(name).fd) for name in programs] if links else []

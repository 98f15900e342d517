"""fentry/fexit programs retargeted at each traced function: verified in parallel, linked one at a time.

fentry/fexit programs are bound to one function at load time, so mass-attaching needs a verified
program per function and direction: the bulk of fentry's attach time. The kernel verifies parallel
loads in parallel (ctypes drops the GIL during the call), so the clones are loaded on a few threads
before the tracer links them to their trampolines, which the kernel updates one at a time anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_progs

CLONE_THREADS = 4  # clones verified at once (bounded by the CPUs)
# template -> the kernel's name for its clones (at most 15 characters): entry functions run the first
# pair, the others the smaller "inner" pair (bpf/flavours.bpf.h)
TAGS = {"fexit_exit": "rs_fexit", "fentry_entry": "rs_fentry", "fexit_inner": "rs_fexit_in",
        "fentry_inner": "rs_fentry_in"}
TEMPLATES = {tag: template for template, tag in TAGS.items()}
Clone = list[tuple[int, int, str]]  # (program fd, attach type, program name), exit first
T = TypeVar("T")


def load_clone(exit_prog: lb.BpfProgram, entry_prog: lb.BpfProgram, btf_id: int) -> Clone:
    """The exit and entry templates retargeted at the function with BTF id `btf_id`."""
    out: Clone = []
    try:
        for prog, attach_type in ((exit_prog, libbpf_progs.ATTACH_TRACE_FEXIT),
                                  (entry_prog, libbpf_progs.ATTACH_TRACE_FENTRY)):
            tag = TAGS[prog.name]
            out.append((libbpf_progs.clone_program(prog, attach_btf_id=btf_id, attach_type=attach_type, name=tag),
                        attach_type, tag))
    except BaseException:
        for fd, _, _ in out:
            os.close(fd)
        raise
    return out


def usable_cpus() -> int:
    """CPUs this process may run on (a cpuset or taskset leaves fewer than the machine has): more
    verifying threads than that only take turns on the same CPUs."""
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def load_all(funcs: Sequence[T], load: Callable[[T], Clone], threads: int = CLONE_THREADS,
             cpus: int | None = None) -> dict[int, Clone | BaseException]:
    """func.id -> its clone, or the LibbpfError that refused it (the caller reports it as not attached)."""
    def one(f: T) -> Clone | BaseException:
        try:
            return load(f)
        except lb.LibbpfError as exc:
            return exc

    n = max(1, min(threads, usable_cpus() if cpus is None else cpus, len(funcs)))
    if n == 1:
        results = [one(f) for f in funcs]
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(one, funcs))
    return {f.id: res for f, res in zip(funcs, results, strict=True)}  # type: ignore[attr-defined]

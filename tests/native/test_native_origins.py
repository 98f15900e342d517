"""Error origins counted by the real BPF object in the host kernel, driven through uprobes (issue 46 point 1).

tests/native/simkern.c fails in known places: sk_syscall(0) in sk_check (-EINVAL, passed up through sk_create
past a void call), sk_syscall(101) in sk_alloc (NULL, turned into -ENOMEM by sk_create), sk_recurse(3) at its
deepest level (-E2BIG). The kernel's origin map must count each failing call once, where it started, whatever
the success sampler keeps; user space's origins of the same sessions and the kernel's rule replayed over their
recorded calls must name the same functions. Kernel attach modes: tests/vm/test_error_origins.py."""

from __future__ import annotations

import os
from collections import Counter

from retsnoop_otel.capture.origins import error_origin
from retsnoop_otel.capture.sampling import threshold
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.user_funcs import in_binary
from tests.native.simkern_funcs import drive, simkern_funcs
from tests.origin_oracle import origin_from_calls

CALLS = [("sk_syscall", 0)] * 4 + [("sk_syscall", 101)] * 3 + [("sk_syscall", 5)] * 50 + [("sk_recurse", 3)] * 2
WANT = [("sk_recurse", "sk_recurse", "E2BIG", 2), ("sk_syscall", "sk_alloc", "NULL", 3),
        ("sk_syscall", "sk_check", "EINVAL", 4)]


def _run(simkern, calls, **cfg):
    path, lib = simkern
    funcs = simkern_funcs()
    config = CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()], exclude_self=False, **cfg)
    tracer = Tracer(in_binary(funcs, path), config)
    sessions: list = []
    asm = SessionAssembler()
    try:
        drive(tracer, lib, calls, lambda rec: (s := asm.feed(rec)) and sessions.append(s))
        counts = sorted((funcs[c.entry_func_id].name, funcs[c.origin_func_id].name, c.error, c.count)
                        for c in tracer.origin_counts())
        cstats = tracer.capture_stats()
    finally:
        tracer.close()
    return funcs, sessions, counts, cstats


def test_each_failing_call_is_counted_once_where_it_started(simkern) -> None:
    funcs, sessions, counts, cs = _run(simkern, CALLS, emit_calls=True, capture_success=True,
                                       success_threshold=threshold(0.01))
    assert counts == WANT
    assert cs.origins_dropped == 0 and cs.dropped_sessions == 0 and cs.sessions_started == len(CALLS)
    failing = [s for s in sessions if s.is_err]
    user = Counter((funcs[s.chain[0].func_id].name, o.name, o.error) for s in failing if (o := error_origin(s, funcs)))
    assert sorted((*k, n) for k, n in user.items()) == counts
    assert all(origin_from_calls(s.calls, funcs) == s.chain[-1].func_id for s in failing) and len(failing) == 9


def test_counted_in_stack_mode_and_in_mode_metrics_where_nothing_is_reported(simkern) -> None:
    """Without per-call records, and with no session reported at all (what mode metrics configures)."""
    assert _run(simkern, CALLS)[2] == WANT
    funcs, sessions, counts, cs = _run(simkern, CALLS, min_duration_ns=1 << 62, kernel_stack=False, func_counts=False)
    assert counts == WANT and sessions == [] and cs.sessions_reported == 0


def test_origins_beyond_the_map_are_counted_as_dropped(simkern) -> None:
    _, _, counts, cs = _run(simkern, [("sk_syscall", 0)] * 4 + [("sk_syscall", 101)] * 3, max_origin_counts=1)
    assert counts == [("sk_syscall", "sk_check", "EINVAL", 4)] and cs.origins_dropped == 3

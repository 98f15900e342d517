"""Error sessions sampled for export by the real BPF object, driven through uprobes (issue 46 point 2).

sk_syscall(0) fails in sk_check (-EINVAL), sk_syscall(101) in sk_alloc (NULL), sk_recurse(3) at its deepest level
(-E2BIG). Whatever the error sampler keeps, the kernel's origin map counts every failing call; the ones it drops
send no record and are counted (errors_sampled_out); the kept ones say how they were kept (sampling flags, and the
randomness a probability compared). By rate, each origin has its own bucket: a rare origin is never crowded out."""

from __future__ import annotations

import os

from retsnoop_otel.capture import records
from retsnoop_otel.capture.sampling import MAX_THRESHOLD, Sampling, kernel_sampling, threshold
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.user_funcs import in_binary
from tests.native.simkern_funcs import drive, simkern_funcs
from tests.record_sink import SessionSink

LOW56 = (1 << 56) - 1


def _run(simkern, calls, sampling: Sampling, error_threshold: int | None = None, **cfg):
    """Sessions, record counts by type, the kernel's origin counts and its counters under one sampling."""
    path, lib = simkern
    funcs = simkern_funcs()
    ks = kernel_sampling(sampling)
    config = CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()], exclude_self=False,
                           capture_success=ks.capture_success, success_threshold=ks.threshold,
                           success_interval_ns=ks.interval_ns, success_burst_ns=ks.burst_ns,
                           error_threshold=ks.error_threshold if error_threshold is None else error_threshold,
                           error_interval_ns=ks.error_interval_ns, error_burst_ns=ks.error_burst_ns, **cfg)
    tracer = Tracer(in_binary(funcs, path), config)
    sink = SessionSink()
    try:
        drive(tracer, lib, calls, sink)
        counts = sorted((funcs[c.entry_func_id].name, funcs[c.origin_func_id].name, c.error, c.count)
                        for c in tracer.origin_counts())
        cstats = tracer.capture_stats()
    finally:
        tracer.close()
    return sink.sessions, sink.kinds, counts, cstats


def test_probability_exports_a_fraction_and_counts_every_origin(simkern) -> None:
    calls = [("sk_syscall", 0)] * 400 + [("sk_syscall", 5)] * 20
    sessions, _, counts, cs = _run(simkern, calls, Sampling(0.01, error_probability=0.25), emit_calls=True)
    kept = [s for s in sessions if s.is_err]
    assert counts == [("sk_syscall", "sk_check", "EINVAL", 400)]  # exact, whatever was exported
    assert 50 < len(kept) < 150  # 100 expected (binomial, sd 8.7)
    assert cs.errors_sampled_out == 400 - len(kept) and cs.sessions_started == 420 and cs.dropped_sessions == 0
    assert all(s.kernel_sampling == records.SAMPLED_PROBABILITY for s in kept)
    assert all(threshold(0.25) <= s.trace_randomness <= LOW56 for s in kept)
    assert len({s.trace_randomness for s in kept}) == len(kept)  # drawn per session
    assert all(s.calls for s in kept)  # a kept error session arrives with its calls


def test_a_dropped_error_session_sends_no_record(simkern) -> None:
    """The threshold no randomness reaches: no error session is sent, not even its held call records; all are
    counted by origin and as sampled out. Successes are not wanted here: their counter stays 0."""
    calls = [("sk_syscall", 0)] * 30 + [("sk_syscall", 101)] * 3 + [("sk_syscall", 5)] * 10
    sessions, kinds, counts, cs = _run(simkern, calls, Sampling(error_probability=0.5), MAX_THRESHOLD,
                                       emit_calls=True)
    assert sessions == [] and kinds["SessionEndRec"] == 0 and kinds["FuncBatchRec"] == 0
    assert counts == [("sk_syscall", "sk_alloc", "NULL", 3), ("sk_syscall", "sk_check", "EINVAL", 30)]
    assert cs.errors_sampled_out == 33 and cs.sampled_out == 0


def test_errors_not_sampled_by_default(simkern) -> None:
    sessions, _, counts, cs = _run(simkern, [("sk_syscall", 0)] * 12, Sampling())
    assert len(sessions) == 12 and cs.errors_sampled_out == 0
    assert all(s.kernel_sampling == 0 and s.trace_randomness is None for s in sessions)


def test_rate_per_origin_keeps_the_rare_origin(simkern) -> None:
    """0.01 per second and origin: a burst of one per origin and the next one 100 s later (no test waits that).
    The frequent origin (sk_check) takes its one token; the rare ones (sk_alloc, sk_recurse) still get theirs."""
    calls = [("sk_syscall", 0)] * 50 + [("sk_syscall", 101)] * 2 + [("sk_recurse", 3)] * 2 + [("sk_syscall", 5)] * 5
    sessions, _, counts, cs = _run(simkern, calls, Sampling(error_rate_per_s=0.01))
    funcs = simkern_funcs()
    kept = [s for s in sessions if s.is_err]
    assert sorted(funcs[s.chain[-1].func_id].name for s in kept) == ["sk_alloc", "sk_check", "sk_recurse"]
    assert all(s.kernel_sampling == records.SAMPLED_RATE and s.trace_randomness is None for s in kept)
    assert counts == [("sk_recurse", "sk_recurse", "E2BIG", 2), ("sk_syscall", "sk_alloc", "NULL", 2),
                      ("sk_syscall", "sk_check", "EINVAL", 50)]
    assert cs.errors_sampled_out == 51 and cs.sampled_out == 0

"""In-kernel sampling of successful sessions (bpf/sampling.bpf.h, bpf/calls.bpf.h), through uprobes.

A success the sampler drops must cost no ring-buffer record; a kept one carries the randomness its
keep decision compared with the threshold; error sessions are always reported, with every call record.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter

from retsnoop_otel.capture import records
from retsnoop_otel.capture.sampling import ALWAYS, MAX_THRESHOLD, Sampling, kernel_sampling, threshold
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.user_funcs import in_binary
from tests.native.simkern_funcs import drive, simkern_funcs, walk

LOW56 = (1 << 56) - 1


def _run(simkern: tuple[str, ctypes.CDLL], calls: list[tuple[str, int]], sampling: Sampling | None = None,
         threshold_: int | None = None, **cfg: object):
    """Sessions, record counts by type, and the kernel's counters, for the calls under one sampling."""
    path, lib = simkern
    ks = kernel_sampling(sampling or Sampling(1.0))
    config = CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()], exclude_self=False,
                           capture_success=ks.capture_success,
                           success_threshold=ks.threshold if threshold_ is None else threshold_,
                           success_interval_ns=ks.interval_ns, success_burst_ns=ks.burst_ns,
                           **cfg)  # type: ignore[arg-type]
    tracer = Tracer(in_binary(simkern_funcs(), path), config)
    sessions, kinds = [], Counter()
    assembler = SessionAssembler()

    def on_record(rec: records.Record) -> None:
        kinds[type(rec).__name__] += 1
        if (s := assembler.feed(rec)) is not None:
            sessions.append(s)

    try:
        drive(tracer, lib, calls, on_record)
        cstats = tracer.capture_stats()
    finally:
        tracer.close()
    return sessions, kinds, cstats


def test_probability_keeps_a_fraction_with_the_randomness_it_compared(simkern):
    sessions, _, cstats = _run(simkern, [("sk_syscall", 5)] * 400 + [("sk_syscall", 0)], Sampling(0.25))
    kept = [s for s in sessions if not s.is_err]
    assert 50 < len(kept) < 150  # 100 expected (binomial, sd 8.7)
    assert cstats.sampled_out == 400 - len(kept) and cstats.sessions_started == 401
    assert all(s.kernel_sampling == records.SAMPLED_PROBABILITY for s in kept)
    assert all(threshold(0.25) <= s.trace_randomness <= LOW56 for s in kept)
    assert len({s.trace_randomness for s in kept}) == len(kept)  # drawn per session
    (err,) = [s for s in sessions if s.is_err]  # an error is reported whatever the sampling
    assert err.kernel_sampling == 0 and err.trace_randomness is None


def test_probability_one_keeps_every_success_and_zero_none(simkern):
    sessions, _, cstats = _run(simkern, [("sk_syscall", 5)] * 20, Sampling(1.0))
    assert len(sessions) == 20 and cstats.sampled_out == 0
    assert kernel_sampling(Sampling(1.0)).threshold == ALWAYS
    sessions, kinds, cstats = _run(simkern, [("sk_syscall", 5)] * 20 + [("sk_syscall", 0)], Sampling(0.0))
    assert [s.is_err for s in sessions] == [True] and cstats.sampled_out == 0  # not wanted, not "sampled out"


def test_rate_keeps_at_most_its_burst_per_entry_function(simkern):
    """0.5 per second: a burst of one per entry function, the next one two seconds later (no test waits that)."""
    calls = [("sk_syscall", 5)] * 10 + [("sk_many", 4)] * 10 + [("sk_syscall", 0)] * 3
    sessions, _, cstats = _run(simkern, calls, Sampling(success_rate_per_s=0.5))
    kept = [s for s in sessions if not s.is_err]
    funcs = simkern_funcs()
    assert sorted(funcs[s.entry_func_id].name for s in kept) == ["sk_many", "sk_syscall"]
    assert all(s.kernel_sampling == records.SAMPLED_RATE and s.trace_randomness is None for s in kept)
    assert sum(s.is_err for s in sessions) == 3  # errors take no token and are never limited
    assert cstats.sampled_out == 18


def test_calls_mode_dropped_successes_send_no_record(simkern):
    """The per-call records of a session wait in the kernel: 50 dropped successes send nothing at all, the
    error session sends its start, its held calls as one batch, and its end, and arrives complete."""
    sessions, kinds, cstats = _run(simkern, [("sk_syscall", 5)] * 50 + [("sk_syscall", 0)], Sampling(0.5),
                                   threshold_=MAX_THRESHOLD, emit_calls=True)
    assert cstats.sampled_out == 50
    assert kinds == Counter(SessionStartRec=1, FuncBatchRec=1, SessionEndRec=1)
    (s,) = sessions
    assert s.is_err and s.dropped_records == 0
    names = [simkern_funcs()[c.func_id].name for c in walk(s.calls)]
    assert names == ["sk_syscall", "sk_create", "sk_check", "sk_log", "sk_log"]


def test_long_sessions_stream_past_the_held_records(simkern):
    """Past CALL_BUF_RECS records a session streams (its outcome is not known yet): a long error arrives with
    every call, a long kept success too; a long dropped success cost its streamed records, but no session."""
    n = records.CALL_BUF_RECS  # sk_many(n) makes 2n + 2 records
    sessions, kinds, cstats = _run(simkern, [("sk_many", n + 1), ("sk_many", n)], Sampling(1.0), emit_calls=True)
    assert [s.is_err for s in sessions] == [True, False]
    for s, calls in zip(sessions, (n + 1, n), strict=True):
        (root,) = s.calls
        assert len(root.children) == calls and s.dropped_records == 0
    assert kinds["FuncBatchRec"] == 2 and kinds["FuncTraceRec"] == (2 * n + 4 - n) + (2 * n + 2 - n)
    sessions, kinds, cstats = _run(simkern, [("sk_many", n)], Sampling(0.5), threshold_=MAX_THRESHOLD,
                                   emit_calls=True)
    assert sessions == [] and cstats.sampled_out == 1 and kinds["SessionEndRec"] == 0

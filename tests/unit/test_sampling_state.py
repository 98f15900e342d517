"""The sampling threshold of kept sessions in the spans' tracestate (OTel tracestate-probability-sampling):
threshold values, consistent keep decisions, what a probe set records, and what the encoder writes
(equal to the SDK oracle), including sessions joined to an application's trace."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from retsnoop_otel.capture.model import Call, Session, StackEntry
from retsnoop_otel.capture.sampling import (
    ALWAYS,
    MAX_THRESHOLD,
    Sampling,
    th_value,
    threshold,
    trace_state,
)
from retsnoop_otel.export.span_encoder import build_request
from tests.fakes import APP_TRACE, World, app_session, symbolize, tree_session
from tests.span_checks import assert_same, encoder_for

LOW56 = (1 << 56) - 1


# ---- thresholds --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("one_in,th", [  # the specification's table, 4 digits of precision
    (1, "0"), (2, "8"), (3, "aaab"), (4, "c"), (5, "cccd"), (8, "e"), (10, "e666"), (16, "f"), (100, "fd70a"),
    (1000, "ffbe77"), (10000, "fff9724"), (100000, "ffff583a"), (1000000, "ffffef39")])
def test_thresholds_of_one_in_n(one_in: int, th: str) -> None:
    assert th_value(threshold(1 / one_in)) == th


def test_threshold_encoding_and_limits() -> None:
    assert th_value(0xC0_0000_0000_0000) == "c" and th_value(0x0C_0000_0000_0000) == "0c"  # 14 digits, then trim
    assert th_value(MAX_THRESHOLD) == "ffffffffffffff"
    assert threshold(2 ** -60) == MAX_THRESHOLD  # below the smallest probability: clamped, never 2^56
    assert trace_state(None) == "" and trace_state(ALWAYS) == "ot=th:0" and trace_state(threshold(0.25)) == "ot=th:c"
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            threshold(bad)
    with pytest.raises(ValueError):
        th_value(1 << 56)


# ---- decisions ---------------------------------------------------------------------------------------------

def test_probe_set_records_how_each_session_was_kept() -> None:
    """The kernel side keeps successes (tests/native/test_native_sampling.py) and sends the randomness of a
    probability decision with the session; the probe set adds the threshold it was compared with."""
    from retsnoop_otel.agent.config_file import parse_config
    from retsnoop_otel.capture.records import SAMPLED_PROBABILITY, SAMPLED_RATE
    from retsnoop_otel.runtime.probe_set import ProbeSet
    from retsnoop_otel.symbols.discovery import discover
    from tests.fakes import World, make_env, probe_set_config

    env = make_env()
    disc = discover(["__x64_sys_bpf"], [], [], env.ksyms, env.available, env.ret_kind, "kprobe")
    limits = parse_config("probe_sets: {a: {entry: f}}").runtime.limits

    def probe_set(sampling: Sampling) -> ProbeSet:
        return ProbeSet(probe_set_config(sampling=sampling), disc, limits, env, World().factory, lambda _p, _s: None)

    def session(is_err: bool, kept: int = 0, randomness: int | None = None) -> Session:
        return Session(1, 1, "c", "c", 0, 1, is_err, [StackEntry(0, (1 << 64) - 22 if is_err else 0, 5)], [],
                       kernel_sampling=kept, trace_randomness=randomness)

    err = session(True)
    assert probe_set(Sampling(0.0)).accepts(err)
    assert (err.sampling_threshold, err.trace_randomness) == (ALWAYS, None)
    ps = probe_set(Sampling(0.25))
    kept = session(False, SAMPLED_PROBABILITY, LOW56)
    assert ps.accepts(kept) and (kept.sampling_threshold, kept.trace_randomness) == (threshold(0.25), LOW56)
    assert not ps.accepts(session(False)) and ps.sampled_out == 1  # none arrive so: counted, not exported
    always = session(False, SAMPLED_PROBABILITY, 5)
    assert probe_set(Sampling(1.0)).accepts(always) and always.sampling_threshold == ALWAYS
    limited = session(False, SAMPLED_RATE)
    assert probe_set(Sampling(success_rate_per_s=2.0)).accepts(limited)
    assert (limited.sampling_threshold, limited.trace_randomness) == (None, None)  # no probability to state


# ---- spans -------------------------------------------------------------------------------------------------

R = 0xD0_1234_5678_9ABC


def _spans(trace) -> list:
    return list(ExportTraceServiceRequest.FromString(build_request([trace])).resource_spans[0].scope_spans[0].spans)


@pytest.mark.parametrize("variant", ["calls", "calls_with_args_path", "chain", "always", "rate_limited"])
def test_encoder_writes_the_threshold_as_the_oracle_does(variant: str) -> None:
    """Every span of the trace carries the tracestate, and the trace id the randomness: the hand-written
    encoder (its cached fast path included, whose span length grows by the tracestate) equals the SDK."""
    kept = {"calls": dict(sampling_threshold=threshold(0.25), trace_randomness=R),
            "calls_with_args_path": dict(sampling_threshold=threshold(0.1), trace_randomness=LOW56),
            "chain": dict(sampling_threshold=threshold(0.001), trace_randomness=LOW56, calls=[]),
            "always": dict(sampling_threshold=ALWAYS),
            "rate_limited": dict()}[variant]
    session = tree_session(is_err=False, **kept)
    if variant == "calls_with_args_path":
        session.calls[0].children[1].missing_before = 3  # a span with attributes of its own
    trace = assert_same(session, symbolize=symbolize)
    spans = _spans(trace)
    want = trace_state(session.sampling_threshold)
    assert {s.trace_state for s in spans} == {want}
    if session.trace_randomness is not None:
        assert trace.trace_id & LOW56 == session.trace_randomness
        assert {int.from_bytes(s.trace_id, "big") for s in spans} == {trace.trace_id}


def test_encoder_fast_path_stays_exact_across_cached_results() -> None:
    """The same functions and results encoded with and without a tracestate share the encoder's cache."""
    enc = encoder_for()
    for threshold_value in (None, threshold(0.5), None, ALWAYS):
        session = tree_session(sampling_threshold=threshold_value, trace_randomness=R if threshold_value else None)
        spans = _spans(enc.encode(session, 0))
        assert len(spans) == 6 and {s.trace_state for s in spans} == {trace_state(threshold_value)}


def test_joined_application_trace_keeps_its_context_and_states_no_threshold() -> None:
    """The thread context has no tracestate, so the probability of the application's trace is unknown: no `th`
    (the specification asks to erase an unknown threshold), and the trace id stays the application's."""
    session = app_session()
    session.sampling_threshold, session.trace_randomness = threshold(0.25), R
    trace = assert_same(session, symbolize=symbolize)
    spans = _spans(trace)
    assert trace.trace_id == APP_TRACE and {s.trace_state for s in spans} == {""}
    assert {s.trace_id for s in spans} == {APP_TRACE.to_bytes(16, "big")}


def test_linked_application_context_gets_a_trace_of_its_own_with_the_threshold() -> None:
    session = app_session(trace_flags=0)  # unsampled: linked, not joined
    session.sampling_threshold, session.trace_randomness = threshold(0.25), R
    trace = assert_same(session, symbolize=symbolize)
    spans = _spans(trace)
    assert trace.trace_id != APP_TRACE and trace.trace_id & LOW56 == R
    assert {s.trace_state for s in spans} == {"ot=th:c"} and spans[0].links[0].trace_id == APP_TRACE.to_bytes(16, "big")


def test_agent_exports_error_and_sampled_sessions_with_their_thresholds(tmp_path: Path, world: World) -> None:
    """Through the agent: an error session and a success kept at probability 1 both say th:0."""
    from retsnoop_otel.agent.main import Agent
    from retsnoop_otel.command.logs import EventLog
    from tests.fakes import AGENT_CONFIG, by_set, error_session, success_calls_session, wait_exported

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(cfg), world.deps(), EventLog(io.StringIO()))
    agent.start()
    try:
        errs, loads = by_set(world, "__x64_sys_bpf"), by_set(world, "bpf_prog_load")
        errs.pending = error_session(errs)
        loads.pending = success_calls_session(loads)
        agent.runtime.poll_once()
        wait_exported(world, 5)
    finally:
        agent.runtime.shutdown(1.0)
    states = {(s.name, s.trace_state) for _, body in world.requests
              for rs in ExportTraceServiceRequest.FromString(body).resource_spans
              for ss in rs.scope_spans for s in ss.spans}
    assert {name for name, _ in states} >= {"__x64_sys_bpf", "bpf_prog_load", "bpf_check"}
    assert {state for _, state in states} == {"ot=th:0"}


def test_a_session_without_a_decision_says_nothing() -> None:
    """Sessions built outside a probe set (tests, replays) carry no tracestate, as before."""
    session = tree_session(calls=[Call(0, 0, 1_000, 9_000, 0)], is_err=False)
    assert {s.trace_state for s in _spans(assert_same(session))} == {""}


# ---- error sessions sampled (issue 46 point 2) -------------------------------------------------------------

def test_error_sampling_constants_for_the_kernel() -> None:
    """A probability becomes the same rounded threshold successes use; a rate per origin a bucket like an entry
    function's; errors are not sampled by default (threshold 0, no bucket: the kernel's path of today)."""
    from retsnoop_otel.capture.sampling import kernel_sampling
    assert kernel_sampling(Sampling()).error_threshold == ALWAYS
    assert not Sampling().samples_errors and Sampling(error_probability=0.1).samples_errors
    ks = kernel_sampling(Sampling(0.01, error_probability=0.1))
    assert (ks.threshold, ks.error_threshold, ks.error_interval_ns) == (threshold(0.01), threshold(0.1), 0)
    assert ks.errors_by_probability and th_value(ks.error_threshold) == "e666"
    ks = kernel_sampling(Sampling(success_rate_per_s=4, error_rate_per_s=2))
    assert (ks.error_threshold, ks.error_interval_ns, ks.error_burst_ns) == (ALWAYS, 500_000_000, 500_000_000)
    assert not ks.errors_by_probability and ks.interval_ns == 250_000_000
    assert kernel_sampling(Sampling(error_rate_per_s=0.01)).error_burst_ns == 0  # a burst of one, every 100 s


def test_probe_set_states_how_each_error_session_was_kept() -> None:
    """What the kernel sends (records.SAMPLED_* on the end record) becomes the spans' threshold: errors not sampled
    say th:0, errors kept by probability that probability's threshold, errors kept by their origin's rate none."""
    from retsnoop_otel.agent.config_file import parse_config
    from retsnoop_otel.capture.records import SAMPLED_PROBABILITY, SAMPLED_RATE
    from retsnoop_otel.runtime.probe_set import ProbeSet
    from retsnoop_otel.symbols.discovery import discover
    from tests.fakes import World, make_env, probe_set_config

    env = make_env()
    disc = discover(["__x64_sys_bpf"], [], [], env.ksyms, env.available, env.ret_kind, "kprobe")
    limits = parse_config("probe_sets: {a: {entry: f}}").runtime.limits

    def kept(sampling: Sampling, flags: int, randomness: int | None = None) -> Session:
        s = Session(1, 1, "c", "c", 0, 1, True, [StackEntry(0, (1 << 64) - 22, 5)], [], kernel_sampling=flags,
                    trace_randomness=randomness)
        assert ProbeSet(probe_set_config(sampling=sampling), disc, limits, env, World().factory,
                        lambda _p, _s: None).accepts(s)
        return s

    assert kept(Sampling(), 0).sampling_threshold == ALWAYS
    s = kept(Sampling(0.01, error_probability=0.1), SAMPLED_PROBABILITY, LOW56)
    assert (s.sampling_threshold, s.trace_randomness) == (threshold(0.1), LOW56)
    assert kept(Sampling(error_rate_per_s=2), SAMPLED_RATE).sampling_threshold is None


@pytest.mark.parametrize("kept", [dict(sampling_threshold=threshold(0.1), trace_randomness=R), dict()])
def test_encoder_writes_an_error_sessions_threshold(kept: dict) -> None:
    """A failing session's spans carry its threshold (and its trace id the randomness) as a success's do."""
    session = tree_session(is_err=True, **kept)
    trace = assert_same(session, symbolize=symbolize)
    spans = _spans(trace)
    assert {s.trace_state for s in spans} == {trace_state(session.sampling_threshold)}
    if kept:
        assert {s.trace_state for s in spans} == {"ot=th:e666"} and trace.trace_id & LOW56 == R

"""Exemplars on the session duration histogram: the trace id of a recent exported trace per bucket.

The agent side (recorded only for traces an exporter accepted) is in test_agent_lifecycle.py.
"""

from __future__ import annotations

import random

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from retsnoop_otel.capture.model import RetKind, Session, SessionStats, StackEntry, TracedFunc
from retsnoop_otel.export.span_encoder import SpanEncoder, build_request, make_envelope
from retsnoop_otel.metrics.exemplars import ExemplarStore, log2_bucket
from retsnoop_otel.metrics.kernel_families import KernelCollector
from tests.fakes import FakeProbeSet, make_registry
from tests.oracle_spans import request_to_spans

FUNCS = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
         1: TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False)}
END_NS = 1_700_000_000_123_456_789  # wall clock of the root span's end


def test_log2_bucket_follows_the_kernel() -> None:
    # bucket i holds [2^i, 2^(i+1)) ns; 0 ns goes to bucket 0 and everything huge to the last one
    assert [log2_bucket(ns) for ns in (0, 1, 2, 3, 4, 4095, 4096, 8191, 2**39, 2**50)] == \
        [0, 0, 1, 1, 2, 11, 12, 12, 39, 39]


def test_store_keeps_the_latest_trace_per_bucket_and_is_bounded() -> None:
    store = ExemplarStore(max_entries=3)
    store.record("bpf", "__x64_sys_bpf", 5000, 0xA, END_NS)
    store.record("bpf", "__x64_sys_bpf", 6000, 0xB, END_NS + 1)  # same bucket (4096..8191 ns): replaces
    store.record("bpf", "__x64_sys_bpf", 1_500_000, 0xC, END_NS + 2)
    ex = store.for_histogram("bpf", "__x64_sys_bpf")
    assert sorted(ex) == [12, 20]
    assert ex[12].labels == {"trace_id": f"{0xB:032x}"} and ex[12].value == 6e-06
    assert str(ex[12].timestamp) == "1700000000.123456790"
    assert store.for_histogram("other_set", "__x64_sys_bpf") == {}
    store.record("bpf", "__x64_sys_bpf", 100, 0xD, END_NS)
    store.record("bpf", "__x64_sys_bpf", 5000, 0xE, END_NS)  # rewrites bucket 12: now the newest key
    store.record("vfs", "do_sys_open", 100, 0xF, END_NS)  # 4th key: evicts the least recently written (bucket 20)
    assert len(store) == 3
    assert sorted(store.for_histogram("bpf", "__x64_sys_bpf")) == [6, 12]
    assert sorted(store.for_histogram("vfs", "do_sys_open")) == [6]


def _registry(store: ExemplarStore) -> object:
    buckets = [0] * 40
    buckets[11], buckets[12], buckets[20] = 1, 2, 1
    stats = [SessionStats(0, 4, 3, tuple(buckets), 3000 + 2 * 5000 + 1_500_000)]
    ps = FakeProbeSet(name="bpf", funcs=FUNCS, stats=list, sessions=stats)
    return make_registry(KernelCollector(lambda: [ps], stats_enabled=lambda: False, exemplars=store.for_histogram))


def test_openmetrics_puts_the_exemplar_on_the_bucket_of_the_trace_duration() -> None:
    store = ExemplarStore()
    store.record("bpf", "__x64_sys_bpf", 5000, 0xDEADBEEF, END_NS)
    text = generate_openmetrics(_registry(store)).decode()
    lines = [line for line in text.splitlines() if line.startswith("retsnoop_session_duration_seconds_bucket")]
    labels = 'entry_function="__x64_sys_bpf",le="{}",probe_set="bpf"'
    assert lines[11:14] == [
        "retsnoop_session_duration_seconds_bucket{" + labels.format("4.096e-06") + "} 1.0",
        "retsnoop_session_duration_seconds_bucket{" + labels.format("8.192e-06") + "} 3.0"
        ' # {trace_id="000000000000000000000000deadbeef"} 5e-06 1700000000.123456789',
        "retsnoop_session_duration_seconds_bucket{" + labels.format("1.6384e-05") + "} 3.0",
    ]
    assert sum(" # {" in line for line in text.splitlines()) == 1
    hist = next(f for f in text_string_to_metric_families(text) if f.name == "retsnoop_session_duration_seconds")
    (with_exemplar,) = [s for s in hist.samples if s.exemplar is not None]  # the strict parser reads it back
    assert with_exemplar.labels["le"] == "8.192e-06" and with_exemplar.exemplar.value == 5e-06


def test_exemplar_on_the_open_ended_last_bucket() -> None:
    store = ExemplarStore()
    store.record("bpf", "__x64_sys_bpf", 2**45, 7, END_NS)
    text = generate_openmetrics(_registry(store)).decode()
    assert ('retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="+Inf",probe_set="bpf"} 4.0'
            ' # {trace_id="00000000000000000000000000000007"} 35184.372088832 1700000000.123456789\n') in text


def test_prometheus_text_format_is_unchanged_by_exemplars() -> None:
    store = ExemplarStore()
    store.record("bpf", "__x64_sys_bpf", 5000, 0xDEADBEEF, END_NS)
    with_ex = generate_latest(_registry(store)).decode()
    assert with_ex == generate_latest(_registry(ExemplarStore())).decode()
    assert ('retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="8.192e-06",'
            'probe_set="bpf"} 3.0\n') in with_ex


def test_encoded_trace_carries_the_trace_id_of_its_spans() -> None:
    session = Session(7, 7, "python", "python", 100, 5100, True,
                      [StackEntry(0, (1 << 64) - 22, 5000), StackEntry(1, (1 << 64) - 22, 1000)], [])
    trace = SpanEncoder(FUNCS, make_envelope({}), rng=random.Random(1)).encode(session, 0)
    spans = request_to_spans(build_request([trace]))
    assert trace.trace_id != 0 and {s["trace_id"] for s in spans} == {trace.trace_id}
    head, rest = trace.split(1)
    assert head.trace_id == rest.trace_id == trace.trace_id

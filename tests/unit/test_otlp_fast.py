"""otlp_fast: hand-encoded OTLP bytes must decode to exactly what session_to_spans + the SDK encoder give."""

import random
import threading

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult

from bench import span_throughput  # the benchmark's realistic session generator
from retsnoop_otel.capture.model import Call, RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.export import otlp_fast
from retsnoop_otel.export.otlp import ExportStats, OtlpTraceSink, make_exporter, session_to_spans
from retsnoop_otel.export.otlp_fast import (
    EncodedGrpcSpanExporter,
    EncodedHttpSpanExporter,
    SpanEncoder,
    build_request,
    make_envelope,
    request_to_spans,
    span_count,
)
from retsnoop_otel.export.resource import build_resource
from tests.unit.test_otlp import EINVAL, FUNCS, KPTR, OFFSET, tree_session

RESOURCE = build_resource(instance_id="test")


def symbolize(addr):
    return f"sym_{addr & 0xFFF:x}+0x5"


def decode(body):
    return ExportTraceServiceRequest.FromString(body)


def strip_ids(request):
    """Blank the random ids, returning the parent index of every span (-1 for a root) and the trace ids."""
    parents, traces = [], []
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            index = {s.span_id: i for i, s in enumerate(ss.spans)}
            assert len(index) == len(ss.spans) and b"\0" * 8 not in index, "span ids must be unique and non-zero"
            for s in ss.spans:
                assert len(s.trace_id) == 16 and s.trace_id != b"\0" * 16 and len(s.span_id) == 8
                parents.append(index[s.parent_span_id] if s.parent_span_id else -1)
                traces.append(s.trace_id)
                s.trace_id = s.span_id = s.parent_span_id = b""
    return parents, traces


def assert_same(session, funcs=FUNCS, encoder=None, **kw):
    """The fast encoding of `session` equals the SDK encoding of session_to_spans, ids aside."""
    want = encode_spans(session_to_spans(session, funcs, OFFSET, RESOURCE, **kw))
    encoder = encoder or SpanEncoder(funcs, RESOURCE, **kw)
    trace = encoder.encode(session, OFFSET)
    got = decode(build_request([trace]))
    want_parents, want_traces = strip_ids(want)
    got_parents, got_traces = strip_ids(got)
    assert len(set(got_traces)) == 1
    assert got_parents == want_parents
    got_spans = got.resource_spans[0].scope_spans[0].spans
    want_spans = want.resource_spans[0].scope_spans[0].spans
    assert len(got_spans) == len(want_spans) == len(trace)
    for g, w in zip(got_spans, want_spans, strict=True):
        assert g == w, f"span {w.name} differs:\n{g}\nvs\n{w}"
    assert got == want  # resource, scope and schema urls too
    return trace


def test_tree_session_matches_sdk_encoding():
    trace = assert_same(tree_session(dropped_records=3), symbolize=symbolize)
    assert trace.spans_dropped == 0 and len(trace) == 6


@pytest.mark.parametrize("variant", ["chain", "chain_clamped", "pointer_null", "pointer_err", "void", "no_entry",
                                     "stray_calls", "incomplete_root"])
def test_session_variants_match(variant):
    sessions = {
        "chain": tree_session(calls=[], chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 3_000),
                                               StackEntry(3, EINVAL, 500)]),
        "chain_clamped": tree_session(calls=[], chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, 0, None),
                                                       StackEntry(3, EINVAL, 99_000)]),
        "pointer_null": tree_session(calls=[Call(2, 0, 10, 20, 0)], chain=[StackEntry(2, 0, 10)], start_ns=10,
                                     end_ns=20),
        "pointer_err": tree_session(calls=[Call(2, 0, 10, 20, (1 << 64) - 12)], chain=[], start_ns=10, end_ns=20),
        "void": tree_session(calls=[Call(4, 0, 10, 20, 0)], chain=[], start_ns=10, end_ns=20, is_err=False),
        "no_entry": tree_session(calls=[], chain=[]),
        "stray_calls": tree_session(calls=[*tree_session().calls, Call(77, 0, 9_500, 9_600, 0)]),
        "incomplete_root": tree_session(calls=[Call(0, 0, 1_000, None, None, children=[Call(3, 1, 1_100, 1_200, 0)])],
                                        chain=[]),
    }
    assert_same(sessions[variant], symbolize=symbolize)


def test_addresses_only_when_asked():
    assert_same(tree_session())  # no symbolizer: no stack
    assert_same(tree_session(), symbolize=lambda a: "f+0x5" if a & 0x100 else f"0x{a:x}")  # leaks replaced
    trace = assert_same(tree_session(), symbolize=symbolize, export_addresses=True)
    assert f"0x{KPTR:x}".encode() in b"".join(trace.spans)
    plain = b"".join(SpanEncoder(FUNCS, RESOURCE, symbolize=symbolize).encode(tree_session(), OFFSET).spans)
    assert f"{KPTR:x}".encode() not in plain and b"ffffffff81000105" not in plain


def test_span_limit():
    trace = assert_same(tree_session(), max_spans=3)
    assert trace.spans_dropped == 3
    trace = assert_same(tree_session(calls=[], chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 3_000),
                                                      StackEntry(3, EINVAL, 500)]), max_spans=2)
    assert trace.spans_dropped == 1


def test_generated_sessions_match_with_one_long_lived_encoder():
    """The benchmark's sessions (50 nested calls, errors, lost exits, distinct pointers), one shared encoder."""
    rng = random.Random(3)
    funcs = span_throughput.make_funcs()
    encoder = SpanEncoder(funcs, RESOURCE, symbolize=symbolize)
    for _ in range(40):
        assert_same(span_throughput.make_session(rng, funcs, 50), funcs, encoder=encoder, symbolize=symbolize)
    # every valid pointer shares one encoding instead of filling the cache with one entry per address
    pointer_funcs = {f.id for f in funcs.values() if f.ret is RetKind.POINTER}
    cached_pointers = [raw for fid, raw in encoder._cache if fid in pointer_funcs and raw]
    assert all(raw == 1 or raw >= (1 << 64) - 4095 for raw in cached_pointers)


def test_caches_stay_bounded(monkeypatch):
    monkeypatch.setattr(otlp_fast, "_CACHE_LIMIT", 4)
    funcs = {0: TracedFunc(0, "entry", 0, RetKind.SIGNED, True), 1: TracedFunc(1, "read", 0, RetKind.INT32, False)}
    encoder = SpanEncoder(funcs, RESOURCE)
    for n in range(30):
        calls = [Call(0, 0, 0, 100, n, children=[Call(1, 1, 10 + i, 20 + i, n * 7 + i) for i in range(5)])]
        session = Session(1, 1, "c", "c", 0, 100, False, [], [], calls=calls)
        assert_same(session, funcs, encoder=encoder)
        assert len(encoder._cache) <= 4 and len(encoder._results) <= 4


def test_resource_attribute_types_match_sdk():
    resource = Resource({"s": "text", "b": True, "i": -5, "big": (1 << 63) - 1, "f": 1.5, "arr": ("a", "b"),
                         "ints": (1, -2), "empty": ""}, "https://opentelemetry.io/schemas/1.26.0")
    spans = session_to_spans(tree_session(), FUNCS, OFFSET, resource)
    got = decode(build_request([SpanEncoder(FUNCS, resource).encode(tree_session(), OFFSET)]))
    want = encode_spans(spans)
    assert got.resource_spans[0].resource == want.resource_spans[0].resource
    assert got.resource_spans[0].schema_url == want.resource_spans[0].schema_url != ""
    assert got.resource_spans[0].scope_spans[0].scope == want.resource_spans[0].scope_spans[0].scope


def test_request_groups_envelopes_and_split_keeps_order():
    other = build_resource(instance_id="other")
    a = SpanEncoder(FUNCS, RESOURCE).encode(tree_session(), OFFSET)
    b = SpanEncoder(FUNCS, other).encode(tree_session(), OFFSET)
    c = SpanEncoder(FUNCS, RESOURCE).encode(tree_session(), OFFSET)
    assert a.envelope == c.envelope != b.envelope and make_envelope(RESOURCE) == a.envelope
    request = decode(build_request([a, b, c]))
    assert [len(rs.scope_spans[0].spans) for rs in request.resource_spans] == [12, 6]
    instances = [[kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.instance.id"]
                 for rs in request.resource_spans]
    assert instances == [["test"], ["other"]]
    head, tail = a.split(4)
    assert len(head) == 4 and len(tail) == 2 and head.spans + tail.spans == a.spans
    assert span_count(decode(build_request([head]))) == 4


def test_request_to_spans_round_trips():
    body = build_request([SpanEncoder(FUNCS, RESOURCE, symbolize=symbolize).encode(tree_session(), OFFSET)])
    spans = request_to_spans(body)
    assert [s.name for s in spans][:3] == ["__x64_sys_bpf", "security_bpf", "map_create"]
    assert encode_spans(spans) == decode(body)


# ---- sink ----------------------------------------------------------------------------------------

class BytesExporter:
    """Takes pre-encoded requests like EncodedGrpcSpanExporter does, and records them."""

    def __init__(self, gate=None):
        self.requests, self.span_batches, self.gate, self.shut = [], [], gate, False

    def export_encoded(self, body, spans):
        if self.gate is not None:
            self.gate.wait(5)
        request = decode(body)
        assert span_count(request) == spans
        self.requests.append(request)
        return SpanExportResult.SUCCESS

    def export(self, spans):
        self.span_batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.shut = True


class SpansOnlyExporter:
    def __init__(self):
        self.batches = []

    def export(self, spans):
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def names(request):
    return [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_sink_batches_encoded_traces_into_bounded_requests():
    exp = BytesExporter()
    sink = OtlpTraceSink(exporter=exp, protocol="grpc", max_batch_spans=8)
    encoder = SpanEncoder(FUNCS, RESOURCE)
    traces = [encoder.encode(tree_session(), OFFSET) for _ in range(3)]  # 6 spans each
    big = SpanEncoder(FUNCS, RESOURCE).encode(tree_session(calls=[Call(0, 0, 0, 99, 0, children=[
        Call(3, 1, i, i + 1, 0) for i in range(19)])]), OFFSET)  # 20 spans: split over requests
    for t in (*traces, big):
        assert sink.submit(t)
    assert sink.flush(5)
    sink.shutdown(1)
    sizes = [span_count(r) for r in exp.requests]
    assert max(sizes) <= 8 and sum(sizes) == 38 and exp.span_batches == []
    sent = [n for r in exp.requests for n in names(r)]
    assert sent == names(decode(build_request([*traces, big])))  # order kept, nothing lost or repeated
    assert sink.stats() == ExportStats(38, {}, 0) and exp.shut


def test_sink_keeps_sdk_spans_and_encoded_traces_apart():
    exp = BytesExporter()
    sink = OtlpTraceSink(exporter=exp, protocol="grpc", max_batch_spans=100)
    spans = session_to_spans(tree_session(), FUNCS, OFFSET, RESOURCE)
    encoded = SpanEncoder(FUNCS, RESOURCE).encode(tree_session(), OFFSET)
    gate = threading.Event()
    exp.gate = gate  # hold the worker so that everything below queues up together
    for item in (encoded, spans, spans, encoded, encoded):
        sink.submit(item)
    gate.set()
    assert sink.flush(5)
    sink.shutdown(1)
    assert [len(b) for b in exp.span_batches] == [12]
    assert sum(span_count(r) for r in exp.requests) == 18 and all(span_count(r) % 6 == 0 for r in exp.requests)
    assert sink.stats().spans_exported == 30


def test_sink_gives_spans_to_exporters_without_bytes_support():
    exp = SpansOnlyExporter()
    sink = OtlpTraceSink(exporter=exp, protocol="grpc")
    trace = SpanEncoder(FUNCS, RESOURCE, symbolize=symbolize).encode(tree_session(), OFFSET)
    assert sink.submit(trace)
    assert sink.flush(5)
    sink.shutdown(1)
    (batch,) = exp.batches
    assert encode_spans(batch) == decode(build_request([trace]))


def test_sink_drops_whole_encoded_traces_when_full():
    gate = threading.Event()
    exp = BytesExporter(gate=gate)
    sink = OtlpTraceSink(exporter=exp, protocol="grpc", max_queue_spans=10)
    encoder = SpanEncoder(FUNCS, RESOURCE)
    assert sink.submit(encoder.encode(tree_session(), OFFSET))
    while sink._in_flight == 0:
        threading.Event().wait(0.001)
    assert sink.submit(encoder.encode(tree_session(), OFFSET))
    assert not sink.submit(encoder.encode(tree_session(), OFFSET))
    gate.set()
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(12, {"queue_full": 6}, 0)


# ---- exporters -----------------------------------------------------------------------------------

def test_make_exporter_builds_byte_capable_sdk_exporters(monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    grpc_exp = make_exporter("http://127.0.0.1:4317", "grpc")
    http_exp = make_exporter("http://127.0.0.1:4318", "http/protobuf")
    try:
        assert isinstance(grpc_exp, EncodedGrpcSpanExporter) and isinstance(http_exp, EncodedHttpSpanExporter)
        body = build_request([SpanEncoder(FUNCS, RESOURCE).encode(tree_session(), OFFSET)])
        request = grpc_exp._translate_data(otlp_fast._Encoded(body, 6))
        assert request == decode(body) and grpc_exp._count_data(otlp_fast._Encoded(body, 6)) == 6
        spans = session_to_spans(tree_session(), FUNCS, OFFSET, RESOURCE)
        assert grpc_exp._translate_data(spans) == encode_spans(spans) and grpc_exp._count_data(spans) == 6
    finally:
        grpc_exp.shutdown()
        http_exp.shutdown()


def test_http_exporter_refuses_oversized_and_after_shutdown():
    exp = EncodedHttpSpanExporter(endpoint="http://127.0.0.1:9/v1/traces", max_request_size=64)
    body = build_request([SpanEncoder(FUNCS, RESOURCE).encode(tree_session(), OFFSET)])
    assert exp.export_encoded(body, 6) is SpanExportResult.FAILURE  # too large: never sent
    exp.shutdown()
    assert exp.export_encoded(body[:10], 1) is SpanExportResult.FAILURE


def test_captured_arguments_become_a_string_list_attribute():
    """-A: each call's `name=value` strings go on its span as retsnoop.args (beside a records-lost count)."""
    from retsnoop_otel.capture.model import ArgValue

    session = tree_session()
    root = session.calls[0]
    create = root.children[1]
    create.args = (ArgValue(0), ArgValue(0xFFFF888000001000, b"\0" * 8))
    create.children[1].args = (ArgValue(7),)  # the call that also carries missing_before=2
    seen = []

    def fmt(func_id, values):
        seen.append(func_id)
        return [f"arg{i}={v.raw if v.raw < 100 else '(ptr)'}" for i, v in enumerate(values)]

    trace = SpanEncoder(FUNCS, RESOURCE, format_args=fmt).encode(session, OFFSET)
    spans = {s.name: s for s in request_to_spans(build_request([trace]))}
    assert spans["map_create"].attributes["retsnoop.args"] == ("arg0=0", "arg1=(ptr)")
    assert spans["capable"].attributes["retsnoop.args"] == ("arg0=7",)
    assert spans["capable"].attributes["retsnoop.records_lost_before"] == 2
    assert "retsnoop.args" not in spans["security_bpf"].attributes
    assert sorted(seen) == [1, 5]
    # without a formatter (no -A) the encoding is the SDK path's, arguments or not
    assert_same(session)


def test_calls_cut_by_the_session_cap_are_on_the_root_span():
    trace = assert_same(tree_session(calls_cut=5))
    (root, *_), = [request_to_spans(build_request([trace]))]
    assert root.attributes["retsnoop.calls_cut"] == 5


def test_source_location_matches_sdk_encoding():
    from tests.unit.test_otlp import _locate
    assert_same(tree_session(), locate=_locate)
    assert_same(tree_session(calls=[]), locate=_locate)

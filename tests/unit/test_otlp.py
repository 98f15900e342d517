import random
import threading
import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import Call, RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.export.otlp import (
    ExportStats,
    OtlpTraceSink,
    make_exporter,
    resolve_protocol,
    session_to_spans,
)
from retsnoop_otel.export.resource import build_resource, read_machine_id

OFFSET = 1_700_000_000_000_000_000
EINVAL = (1 << 64) - 22
ENOMEM_PTR = (1 << 64) - 12
KPTR = 0xFFFF888812345678

FUNCS = {
    0: TracedFunc(0, "__x64_sys_bpf", 0xFFFFFFFF81000000, RetKind.SIGNED, True),
    1: TracedFunc(1, "map_create", 0xFFFFFFFF81000100, RetKind.INT32, False),
    2: TracedFunc(2, "kmalloc_trace", 0xFFFFFFFF81000200, RetKind.POINTER, False),
    3: TracedFunc(3, "security_bpf", 0xFFFFFFFF81000300, RetKind.INT32, False),
    4: TracedFunc(4, "bpf_map_free", 0xFFFFFFFF81000400, RetKind.VOID, False),
    5: TracedFunc(5, "capable", 0xFFFFFFFF81000500, RetKind.BOOL, False),
}


def tree_session(**kw):
    """sys_bpf -> [security_bpf=0, map_create=-EINVAL -> [kmalloc_trace=ptr, capable=true, bpf_map_free (no exit)]]"""
    free = Call(4, 2, 4_000, None, None)
    create = Call(1, 1, 2_000, 8_000, EINVAL, children=[
        Call(2, 2, 2_100, 2_300, KPTR), Call(5, 2, 2_400, 2_500, 1, missing_before=2), free])
    root = Call(0, 0, 1_000, 9_000, EINVAL, children=[Call(3, 1, 1_100, 1_200, 0), create])
    defaults = dict(tid=42, pid=40, comm="worker", proc_comm="bpftool", start_ns=1_000, end_ns=9_000, is_err=True,
                    chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 6_000)],
                    kstack=[0xFFFFFFFF81000105, 0xFFFFFFFF81000010], calls=[root])
    defaults.update(kw)
    return Session(**defaults)


def spans_of(session, **kw):
    return session_to_spans(session, FUNCS, OFFSET, build_resource(instance_id="test"), rng=random.Random(1), **kw)


def by_name(spans):
    return {s.name: s for s in spans}


def test_tree_nesting_ids_and_times():
    spans = spans_of(tree_session())
    assert [s.name for s in spans] == ["__x64_sys_bpf", "security_bpf", "map_create", "kmalloc_trace", "capable",
                                       "bpf_map_free"]
    named = by_name(spans)
    root = named["__x64_sys_bpf"]
    assert root.parent is None
    assert len({s.context.trace_id for s in spans}) == 1 and root.context.trace_id != 0
    assert len({s.context.span_id for s in spans}) == len(spans)
    assert all(s.context.trace_flags.sampled and s.kind is SpanKind.INTERNAL for s in spans)
    assert all(s.instrumentation_scope.name == "retsnoop_otel" and s.instrumentation_scope.version == __version__
               for s in spans)
    assert named["security_bpf"].parent.span_id == root.context.span_id
    assert named["map_create"].parent.span_id == root.context.span_id
    for child in ("kmalloc_trace", "capable", "bpf_map_free"):
        assert named[child].parent.span_id == named["map_create"].context.span_id
    assert (root.start_time, root.end_time) == (OFFSET + 1_000, OFFSET + 9_000)
    assert (named["map_create"].start_time, named["map_create"].end_time) == (OFFSET + 2_000, OFFSET + 8_000)
    assert (named["kmalloc_trace"].start_time, named["kmalloc_trace"].end_time) == (OFFSET + 2_100, OFFSET + 2_300)


def test_statuses_and_result_attributes():
    named = by_name(spans_of(tree_session()))
    create = named["map_create"]
    assert create.status.status_code is StatusCode.ERROR and create.status.description == "-EINVAL"
    assert create.attributes["error.type"] == "EINVAL"
    assert create.attributes["retsnoop.return_value"] == -22
    assert create.attributes["retsnoop.return_kind"] == "int32"
    assert create.attributes["retsnoop.result"] == "-EINVAL"
    assert create.attributes["code.function.name"] == "map_create"
    ok = named["security_bpf"]
    assert ok.status.status_code is StatusCode.UNSET
    assert "error.type" not in ok.attributes and ok.attributes["retsnoop.return_value"] == 0
    assert named["capable"].attributes["retsnoop.result"] == "true"
    assert named["capable"].attributes["retsnoop.return_value"] == 1
    assert named["capable"].attributes["retsnoop.records_lost_before"] == 2
    assert "retsnoop.records_lost_before" not in named["kmalloc_trace"].attributes


def test_function_without_exit_ends_with_parent():
    free = by_name(spans_of(tree_session()))["bpf_map_free"]
    assert free.end_time == OFFSET + 8_000 and free.start_time == OFFSET + 4_000
    assert free.attributes["retsnoop.incomplete"] is True
    assert "retsnoop.return_value" not in free.attributes and "retsnoop.result" not in free.attributes
    assert free.status.status_code is StatusCode.UNSET


def test_root_attributes():
    root = spans_of(tree_session(dropped_records=3), symbolize=lambda a: f"sym_{a & 0xFFF:x}")[0]
    attrs = root.attributes
    assert attrs["thread.id"] == 42 and attrs["process.pid"] == 40
    assert attrs["thread.name"] == "worker" and attrs["process.executable.name"] == "bpftool"
    assert attrs["retsnoop.dropped_records"] == 3
    assert attrs["error.type"] == "EINVAL" and root.status.status_code is StatusCode.ERROR
    assert attrs["code.stacktrace"] == "sym_105\nsym_10"  # innermost frame first, as captured
    assert "retsnoop.dropped_records" not in spans_of(tree_session())[0].attributes


def test_no_raw_addresses_unless_asked():
    def all_text(spans):
        return " ".join(str(v) for s in spans for v in s.attributes.values())

    plain = spans_of(tree_session())
    assert "code.stacktrace" not in plain[0].attributes
    kmalloc = by_name(plain)["kmalloc_trace"]
    assert kmalloc.attributes["retsnoop.result"] == "non-NULL"
    assert "retsnoop.return_value" not in kmalloc.attributes
    assert "ffff" not in all_text(plain) and str(KPTR - (1 << 64)) not in all_text(plain)
    assert "ffff" not in all_text(spans_of(tree_session(), symbolize=lambda a: "do_sys_bpf+0x5"))
    # an address no symbol covers comes back as hex from the symbolizer: it must not leak either
    unknown = spans_of(tree_session(), symbolize=lambda a: "f+0x5" if a & 0x100 else f"0x{a:x}")
    assert unknown[0].attributes["code.stacktrace"] == "f+0x5\n[unknown]"

    exposed = spans_of(tree_session(), symbolize=lambda a: "f+0x5", export_addresses=True)
    assert exposed[0].attributes["code.stacktrace"].splitlines()[0] == "0xffffffff81000105 f+0x5"
    kmalloc = by_name(exposed)["kmalloc_trace"]
    assert kmalloc.attributes["retsnoop.result"] == f"0x{KPTR:x}"
    assert kmalloc.attributes["retsnoop.return_value"] == KPTR - (1 << 64)  # fits OTLP's int64
    raw_only = spans_of(tree_session(), export_addresses=True)
    assert raw_only[0].attributes["code.stacktrace"] == "0xffffffff81000105\n0xffffffff81000010"
    encode_spans(exposed)  # every attribute value must be encodable


def test_pointer_errors_are_reported():
    call = Call(2, 0, 10, 20, 0)
    session = tree_session(calls=[call], chain=[StackEntry(2, 0, 10)], start_ns=10, end_ns=20)
    (span,) = spans_of(session)
    assert span.attributes["error.type"] == "NULL" and span.status.description == "NULL"
    session = tree_session(calls=[Call(2, 0, 10, 20, ENOMEM_PTR)], chain=[], start_ns=10, end_ns=20)
    (span,) = spans_of(session)
    assert span.attributes["error.type"] == "ENOMEM" and span.attributes["retsnoop.return_value"] == -12


def test_void_omits_return_value():
    session = tree_session(calls=[Call(4, 0, 10, 20, 0)], chain=[], start_ns=10, end_ns=20, is_err=False)
    (span,) = spans_of(session)
    assert span.attributes["retsnoop.result"] == "void" and "retsnoop.return_value" not in span.attributes
    assert span.status.status_code is StatusCode.UNSET


def test_chain_only_spans_are_nested_and_right_aligned():
    chain = [StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 3_000), StackEntry(3, EINVAL, 500)]
    spans = spans_of(tree_session(calls=[], chain=chain))
    assert [s.name for s in spans] == ["__x64_sys_bpf", "map_create", "security_bpf"]
    root, create, sec = spans
    assert create.parent.span_id == root.context.span_id and sec.parent.span_id == create.context.span_id
    assert (create.start_time, create.end_time) == (OFFSET + 6_000, OFFSET + 9_000)
    assert (sec.start_time, sec.end_time) == (OFFSET + 8_500, OFFSET + 9_000)
    assert all(s.attributes["retsnoop.start_estimated"] for s in (create, sec))
    assert "retsnoop.start_estimated" not in root.attributes
    assert sec.attributes["error.type"] == "EINVAL" and sec.status.status_code is StatusCode.ERROR


def test_chain_levels_clamped_and_incomplete():
    chain = [StackEntry(0, EINVAL, 8_000), StackEntry(1, 0, None), StackEntry(3, EINVAL, 99_000)]
    root, create, sec = spans_of(tree_session(calls=[], chain=chain))
    assert (create.start_time, create.end_time) == (root.start_time, root.end_time)
    assert create.attributes["retsnoop.incomplete"] is True and create.status.status_code is StatusCode.UNSET
    assert (sec.start_time, sec.end_time) == (root.start_time, root.end_time)  # longer than parent: clamped


def test_span_limit_counts_what_is_left_out():
    spans = spans_of(tree_session(), max_spans=3)
    assert [s.name for s in spans] == ["__x64_sys_bpf", "security_bpf", "map_create"]
    assert spans[0].attributes["retsnoop.spans_dropped"] == 3


def test_unknown_function_id_and_extra_top_level_calls():
    stray = Call(77, 0, 9_500, 9_600, 0)
    spans = spans_of(tree_session(calls=[*tree_session().calls, stray]))
    assert spans[0].name == "__x64_sys_bpf"
    assert spans[1].name == "__x64_sys_bpf" and spans[1].parent.span_id == spans[0].context.span_id
    assert spans[-1].name == "func#77" and spans[-1].parent.span_id == spans[0].context.span_id


def test_encodes_to_one_resource_and_scope():
    req = encode_spans(spans_of(tree_session()))
    assert len(req.resource_spans) == 1 and len(req.resource_spans[0].scope_spans) == 1
    assert len(req.resource_spans[0].scope_spans[0].spans) == 6


# ---- resource ------------------------------------------------------------------------------------

def test_resource_attributes(tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    attrs = build_resource(root=tmp_path).attributes
    assert attrs["service.name"] == "retsnoop-otel" and attrs["service.version"] == __version__
    assert attrs["host.id"] == "0123456789abcdef0123456789abcdef"
    assert attrs["os.type"] == "linux" and attrs["os.version"]
    assert attrs["host.name"] and attrs["host.arch"]
    assert attrs["service.instance.id"] != build_resource(root=tmp_path).attributes["service.instance.id"]


def test_resource_env_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,host.name=override")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "kernel-tracer")
    attrs = build_resource(root=tmp_path).attributes
    assert attrs["service.name"] == "kernel-tracer"
    assert attrs["deployment.environment"] == "ci" and attrs["host.name"] == "override"
    assert "host.id" not in attrs and read_machine_id(tmp_path) is None


# ---- sink ----------------------------------------------------------------------------------------

class FakeExporter:
    def __init__(self, fail=False, gate=None):
        self.batches = []
        self.fail = fail
        self.gate = gate
        self.shut = False

    def export(self, spans):
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append(list(spans))
        return SpanExportResult.FAILURE if self.fail else SpanExportResult.SUCCESS

    def shutdown(self):
        self.shut = True


def test_sink_exports_in_bounded_batches():
    exp = FakeExporter()
    sink = OtlpTraceSink(exporter=exp, protocol="grpc", max_batch_spans=4)
    spans = spans_of(tree_session())
    assert sink.submit(spans) and sink.submit(spans[:2])
    assert sink.flush(5)
    assert max(len(b) for b in exp.batches) <= 4
    assert [s for b in exp.batches for s in b] == spans + spans[:2]  # order kept, nothing lost or repeated
    sink.shutdown(1)
    assert exp.shut and sink.stats() == ExportStats(8, {}, 0)


def test_sink_drops_newest_when_full_without_blocking():
    gate = threading.Event()
    exp = FakeExporter(gate=gate)
    sink = OtlpTraceSink(exporter=exp, protocol="grpc", max_queue_spans=10)
    spans = spans_of(tree_session())  # 6 spans
    assert sink.submit(spans)  # taken by the worker, which blocks in export
    deadline = time.monotonic() + 5
    while sink._in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sink.submit(spans)  # queued: 6 of 10
    t0 = time.perf_counter()
    assert not sink.submit(spans)  # 12 > 10: dropped whole
    assert time.perf_counter() - t0 < 0.05
    assert sink.stats().spans_dropped == {"queue_full": 6}
    gate.set()
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(12, {"queue_full": 6}, 0)
    assert not sink.submit(spans) and sink.stats().spans_dropped["shutdown"] == 6


def test_sink_counts_export_failures():
    exp = FakeExporter(fail=True)
    sink = OtlpTraceSink(exporter=exp, protocol="grpc")
    sink.submit(spans_of(tree_session()))
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(0, {"export_failed": 6}, 1)


def test_sink_shutdown_timeout_drops_queued():
    gate = threading.Event()
    sink = OtlpTraceSink(exporter=FakeExporter(gate=gate), protocol="grpc", max_batch_spans=6)
    spans = spans_of(tree_session())
    sink.submit(spans)
    sink.submit(spans)
    assert not sink.flush(0.05)
    sink.shutdown(0.05)
    gate.set()
    assert sink.stats().spans_dropped.get("shutdown") in (6, 12)


def test_protocol_resolution(monkeypatch):
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert resolve_protocol(None, env) == "http/protobuf"
    assert resolve_protocol(None, {**env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}) == "grpc"
    assert resolve_protocol("grpc", env) == "grpc"
    assert resolve_protocol(None, {}) == "grpc"
    with pytest.raises(ValueError, match="http/json"):
        resolve_protocol("http/json", {})


def test_exporter_construction(monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_INSECURE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        make_exporter("localhost:4317", "grpc")
    grpc_exp = make_exporter("http://127.0.0.1:4317", "grpc")
    assert grpc_exp._insecure is True and grpc_exp._endpoint == "127.0.0.1:4317"
    grpc_exp.shutdown()
    assert make_exporter("http://collector:4318", "http/protobuf")._endpoint == "http://collector:4318/v1/traces"
    assert make_exporter("https://c:4318/custom/path", "http/protobuf")._endpoint == "https://c:4318/custom/path"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://envhost:4318")
    assert make_exporter(None, "http/protobuf")._endpoint == "http://envhost:4318/v1/traces"


def _locate(addr):
    """DWARF stand-in: map_create is defined in kernel/bpf/syscall.c; the others have no location."""
    return ("kernel/bpf/syscall.c", 1105) if addr == FUNCS[1].addr else None


def test_source_location_attributes_with_dwarf():
    spans = spans_of(tree_session(), locate=_locate)
    named = by_name(spans)
    assert named["map_create"].attributes["code.file.path"] == "kernel/bpf/syscall.c"
    assert named["map_create"].attributes["code.line.number"] == 1105
    assert "code.file.path" not in named["kmalloc_trace"].attributes
    assert all("code.file.path" not in s.attributes for s in spans_of(tree_session()))


def test_definition_comes_from_the_entry_address_frame():
    from retsnoop_otel.symbols.symbolize import Frame, definition

    class Sym:
        def frames(self, addr):
            return {1: [Frame("f", 0, None, "kernel/bpf/syscall.c", 10), Frame("g", 0, None, "x.h", 3, True)],
                    2: [Frame("f", 4, None, "kernel/bpf/syscall.c", 12)], 3: [Frame("h")]}.get(addr, [])

    assert definition(Sym(), 1) == ("kernel/bpf/syscall.c", 10)
    assert definition(Sym(), 2) is None  # not a function start
    assert definition(Sym(), 3) is None and definition(Sym(), 4) is None

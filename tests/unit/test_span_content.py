"""What a session becomes as OTLP spans, read back from the bytes the production encoder writes.

The production path writes protobuf by hand (export/span_encoder.py); these tests decode its
requests with the generated opentelemetry-proto classes and check the meaning: names, nesting, ids,
times, statuses, attributes and what must never leak (raw kernel addresses).
"""

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import Call, StackEntry
from tests.fakes import EINVAL, KPTR, OFFSET, dwarf_locate, tree_session
from tests.oracle_spans import request_to_spans
from tests.span_checks import encoded

ERROR, UNSET = 2, 0

ENOMEM_PTR = (1 << 64) - 12


def spans_of(session, symbolize=None, **kw):
    """The spans of one session as the production encoder writes them, decoded (root first)."""
    return request_to_spans(encoded(session, symbolize, **kw))


def by_name(spans):
    return {s["name"]: s for s in spans}


def test_tree_nesting_ids_and_times():
    spans = spans_of(tree_session())
    assert [s["name"] for s in spans] == ["__x64_sys_bpf", "security_bpf", "map_create", "kmalloc_trace", "capable",
                                       "bpf_map_free"]
    named = by_name(spans)
    root = named["__x64_sys_bpf"]
    assert root["parent_id"] is None
    assert len({s["trace_id"] for s in spans}) == 1 and root["trace_id"] != 0
    assert len({s["span_id"] for s in spans}) == len(spans)
    req = ExportTraceServiceRequest.FromString(encoded(tree_session()))
    raw = req.resource_spans[0].scope_spans[0]
    assert raw.scope.name == "retsnoop_otel" and raw.scope.version == __version__
    assert all(s.kind == Span.SPAN_KIND_INTERNAL and s.flags == 0x100 for s in raw.spans)
    assert named["security_bpf"]["parent_id"] == root["span_id"]
    assert named["map_create"]["parent_id"] == root["span_id"]
    for child in ("kmalloc_trace", "capable", "bpf_map_free"):
        assert named[child]["parent_id"] == named["map_create"]["span_id"]
    assert (root["start"], root["end"]) == (OFFSET + 1_000, OFFSET + 9_000)
    assert (named["map_create"]["start"], named["map_create"]["end"]) == (OFFSET + 2_000, OFFSET + 8_000)
    assert (named["kmalloc_trace"]["start"], named["kmalloc_trace"]["end"]) == (OFFSET + 2_100, OFFSET + 2_300)


def test_statuses_and_result_attributes():
    named = by_name(spans_of(tree_session()))
    create = named["map_create"]
    assert create["status"] == ERROR and create["status_message"] == "-EINVAL"
    assert create["attributes"]["error.type"] == "EINVAL"
    assert create["attributes"]["retsnoop.return_value"] == -22
    assert create["attributes"]["retsnoop.return_kind"] == "int32"
    assert create["attributes"]["retsnoop.result"] == "-EINVAL"
    assert create["attributes"]["code.function.name"] == "map_create"
    ok = named["security_bpf"]
    assert ok["status"] == UNSET
    assert "error.type" not in ok["attributes"] and ok["attributes"]["retsnoop.return_value"] == 0
    assert named["capable"]["attributes"]["retsnoop.result"] == "true"
    assert named["capable"]["attributes"]["retsnoop.return_value"] == 1
    assert named["capable"]["attributes"]["retsnoop.records_lost_before"] == 2
    assert "retsnoop.records_lost_before" not in named["kmalloc_trace"]["attributes"]


def test_function_without_exit_ends_with_parent():
    free = by_name(spans_of(tree_session()))["bpf_map_free"]
    assert free["end"] == OFFSET + 8_000 and free["start"] == OFFSET + 4_000
    assert free["attributes"]["retsnoop.incomplete"] is True
    assert "retsnoop.return_value" not in free["attributes"] and "retsnoop.result" not in free["attributes"]
    assert free["status"] == UNSET


def test_root_attributes():
    root = spans_of(tree_session(dropped_records=3), symbolize=lambda a: f"sym_{a & 0xFFF:x}")[0]
    attrs = root["attributes"]
    assert attrs["thread.id"] == 42 and attrs["process.pid"] == 40
    assert attrs["thread.name"] == "worker" and attrs["process.executable.name"] == "bpftool"
    assert attrs["retsnoop.dropped_records"] == 3
    assert attrs["error.type"] == "EINVAL" and root["status"] == ERROR
    assert attrs["code.stacktrace"] == "sym_105\nsym_10"  # innermost frame first, as captured
    assert "retsnoop.dropped_records" not in spans_of(tree_session())[0]["attributes"]


def test_no_raw_addresses_unless_asked():
    def all_text(spans):
        return " ".join(str(v) for s in spans for v in s["attributes"].values())

    plain = spans_of(tree_session())
    assert "code.stacktrace" not in plain[0]["attributes"]
    kmalloc = by_name(plain)["kmalloc_trace"]
    assert kmalloc["attributes"]["retsnoop.result"] == "non-NULL"
    assert "retsnoop.return_value" not in kmalloc["attributes"]
    assert "ffff" not in all_text(plain) and str(KPTR - (1 << 64)) not in all_text(plain)
    assert "ffff" not in all_text(spans_of(tree_session(), symbolize=lambda a: "do_sys_bpf+0x5"))
    # an address no symbol covers comes back as hex from the symbolizer: it must not leak either
    unknown = spans_of(tree_session(), symbolize=lambda a: "f+0x5" if a & 0x100 else f"0x{a:x}")
    assert unknown[0]["attributes"]["code.stacktrace"] == "f+0x5\n[unknown]"

    exposed = spans_of(tree_session(), symbolize=lambda a: "f+0x5", export_addresses=True)
    assert exposed[0]["attributes"]["code.stacktrace"].splitlines()[0] == "0xffffffff81000105 f+0x5"
    kmalloc = by_name(exposed)["kmalloc_trace"]
    assert kmalloc["attributes"]["retsnoop.result"] == f"0x{KPTR:x}"
    assert kmalloc["attributes"]["retsnoop.return_value"] == KPTR - (1 << 64)  # fits OTLP's int64
    raw_only = spans_of(tree_session(), export_addresses=True)
    assert raw_only[0]["attributes"]["code.stacktrace"] == "0xffffffff81000105\n0xffffffff81000010"


def test_pointer_errors_are_reported():
    call = Call(2, 0, 10, 20, 0)
    session = tree_session(calls=[call], chain=[StackEntry(2, 0, 10)], start_ns=10, end_ns=20)
    (span,) = spans_of(session)
    assert span["attributes"]["error.type"] == "NULL" and span["status_message"] == "NULL"
    session = tree_session(calls=[Call(2, 0, 10, 20, ENOMEM_PTR)], chain=[], start_ns=10, end_ns=20)
    (span,) = spans_of(session)
    assert span["attributes"]["error.type"] == "ENOMEM" and span["attributes"]["retsnoop.return_value"] == -12


def test_void_omits_return_value():
    session = tree_session(calls=[Call(4, 0, 10, 20, 0)], chain=[], start_ns=10, end_ns=20, is_err=False)
    (span,) = spans_of(session)
    assert span["attributes"]["retsnoop.result"] == "void" and "retsnoop.return_value" not in span["attributes"]
    assert span["status"] == UNSET


def test_chain_only_spans_are_nested_and_right_aligned():
    chain = [StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 3_000), StackEntry(3, EINVAL, 500)]
    spans = spans_of(tree_session(calls=[], chain=chain))
    assert [s["name"] for s in spans] == ["__x64_sys_bpf", "map_create", "security_bpf"]
    root, create, sec = spans
    assert create["parent_id"] == root["span_id"] and sec["parent_id"] == create["span_id"]
    assert (create["start"], create["end"]) == (OFFSET + 6_000, OFFSET + 9_000)
    assert (sec["start"], sec["end"]) == (OFFSET + 8_500, OFFSET + 9_000)
    assert all(s["attributes"]["retsnoop.start_estimated"] for s in (create, sec))
    assert "retsnoop.start_estimated" not in root["attributes"]
    assert sec["attributes"]["error.type"] == "EINVAL" and sec["status"] == ERROR


def test_chain_levels_clamped_and_incomplete():
    chain = [StackEntry(0, EINVAL, 8_000), StackEntry(1, 0, None), StackEntry(3, EINVAL, 99_000)]
    root, create, sec = spans_of(tree_session(calls=[], chain=chain))
    assert (create["start"], create["end"]) == (root["start"], root["end"])
    assert create["attributes"]["retsnoop.incomplete"] is True and create["status"] == UNSET
    assert (sec["start"], sec["end"]) == (root["start"], root["end"])  # longer than parent: clamped


def test_span_limit_counts_what_is_left_out():
    spans = spans_of(tree_session(), max_spans=3)
    assert [s["name"] for s in spans] == ["__x64_sys_bpf", "security_bpf", "map_create"]
    assert spans[0]["attributes"]["retsnoop.spans_dropped"] == 3


def test_unknown_function_id_and_extra_top_level_calls():
    stray = Call(77, 0, 9_500, 9_600, 0)
    spans = spans_of(tree_session(calls=[*tree_session().calls, stray]))
    assert spans[0]["name"] == "__x64_sys_bpf"
    assert spans[1]["name"] == "__x64_sys_bpf" and spans[1]["parent_id"] == spans[0]["span_id"]
    assert spans[-1]["name"] == "func#77" and spans[-1]["parent_id"] == spans[0]["span_id"]


def test_encodes_to_one_resource_and_scope():
    req = ExportTraceServiceRequest.FromString(encoded(tree_session()))
    assert len(req.resource_spans) == 1 and len(req.resource_spans[0].scope_spans) == 1
    assert len(req.resource_spans[0].scope_spans[0].spans) == 6


def test_source_location_attributes_with_dwarf():
    spans = spans_of(tree_session(), locate=dwarf_locate)
    named = by_name(spans)
    assert named["map_create"]["attributes"]["code.file.path"] == "kernel/bpf/syscall.c"
    assert named["map_create"]["attributes"]["code.line.number"] == 1105
    assert "code.file.path" not in named["kmalloc_trace"]["attributes"]
    assert all("code.file.path" not in s["attributes"] for s in spans_of(tree_session()))


def test_definition_comes_from_the_entry_address_frame():
    from retsnoop_otel.symbols.symbolize import Frame, definition

    class Sym:
        def frames(self, addr):
            return {1: [Frame("f", 0, None, "kernel/bpf/syscall.c", 10), Frame("g", 0, None, "x.h", 3, True)],
                    2: [Frame("f", 4, None, "kernel/bpf/syscall.c", 12)], 3: [Frame("h")]}.get(addr, [])

    assert definition(Sym(), 1) == ("kernel/bpf/syscall.c", 10)
    assert definition(Sym(), 2) is None  # not a function start
    assert definition(Sym(), 3) is None and definition(Sym(), 4) is None

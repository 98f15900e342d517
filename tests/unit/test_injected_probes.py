"""Injected probes (-J): spec parsing, tracefs format decoding, the record, session assembly, every output, and the
attach module's checks against a kernel (faked: the real one is tests/vm/test_inject.py; this module is named
apart from it, as pytest imports test modules by basename)."""

from __future__ import annotations

import errno
import json
import re
import struct
from pathlib import Path

import pytest

from retsnoop_otel.capture import records
from retsnoop_otel.capture.inject import (
    MAX_PROBES,
    InjectError,
    InjectSpec,
    ProbeHit,
    ProbeInfo,
    decode_payload,
    parse_format,
    parse_spec,
    parse_specs,
    read_format,
)
from retsnoop_otel.capture.model import Call
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.export.probe_events import PROBE_KIND
from retsnoop_otel.export.span_encoder import build_request
from retsnoop_otel.kernel import inject_attach
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.render.calls import render_calls
from retsnoop_otel.render.console import session_json
from retsnoop_otel.render.trace_json import trace_events
from retsnoop_otel.runtime.config import ProbeSetConfig
from retsnoop_otel.trace.flags import parse
from tests.fakes import OFFSET, TREE_FUNCS, tree_session
from tests.span_checks import decode, encoder_for

TRACEFS = Path(__file__).resolve().parents[1] / "fixtures" / "tracefs"
BPF_SRC = Path(__file__).resolve().parents[2] / "bpf"
EXIT_BPF = InjectSpec("tp", "sys_exit_bpf", "syscalls")


# ---- specs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "spec", "shown"), [
    ("kprobe:map_create", InjectSpec("kprobe", "map_create"), "kprobe:map_create"),
    ("kprobe:map_create+0x1c", InjectSpec("kprobe", "map_create", offset=0x1c), "kprobe:map_create+0x1c"),
    ("kprobe:map_create+28", InjectSpec("kprobe", "map_create", offset=28), "kprobe:map_create+0x1c"),
    ("kretprobe:security_bpf", InjectSpec("kretprobe", "security_bpf"), "kretprobe:security_bpf"),
    ("rawtp:sys_exit", InjectSpec("rawtp", "sys_exit"), "rawtp:sys_exit"),
    (" tp:syscalls:sys_exit_bpf ", EXIT_BPF, "tp:syscalls:sys_exit_bpf"),
])
def test_specs_in_retsnoop_forms(text: str, spec: InjectSpec, shown: str) -> None:
    assert parse_spec(text) == spec
    assert spec.text == shown


@pytest.mark.parametrize(("text", "says"), [
    ("uprobe:/bin/x:f", "unknown probe kind 'uprobe'"),
    ("map_create", "unknown probe kind"),
    ("kprobe:f+xyz", "write kprobe:FUNC[+OFF]"),
    ("kretprobe:f+4", "write kretprobe:FUNC"),
    ("tp:sys_exit_bpf", "write tp:CATEGORY:NAME"),
    ("rawtp:", "write rawtp:NAME"),
])
def test_a_bad_spec_names_the_problem_and_the_forms(text: str, says: str) -> None:
    with pytest.raises(InjectError, match=re.escape(says)):
        parse_spec(text)


def test_spec_files_take_one_spec_a_line_with_comments(tmp_path: Path) -> None:
    f = tmp_path / "probes"
    f.write_text("# probes for the bpf syscall\ntp:syscalls:sys_exit_bpf\n\nkprobe:map_create+0x10  # inside\n")
    specs = parse_specs([f"@{f}", "tp:syscalls:sys_exit_bpf", "rawtp:sys_exit"])
    assert [s.text for s in specs] == ["tp:syscalls:sys_exit_bpf", "kprobe:map_create+0x10", "rawtp:sys_exit"]
    with pytest.raises(InjectError, match="cannot read"):
        parse_specs([f"@{tmp_path / 'missing'}"])
    with pytest.raises(InjectError, match=f"at most {MAX_PROBES}"):
        parse_specs([f"kprobe:f{i}" for i in range(MAX_PROBES + 1)])


def test_trace_flags_carry_the_probes_and_turn_the_call_records_on(tmp_path: Path) -> None:
    req = parse(["-e", "*_sys_bpf", "-J", "tp:syscalls:sys_exit_bpf", "-J", "kprobe:map_create+4"], environ={})
    (ps,) = req.config.probe_sets
    assert ps.inject == (EXIT_BPF, InjectSpec("kprobe", "map_create", offset=4))
    assert ps.mode == "stack" and ps.records_calls  # the probes travel in the per-call stream
    assert not ProbeSetConfig("x", ("f",)).records_calls


def test_a_bad_flag_value_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["-e", "*_sys_bpf", "-J", "tracepoint:syscalls:sys_exit_bpf"], environ={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown probe kind 'tracepoint'" in err and "tp:CATEGORY:NAME" in err and err.count("\n") == 1


# ---- tracepoint formats and payloads -----------------------------------------------------------

def test_format_files_give_the_events_own_fields() -> None:
    fmt = read_format(TRACEFS, "syscalls", "sys_exit_bpf")
    assert [(f.name, f.ctype, f.offset, f.size, f.signed) for f in fmt.fields] == [
        ("__syscall_nr", "int", 8, 4, True), ("ret", "long", 16, 8, True)]
    assert fmt.size == 24
    mixed = read_format(TRACEFS, "fixture", "mixed_fields")
    assert [f.name for f in mixed.fields] == ["filename", "pid", "old_pid", "comm", "mm"]
    assert mixed.size == records.MAX_INJECT_DATA  # a dynamic field: all a record may carry is copied
    assert mixed.fields[-1].is_address and mixed.fields[3].array


def test_a_missing_tracepoint_says_which_part_is_wrong() -> None:
    with pytest.raises(InjectError, match="no such category.*available_events"):
        read_format(TRACEFS, "nosuch", "sys_exit_bpf")
    with pytest.raises(InjectError, match="no such event in that category"):
        read_format(TRACEFS, "syscalls", "sys_exit_nosuch")
    with pytest.raises(InjectError, match="lists no fields"):
        parse_format("name: x\nID: 1\n", "c", "x")


def test_tracepoint_payloads_decode_by_field_name() -> None:
    info = ProbeInfo(0, EXIT_BPF, fmt=read_format(TRACEFS, "syscalls", "sys_exit_bpf"))
    raw = struct.pack("<HBBiiiq", 1011, 0, 0, 77, 321, 0, -22)
    assert [(f.name, f.value) for f in decode_payload(info, 0, raw)] == [("__syscall_nr", 321), ("ret", -22)]
    assert decode_payload(info, 0, raw[:16]) == decode_payload(info, 0, raw)[:1]  # a short copy: what it reaches

    mixed = ProbeInfo(1, InjectSpec("tp", "mixed_fields", "fixture"), fmt=read_format(TRACEFS, "fixture",
                                                                                      "mixed_fields"))
    name = b"/usr/bin/simfail\0"
    raw = (struct.pack("<HBBi", 1, 0, 0, 5) + struct.pack("<I", len(name) << 16 | 48) + struct.pack("<ii", 5, 4)
           + b"simfail".ljust(16, b"\0") + bytes(4) + struct.pack("<Q", 0xFFFF888800001000) + name)
    fields = {f.name: f for f in decode_payload(mixed, 0, raw)}
    assert fields["filename"].value == "/usr/bin/simfail" and fields["comm"].value == "simfail"
    assert fields["pid"].value == 5 and fields["mm"].address and fields["mm"].value == 0xFFFF888800001000


def test_kprobe_rawtp_and_kretprobe_payloads() -> None:
    kp = ProbeInfo(0, InjectSpec("kprobe", "map_create", offset=8))
    assert [(f.name, f.value, f.address) for f in decode_payload(kp, 0xFFFFFFFF81000108, b"")] == [
        ("ip", 0xFFFFFFFF81000108, True)]
    kret = ProbeInfo(1, InjectSpec("kretprobe", "security_bpf"))  # int: the register's upper half is not its value
    assert [(f.name, f.value) for f in decode_payload(kret, (1 << 64) - 1, b"")] == [("ret", -1)]
    assert [(f.name, f.value) for f in decode_payload(kret, 0xFFFFFFEA, b"")] == [("ret", -22)]
    kret64 = ProbeInfo(1, InjectSpec("kretprobe", "__x64_sys_bpf"), ret_int32=False)
    assert [(f.name, f.value) for f in decode_payload(kret64, 0xFFFFFFEA, b"")] == [("ret", 0xFFFFFFEA)]
    assert [(f.name, f.value) for f in decode_payload(kret64, (1 << 64) - 22, b"")] == [("ret", -22)]
    raw = ProbeInfo(2, InjectSpec("rawtp", "sys_exit"), nargs=2, arg_addresses=(True, False))
    fields = decode_payload(raw, 0, struct.pack("<QQ", 0xFFFFC90000ABC000, 321))
    assert [(f.name, f.value, f.address) for f in fields] == [("arg0", 0xFFFFC90000ABC000, True), ("arg1", 321, False)]
    assert raw.payload_size == 16


def test_the_record_matches_the_header() -> None:
    src = (BPF_SRC / "retsnoop.bpf.c").read_text()
    assert re.search(r"sizeof\(struct rec_inject_probe\) == (\d+)", src).group(1) == str(records.INJECT_PROBE.size)
    header = (BPF_SRC / "retsnoop.h").read_text()
    assert f"REC_INJECT_PROBE = {records.REC_INJECT_PROBE}," in header
    assert f"#define MAX_INJECT_DATA {records.MAX_INJECT_DATA}" in header
    data = b"\x01\x02\x03"
    raw = records.INJECT_PROBE.pack(records.REC_INJECT_PROBE, 42, 5_000, 7, 2, 1, 0xABC, len(data), data)
    assert records.decode(raw) == records.InjectProbeRec(42, 5_000, 7, 2, 1, 0xABC, data)
    failed = records.INJECT_PROBE.pack(records.REC_INJECT_PROBE, 42, 5_000, 7, 2, 1, 0, -14, b"")
    assert records.decode(failed).data == b""  # a failed read carries no bytes


# ---- sessions ------------------------------------------------------------------------------------

def _trace(is_exit: bool, seq: int, depth: int, func_id: int, ts: int, res: int = 0) -> records.FuncTraceRec:
    return records.FuncTraceRec(is_exit, 42, ts, seq, depth, func_id, 0, res)


def _end(last_seq: int) -> records.SessionEndRec:
    return records.SessionEndRec(42, 40, 0, 1_000, 9_000, 0, last_seq, 0, True, 0, 0, 0, "worker", "bpftool",
                                 (), (), (), ())


def _probe_session() -> tuple[SessionAssembler, list[records.Record]]:
    """__x64_sys_bpf -> map_create (a kprobe inside it, then the tracepoint after a lost record) -> security_bpf"""
    infos = {0: ProbeInfo(0, EXIT_BPF, fmt=read_format(TRACEFS, "syscalls", "sys_exit_bpf")),
             1: ProbeInfo(1, InjectSpec("kprobe", "map_create", offset=0x1c))}
    tp_raw = struct.pack("<HBBiiiq", 1011, 0, 0, 77, 321, 0, -22)
    recs: list[records.Record] = [
        records.SessionStartRec(42, 40, 0, 1_000, "worker", "bpftool"),
        _trace(False, 0, 0, 0, 1_000),
        _trace(False, 1, 1, 1, 2_000),
        records.InjectProbeRec(42, 2_500, 2, 2, 1, 0xFFFFFFFF8100011C, b""),
        _trace(True, 3, 1, 1, 3_000, (1 << 64) - 22),
        # seq 4 lost
        records.InjectProbeRec(42, 3_500, 5, 1, 0, 0, tp_raw),
        _trace(False, 6, 1, 3, 4_000),
        _trace(True, 7, 1, 3, 4_500),
        _trace(True, 8, 0, 0, 9_000, (1 << 64) - 22),
        _end(9),
    ]
    return SessionAssembler(probes=infos), recs


def _assembled():
    asm, recs = _probe_session()
    out = [s for r in recs if (s := asm.feed(r)) is not None]
    assert len(out) == 1
    return out[0]


def test_probes_land_in_their_session_under_the_call_they_fired_in() -> None:
    s = _assembled()
    kp, tp = s.probes
    (root,) = s.calls
    create, security = root.children
    assert create.probes == [kp] and root.probes == [tp] and not security.probes
    assert (kp.spec, kp.depth, kp.in_call, kp.missing_before) == ("kprobe:map_create+0x1c", 2, True, 0)
    assert (tp.spec, tp.kind, tp.missing_before) == ("tp:syscalls:sys_exit_bpf", "tp", 1)
    assert tp.text() == "__syscall_nr=321  ret=-22"
    assert s.dropped_records == 1


def test_a_probe_of_an_unknown_id_or_another_session_is_not_lost_or_misplaced() -> None:
    asm = SessionAssembler()
    asm.feed(records.SessionStartRec(42, 40, 0, 1_000, "worker", "bpftool"))
    asm.feed(records.InjectProbeRec(43, 1_100, 0, 0, 9, 0, b""))  # another thread: no session there
    asm.feed(records.InjectProbeRec(42, 1_200, 0, 0, 9, 0, b""))
    s = asm.feed(_end(1))
    assert [(h.spec, h.in_call) for h in s.probes] == [("probe#9", False)]


# ---- outputs -------------------------------------------------------------------------------------

def test_the_call_table_shows_each_probe_at_its_depth_in_order() -> None:
    text = render_calls(_assembled(), TREE_FUNCS)
    rows = [line.rstrip() for line in text.splitlines()[2:]]
    assert rows[:3] == ["→ __x64_sys_bpf", "    → map_create",
                        "        ◎ kprobe:map_create+0x1c  ip=0xffffffff8100011c"]
    assert rows[3].startswith("    ← map_create") and "-EINVAL" in rows[3]
    assert rows[4] == "    ‼ ... missing 1 records ..."
    assert rows[5] == "    ◎ tp:syscalls:sys_exit_bpf  __syscall_nr=321  ret=-22"
    assert rows[6].startswith("    ↔ security_bpf") and rows[7].startswith("← __x64_sys_bpf")
    assert "missing" not in "".join(rows[8:])  # the gap is shown once, where it was


def test_json_lists_the_probes_with_the_function_they_fired_in() -> None:
    out = json.loads(json.dumps(session_json(_assembled(), TREE_FUNCS, OFFSET)))
    assert out["probes"] == [
        {"probe": "kprobe:map_create+0x1c", "kind": "kprobe", "depth": 2, "ts_ns": 2_500 + OFFSET,
         "function": "map_create", "fields": {"ip": 0xFFFFFFFF8100011C}},
        {"probe": "tp:syscalls:sys_exit_bpf", "kind": "tp", "depth": 1, "ts_ns": 3_500 + OFFSET,
         "function": "__x64_sys_bpf", "fields": {"__syscall_nr": 321, "ret": -22}}]
    assert "probes" not in session_json(tree_session(), TREE_FUNCS, OFFSET)


def test_perfetto_gets_an_instant_event_per_probe() -> None:
    events = [e for e in trace_events([_assembled()], TREE_FUNCS, 0) if e.get("cat") == "probe"]
    assert [(e["name"], e["ph"], e["s"], e["ts"], e["args"]["kind"]) for e in events] == [
        ("kprobe:map_create+0x1c", "i", "t", 2.5, "kprobe"), ("tp:syscalls:sys_exit_bpf", "i", "t", 3.5, "tp")]
    assert events[1]["args"]["ret"] == -22 and events[0]["tid"] == 42


def _spans(session, **kw):
    request = decode(build_request([encoder_for(**kw).encode(session, OFFSET)]))
    return {s.name: s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}


def test_otlp_span_events_go_on_the_innermost_open_call() -> None:
    spans = _spans(_assembled())
    (kp,) = spans["map_create"].events
    assert kp.name == "kprobe:map_create+0x1c" and kp.time_unix_nano == 2_500 + OFFSET
    attrs = {a.key: a.value for a in kp.attributes}
    assert attrs[PROBE_KIND].string_value == "kprobe" and "ip" not in attrs  # an address: not exported by default
    (tp,) = spans["__x64_sys_bpf"].events  # the root span stands for the entry call
    attrs = {a.key: a.value for a in tp.attributes}
    assert tp.name == "tp:syscalls:sys_exit_bpf" and attrs["ret"].int_value == -22
    assert attrs["__syscall_nr"].int_value == 321 and attrs[PROBE_KIND].string_value == "tp"
    assert not spans["security_bpf"].events
    with_addrs = _spans(_assembled(), export_addresses=True)
    (kp,) = with_addrs["map_create"].events
    assert {a.key: a.value.int_value for a in kp.attributes}["ip"] == 0xFFFFFFFF8100011C - (1 << 64)


def _three_on_the_root():
    """The assembled session with its tracepoint fired three times in the entry call."""
    s = _assembled()
    tp = s.probes[1]
    s.calls[0].probes[:] = [tp, tp, tp]
    s.probes[:] = [s.probes[0], tp, tp, tp]
    return s


@pytest.mark.parametrize("limit", [0, 1, 2, 3])
def test_the_span_event_count_limit_keeps_the_first_events_and_counts_the_rest(limit: int) -> None:
    """OTEL_SPAN_EVENT_COUNT_LIMIT: a span keeps its first `limit` events and says how many it lost in
    dropped_events_count (OTLP Span field 12); its attributes and the other spans are untouched."""
    full = _spans(_three_on_the_root())
    cut = _spans(_three_on_the_root(), event_limit=limit)
    assert len(full["__x64_sys_bpf"].events) == 3
    for name, span in cut.items():
        events = list(full[name].events)
        assert list(span.events) == events[:limit], name
        assert span.dropped_events_count == max(0, len(events) - limit), name
        assert list(span.attributes) == list(full[name].attributes) and span.dropped_attributes_count == 0
    assert cut["__x64_sys_bpf"].dropped_events_count == 3 - limit


def test_the_event_attribute_count_limit_keeps_the_first_attributes_of_each_event() -> None:
    """OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT: the probe's kind first, then its fields, counted in the event's own
    dropped_attributes_count."""
    (tp,) = _spans(_assembled(), event_attribute_limit=2)["__x64_sys_bpf"].events
    assert [a.key for a in tp.attributes] == [PROBE_KIND, "__syscall_nr"] and tp.dropped_attributes_count == 1
    (kp,) = _spans(_assembled(), event_attribute_limit=2)["map_create"].events  # one attribute: nothing to cut
    assert [a.key for a in kp.attributes] == [PROBE_KIND] and kp.dropped_attributes_count == 0
    (tp,) = _spans(_assembled(), event_attribute_limit=3)["__x64_sys_bpf"].events  # room for all three
    assert len(tp.attributes) == 3 and tp.dropped_attributes_count == 0


# ---- the attach module against a faked kernel ------------------------------------------------------

class _Sym:
    def __init__(self, size: int) -> None:
        self.size = size


def _by_name(name: str) -> list[_Sym]:
    return [_Sym(0x200)] if name == "map_create" else []


def test_resolve_checks_each_probe_against_the_kernel() -> None:
    from retsnoop_otel.capture.model import RetKind
    specs = [EXIT_BPF, InjectSpec("kprobe", "map_create", offset=0x1c), InjectSpec("kretprobe", "map_create")]
    infos = inject_attach.resolve(specs, TRACEFS, _by_name, lambda: None)
    assert [(p.id, p.spec, p.payload_size) for p in infos] == [(0, specs[0], 24), (1, specs[1], 0), (2, specs[2], 0)]
    assert infos[2].ret_int32  # no BTF: read as retsnoop reads an unknown type
    signed = inject_attach.resolve(specs[2:], TRACEFS, _by_name, lambda: None, lambda _n: RetKind.SIGNED)
    assert not signed[0].ret_int32
    with pytest.raises(InjectError, match="past the end of map_create .512 bytes.; give an offset inside"):
        inject_attach.resolve([InjectSpec("kprobe", "map_create", offset=0x200)], TRACEFS, _by_name, lambda: None)
    with pytest.raises(InjectError, match="no kernel function 'nosuch'"):
        inject_attach.resolve([InjectSpec("kretprobe", "nosuch")], TRACEFS, _by_name, lambda: None)
    with pytest.raises(InjectError, match="no raw tracepoint 'nosuch'"):
        inject_attach.resolve([InjectSpec("rawtp", "nosuch")], TRACEFS, _by_name, lambda: None)


def test_raw_tracepoint_arguments_come_from_the_btf_typedef() -> None:
    from retsnoop_otel.kernel.libbpf_btf import BtfType

    types = {1: BtfType(1, 8, "btf_trace_sys_exit", 2), 2: BtfType(2, 2, "", 3), 3: BtfType(3, 13, "", 0),
             4: BtfType(4, 2, "", 6), 5: BtfType(5, 1, "long", 8), 6: BtfType(6, 4, "pt_regs", 168)}

    class Btf:
        def find(self, name: str, kind: int) -> int | None:
            return 1 if name == "btf_trace_sys_exit" and kind == 8 else None

        def type_by_id(self, tid: int) -> BtfType:
            return types[tid]

        def param_types(self, proto: int) -> list[int]:
            assert proto == 3
            return [4, 4, 5]  # void *__data, struct pt_regs *regs, long ret

    infos = inject_attach.resolve([InjectSpec("rawtp", "sys_exit")], TRACEFS, _by_name, Btf)
    assert (infos[0].nargs, infos[0].arg_addresses, infos[0].payload_size) == (2, (True, False), 16)


def test_kernels_without_cookies_are_refused_with_what_to_do() -> None:
    inject_attach.check_kernel([EXIT_BPF, InjectSpec("rawtp", "x")], cookies=lambda _t: True)
    with pytest.raises(inject_attach.InjectUnsupported, match="Linux 5.15"):
        inject_attach.check_kernel([EXIT_BPF], cookies=lambda _t: False)
    with pytest.raises(inject_attach.InjectUnsupported, match="Linux 6.10.*tp:CATEGORY:NAME instead"):
        inject_attach.check_kernel([InjectSpec("rawtp", "x")], cookies=lambda t: t != lb.PROG_TYPE_RAW_TRACEPOINT)
    inject_attach.check_kernel([], cookies=lambda _t: False)  # no -J: nothing asked


class _Prog:
    def __init__(self, name: str, log: list, refuse: int = 0) -> None:
        self.name, self.log, self.refuse = name, log, refuse

    def set_autoload(self, on: bool) -> None:
        self.log.append(("autoload", self.name, on))

    def _link(self, what: tuple) -> _Link:
        if self.refuse:
            raise lb.LibbpfError(f"attach {what}", self.refuse)
        self.log.append(("attach", *what))
        return _Link(what, self.log)

    def attach_tracepoint(self, cat: str, name: str, cookie: int) -> _Link:
        return self._link(("tp", cat, name, cookie))

    def attach_raw_tracepoint_cookie(self, name: str, cookie: int) -> _Link:
        return self._link(("rawtp", name, cookie))

    def attach_kprobe(self, name: str, retprobe: bool, cookie: int, offset: int) -> _Link:
        return self._link(("kretprobe" if retprobe else "kprobe", name, offset, cookie))


class _Link:
    def __init__(self, what: tuple, log: list) -> None:
        self.what, self.log = what, log

    def destroy(self) -> None:
        self.log.append(("destroy", *self.what))


class _Map:
    def __init__(self, log: list) -> None:
        self.log = log

    def set_max_entries(self, n: int) -> None:
        self.log.append(("max_entries", n))

    def update(self, key: bytes, value: bytes) -> None:
        self.log.append(("info", struct.unpack("<I", key)[0], struct.unpack("<II", value)[0]))


class _Obj:
    def __init__(self, refuse: dict[str, int] | None = None) -> None:
        self.log: list = []
        self.progs = {n: _Prog(n, self.log, (refuse or {}).get(n, 0)) for n in inject_attach.PROGRAMS.values()}

    def program(self, name: str) -> _Prog:
        return self.progs[name]

    def map(self, name: str) -> _Map:
        assert name == "inject_infos"
        return _Map(self.log)


def test_only_the_programs_of_kinds_in_use_load_and_each_probe_gets_its_cookie() -> None:
    infos = inject_attach.resolve([EXIT_BPF, InjectSpec("kprobe", "map_create", offset=4)], TRACEFS, _by_name,
                                  lambda: None)
    obj = _Obj()
    inject_attach.configure(obj, infos)  # type: ignore[arg-type]
    inject_attach.fill(obj, infos)  # type: ignore[arg-type]
    links = inject_attach.attach(obj, infos)  # type: ignore[arg-type]
    assert obj.log == [("autoload", "inject_kprobe", True), ("autoload", "inject_kretprobe", False),
                       ("autoload", "inject_tp", True), ("autoload", "inject_rawtp", False), ("max_entries", 2),
                       ("info", 0, 24), ("info", 1, 0),
                       ("attach", "tp", "syscalls", "sys_exit_bpf", 0), ("attach", "kprobe", "map_create", 4, 1)]
    assert inject_attach.detach(links) == [] and obj.log[-1] == ("destroy", "tp", "syscalls", "sys_exit_bpf", 0)
    none = _Obj()
    inject_attach.configure(none, [])  # type: ignore[arg-type]
    assert ("max_entries", 1) in none.log and not any(e[0] == "autoload" and e[2] for e in none.log)


@pytest.mark.parametrize(("err", "says"), [(errno.EILSEQ, "not the start of an instruction"),
                                           (errno.ENOENT, "no probe point"), (errno.EINVAL, "not allowed there")])
def test_a_refused_kprobe_detaches_the_others_and_says_why(err: int, says: str) -> None:
    infos = inject_attach.resolve([EXIT_BPF, InjectSpec("kprobe", "map_create", offset=3)], TRACEFS, _by_name,
                                  lambda: None)
    obj = _Obj(refuse={"inject_kprobe": err})
    with pytest.raises(InjectError, match=says) as exc:
        inject_attach.attach(obj, infos)  # type: ignore[arg-type]
    assert "kprobe:map_create+0x3" in str(exc.value)
    assert obj.log == [("attach", "tp", "syscalls", "sys_exit_bpf", 0),
                       ("destroy", "tp", "syscalls", "sys_exit_bpf", 0)]


def test_dry_run_lists_the_probes() -> None:
    assert inject_attach.dry_run_lines([EXIT_BPF]) == ["Would inject 1 probes:", "    ◎ tp:syscalls:sys_exit_bpf"]
    assert inject_attach.dry_run_lines([]) == []


def test_probe_hits_render_pointer_fields_as_hex_and_strings_plainly() -> None:
    from retsnoop_otel.capture.inject import ProbeField
    hit = ProbeHit(0, "tp:x:y", "tp", 1, 0, 0, (ProbeField("p", 0x10, True), ProbeField("s", "a b"),
                                                  ProbeField("n", -1)))
    assert hit.text() == "p=0x10  s='a b'  n=-1"
    assert hit.text(addresses=False) == "s='a b'  n=-1"
    assert Call(0, 0, 0).probes == []


def test_the_agent_config_takes_the_same_specs_per_probe_set() -> None:
    from retsnoop_otel.agent.config_file import ConfigError, parse_config
    base = "probe_sets:\n  - name: bpf\n    entry: ['*sys_bpf']\n"
    cfg = parse_config(base + "    inject: ['tp:syscalls:sys_exit_bpf', 'kprobe:map_create+0x10']\n", "a.yaml")
    (ps,) = cfg.runtime.probe_sets
    assert ps.inject == (EXIT_BPF, InjectSpec("kprobe", "map_create", offset=0x10)) and ps.records_calls
    with pytest.raises(ConfigError, match=r"probe_sets\[0\].inject.*unknown probe kind 'uprobe'"):
        parse_config(base + "    inject: ['uprobe:x']\n", "a.yaml")
    with pytest.raises(ConfigError, match="use mode stack or calls"):
        parse_config(base + "    mode: metrics\n    inject: ['tp:syscalls:sys_exit_bpf']\n", "a.yaml")

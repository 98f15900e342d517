"""--lbr from kernel record to every sink: decoding, assembly, the text view and the span attributes."""

from __future__ import annotations

import errno
import io

import pytest

from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import Branch, LbrCapture, RetKind, StackEntry, TracedFunc
from retsnoop_otel.capture.records import SessionLbrRec
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.export.span_attributes import lbr_entries
from retsnoop_otel.export.span_encoder import build_request
from retsnoop_otel.render.console import session_text
from retsnoop_otel.render.lbr import render_session_lbr
from retsnoop_otel.trace.flags import parse
from tests.fakes import AMAC, AMAC_SIZE, LBR_RECORDS, OFFSET, TREE_FUNCS, symbolize, tree_session
from tests.oracle_spans import request_to_span_views
from tests.span_checks import assert_same, decode, encoded, encoder_for


def spans_of(session, **kw):
    return request_to_span_views(encoded(session, **kw))


E2BIG = (1 << 64) - 7


def _lbr_raw(tid: int, start_ts: int, ts: int, sz: int, func_id: int, depth: int,
             branches: list[tuple[int, int]]) -> bytes:
    entries = b"".join(records.LBR_ENTRY.pack(a, b, 0x1234) for a, b in branches)
    entries = entries.ljust(records.MAX_LBR_ENTRIES * records.LBR_ENTRY.size, b"\0")
    return (records.SESSION_LBR_HEAD.pack(records.REC_SESSION_LBR, tid, start_ts)
            + records.LBR_CAPTURE_HEAD.pack(ts, sz, func_id, depth) + entries)


def _end_raw(tid: int, start_ts: int, end_ts: int) -> bytes:
    m = records.MAX_FSTACK_DEPTH
    ids = [0, 1] + [0] * (m - 2)
    res = [-7, -7] + [0] * (m - 2)
    lat = [900, 100] + [0] * (m - 2)
    return records.SESSION_END.pack(records.REC_SESSION_END, tid, tid, 0, start_ts, end_ts, 0, 0, 0, 0, 1, 0, 2, 0, 0,
                                    b"simfail", b"simfail", b"simfail", *ids, *res, *lat,
                                    *([0] * records.MAX_KSTACK_DEPTH))


def test_decode_keeps_filled_entries_newest_first():
    pairs = [(b.src, b.dst) for b in LBR_RECORDS]
    rec = records.decode(_lbr_raw(7, 100, 500, len(pairs) * 24, 1, 1, pairs))
    assert rec == SessionLbrRec(7, 100, 500, 1, 1, 0, tuple(pairs))


def test_decode_helper_error():
    rec = records.decode(_lbr_raw(7, 100, 500, -errno.ENOENT, 1, 1, []))
    assert rec.error == errno.ENOENT and rec.branches == ()
    with pytest.raises(ValueError, match="short LBR record"):
        records.decode(_lbr_raw(7, 100, 500, 0, 1, 1, [])[:100])


def test_assembler_attaches_branches_to_their_session_only():
    asm = SessionAssembler()
    pairs = [(b.src, b.dst) for b in LBR_RECORDS]
    assert asm.feed(records.decode(_lbr_raw(7, 100, 500, len(pairs) * 24, 1, 1, pairs))) is None
    s = asm.feed(records.decode(_end_raw(7, 100, 1000)))
    assert s.lbr == LbrCapture(1, 1, 500, tuple(LBR_RECORDS), 0)
    # a stale capture (another session of the same thread) is not attached to a later session
    asm.feed(records.decode(_lbr_raw(7, 50, 60, 0, 1, 1, [])))
    assert asm.feed(records.decode(_end_raw(7, 100, 1000))).lbr is None


def _amac_funcs() -> dict[int, TracedFunc]:
    return {0: TracedFunc(0, "__x64_sys_bpf", 0xffffffff8120f6e0, RetKind.SIGNED, True),
            1: TracedFunc(1, "array_map_alloc_check", AMAC, RetKind.INT32, False, size=AMAC_SIZE)}


def test_session_block_is_the_relevant_records(lbr_sym):
    s = tree_session(lbr=LbrCapture(1, 1, 500, tuple(LBR_RECORDS)))
    text = render_session_lbr(s, _amac_funcs(), lbr_sym)
    assert text.splitlines()[0].startswith("[#05] _copy_from_user+0x2f")
    assert text.splitlines()[-1].startswith("[#02] array_map_alloc_check+0x74")
    assert len(render_session_lbr(s, _amac_funcs(), lbr_sym, max_count=1).splitlines()) == 1


def test_session_block_says_why_nothing_was_captured(lbr_sym):
    s = tree_session(lbr=LbrCapture(1, 1, 500, (), errno.ENOENT))
    assert render_session_lbr(s, _amac_funcs(), lbr_sym) == \
        "[LBR] failed to capture branch records: -ENOENT (this CPU keeps no last branch records)\n"
    assert render_session_lbr(tree_session(), _amac_funcs(), lbr_sym) == ""


def test_exported_strings_hide_addresses_unless_asked(lbr_sym):
    cap = LbrCapture(1, 1, 500, tuple(LBR_RECORDS))
    func = _amac_funcs()[1]
    got = lbr_entries(cap, func, lbr_sym.describe, export_addresses=False)
    assert got[0] == "_copy_from_user+0x2f -> __sys_bpf+0xcc"
    assert got[-1] == "array_map_alloc_check+0x74 -> [unknown]"  # the trampoline has no symbol
    assert lbr_entries(cap, func, None, export_addresses=False) == []
    with_addrs = lbr_entries(cap, func, lbr_sym.describe, export_addresses=True)
    assert with_addrs[-1] == f"0x{AMAC + 0x74:x} array_map_alloc_check+0x74 -> 0xffffffff80f00000"


def _map_create_lbr(**kw) -> LbrCapture:
    # tree_session's map_create call: depth 1, exit at 8_000
    return LbrCapture(1, 1, 8_000, (Branch(0xFFFFFFFF81000110, 0xFFFFFFFF81000120),), **kw)


def test_span_of_the_capturing_call_carries_the_records():
    spans = spans_of(tree_session(lbr=_map_create_lbr()), symbolize=symbolize)
    lbr = {s.name: s.attributes.get("retsnoop.lbr") for s in spans}
    assert list(lbr.pop("map_create")) == ["sym_110+0x5 -> sym_120+0x5"]
    assert set(lbr.values()) == {None}


def test_lbr_error_and_root_capture():
    spans = spans_of(tree_session(lbr=_map_create_lbr(error=errno.ENOENT)), symbolize=symbolize)
    assert {s.name: s.attributes.get("retsnoop.lbr_error") for s in spans}["map_create"] == "ENOENT"
    root_cap = LbrCapture(0, 0, 9_000, (Branch(1, 2),))
    spans = spans_of(tree_session(lbr=root_cap), symbolize=symbolize)
    assert list(spans[0].attributes["retsnoop.lbr"]) == ["sym_1+0x5 -> sym_2+0x5"]


def test_chain_only_session_puts_records_on_the_chain_level():
    s = tree_session(calls=[], lbr=_map_create_lbr())
    spans = spans_of(s, symbolize=symbolize)
    assert [sp.name for sp in spans if "retsnoop.lbr" in sp.attributes] == ["map_create"]


@pytest.mark.parametrize("calls", [True, False])
@pytest.mark.parametrize("cap", [_map_create_lbr(), _map_create_lbr(error=errno.ENOENT),
                                 LbrCapture(0, 0, 9_000, (Branch(1, 2),))])
def test_fast_encoder_matches_the_sdk_path(cap, calls):
    s = tree_session(lbr=cap, **({} if calls else {"calls": []}))
    assert_same(s, symbolize=symbolize)


def test_capture_that_matches_no_call_is_not_exported():
    s = tree_session(lbr=LbrCapture(1, 1, 7_777, (Branch(1, 2),)))
    spans = spans_of(s, symbolize=symbolize)
    assert not any("retsnoop.lbr" in sp.attributes for sp in spans)
    body = build_request([encoder_for(TREE_FUNCS, symbolize=symbolize).encode(s, OFFSET)])
    assert b"retsnoop.lbr" not in body
    assert decode(body).resource_spans


def test_trace_text_puts_lbr_between_header_and_stack(lbr_sym):
    funcs = _amac_funcs()
    s = tree_session(calls=[], chain=[StackEntry(0, E2BIG, 8_000), StackEntry(1, E2BIG, 100)], kstack=[],
                     lbr=LbrCapture(1, 1, 500, tuple(LBR_RECORDS)))
    for argv, after in ((["-e", "*sys_bpf", "--lbr"], "stack"), (["-e", "*sys_bpf", "--lbr", "-T", "-E"], "table")):
        console = parse(argv, environ={}).config.exporter.console
        text = session_text(s, funcs, lbr_sym, 0, calls_view=console.view == "calls", call_stack=console.call_stack)
        out = io.StringIO(text)
        lines = out.getvalue().splitlines()
        assert "TID/PID 42/40" in lines[0] and lines[1] == ""
        first = next(i for i, line in enumerate(lines) if line.startswith("[#"))
        last = max(i for i, line in enumerate(lines) if line.startswith("[#"))
        assert lines[first].startswith("[#05] _copy_from_user+0x2f") and last - first == 3
        stack_row = next(i for i, line in enumerate(lines) if "[-E2BIG]" in line and "array_map_alloc_check" in line
                         and not line.startswith("[#"))
        assert stack_row > last, out.getvalue()  # retsnoop's order: table, LBR, stack
        if after == "table":
            assert any("FUNCTION CALLS" in line for line in lines[:first])

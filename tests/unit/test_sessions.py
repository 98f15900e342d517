"""Session assembly from recorded record streams: nesting, lost records, replaced sessions."""

from __future__ import annotations

from retsnoop_otel.capture import records
from retsnoop_otel.capture.records import FuncTraceRec, SessionEndRec, SessionStartRec
from retsnoop_otel.capture.sessions import SessionAssembler

M = records.MAX_FSTACK_DEPTH


def start(tid=1, ts=100):
    return SessionStartRec(tid, tid, 0, ts, "simfail", "simfail")


def ent(seq, depth, fid, ts, tid=1):
    return FuncTraceRec(False, tid, ts, seq, depth, fid, 0, 0)


def ext(seq, depth, fid, ts, lat, res, tid=1):
    return FuncTraceRec(True, tid, ts, seq, depth, fid, lat, res)


def end(last_seq, tid=1, ts=100, dropped=0, chain=((0, -22, 50),), top=0):
    ids = [c[0] for c in chain] + [0] * (M - len(chain))
    res = [c[1] for c in chain] + [0] * (M - len(chain))
    lat = [c[2] for c in chain] + [0] * (M - len(chain))
    return SessionEndRec(tid, tid, 0, ts, ts + 60, 0, last_seq, dropped, True, len(chain), top, 0, "simfail",
                         "simfail", tuple(ids), tuple(res), tuple(lat), ())


def feed(asm, recs):
    out = [asm.feed(r) for r in recs]
    return [s for s in out if s is not None]


def test_nested_calls_and_chain():
    asm = SessionAssembler()
    (s,) = feed(asm, [start(), ent(0, 0, 0, 100), ent(1, 1, 1, 110), ext(2, 1, 1, 120, 10, -22),
                      ent(3, 1, 2, 125), ext(4, 1, 2, 130, 5, 0), ext(5, 0, 0, 160, 60, -22),
                      end(6, chain=((0, -22, 60), (1, -22, 10)))])
    (root,) = s.calls
    assert [c.func_id for c in root.children] == [1, 2]
    assert root.duration_ns == 60 and root.result == (1 << 64) - 22
    assert [e.func_id for e in s.chain] == [0, 1] and s.chain[1].latency_ns == 10
    assert s.dropped_records == 0


def test_gap_marks_the_next_call_and_counts():
    asm = SessionAssembler()
    # seq 1..2 lost (the entry and exit of one call)
    (s,) = feed(asm, [start(), ent(0, 0, 0, 100), ent(3, 1, 2, 125), ext(4, 1, 2, 130, 5, 0),
                      ext(5, 0, 0, 160, 60, 0), end(6)])
    (root,) = s.calls
    assert root.children[0].missing_before == 2
    assert s.dropped_records == 2


def test_lost_entry_is_rebuilt_from_exit_latency():
    asm = SessionAssembler()
    (s,) = feed(asm, [start(), ent(0, 0, 0, 100), ext(2, 1, 1, 120, 15, -12), ext(3, 0, 0, 160, 60, -12),
                      end(4)])
    child = s.calls[0].children[0]
    assert child.start_ns == 105 and child.end_ns == 120 and child.missing_before == 1


def test_records_lost_at_the_end_are_counted():
    asm = SessionAssembler()
    (s,) = feed(asm, [start(), ent(0, 0, 0, 100), end(5)])
    assert s.dropped_records == 4
    assert s.calls[0].end_ns is None


def test_unreported_session_is_replaced_and_threads_do_not_mix():
    asm = SessionAssembler()
    recs = [start(1, 10), ent(0, 0, 0, 10, tid=1), start(2, 20), ent(0, 0, 0, 20, tid=2),
            start(1, 30), ent(0, 0, 0, 30, tid=1), ext(1, 0, 0, 40, 10, 0, tid=1),
            ext(1, 0, 0, 50, 30, -1, tid=2), end(2, tid=2, ts=20), end(2, tid=1, ts=30)]
    s2, s1 = feed(asm, recs)
    assert (s2.tid, s2.calls[0].start_ns) == (2, 20)
    assert (s1.tid, s1.calls[0].start_ns, s1.calls[0].end_ns) == (1, 30, 40)


def test_open_sessions_are_bounded():
    asm = SessionAssembler(max_open=2)
    for tid in range(5):
        asm.feed(start(tid))
    assert asm.evicted == 3


def test_stack_mode_session_without_call_records():
    asm = SessionAssembler()
    (s,) = feed(asm, [end(0, chain=((0, -22, 60), (1, -22, 10), (2, 0, 0)), top=1)])
    assert s.calls == []
    assert [e.latency_ns for e in s.chain] == [None, 10, 0]


def test_calls_beyond_the_cap_are_counted_and_kept_calls_still_close():
    """root -> 5 leaf calls with a cap of 3 calls: root + 2 leaves kept, 3 leaves cut, root's exit applied."""
    from retsnoop_otel.capture.model import Session
    from retsnoop_otel.render.calls import render_calls

    recs, seq = [start(), ent(0, 0, 0, 100)], 1
    for i in range(5):
        recs += [ent(seq, 1, 1, 110 + 10 * i), ext(seq + 1, 1, 1, 115 + 10 * i, 5, 0)]
        seq += 2
    recs += [ext(seq, 0, 0, 170, 70, -22), end(seq + 1)]
    (s,) = feed(SessionAssembler(max_calls=3), recs)
    (root,) = s.calls
    assert len(root.children) == 2 and all(c.end_ns is not None for c in root.children)
    assert root.end_ns == 170 and root.result == (1 << 64) - 22  # the kept root still gets its exit
    assert s.calls_cut == 3 and s.dropped_records == 0
    (full,) = feed(SessionAssembler(), recs)
    assert len(full.calls[0].children) == 5 and full.calls_cut == 0
    table = render_calls(s, {0: _func(0, "root"), 1: _func(1, "leaf")})
    assert "‼ ... 3 more calls not shown (per-session cap) ..." in table
    assert isinstance(s, Session)


def _func(fid, name):
    from retsnoop_otel.capture.model import RetKind, TracedFunc
    return TracedFunc(fid, name, 0, RetKind.INT32, fid == 0)


def test_application_context_and_user_stack_join_their_own_session():
    """Side records are matched by thread and session start; a stale one (an earlier, unreported session)
    is not attached to the next session of the thread."""
    trace_id, span_id = (0xAB).to_bytes(16, "big"), (0xCD).to_bytes(8, "big")
    app = records.SessionAppRec(1, 100, records.APP_OK, 0, trace_id, span_id, 1, 1, 3, b"\0\1x")
    stale = records.SessionUstackRec(1, 50, 0, (0x1,))
    other = records.SessionAppRec(2, 100, records.APP_INVALID, 0, b"", b"", 0, 0, 0, b"")
    (s,) = feed(asm := SessionAssembler(), [start(), stale, other, app, records.AppProbeRec(9), end(0)])
    assert s.app is not None
    assert (s.app.status, s.app.trace_id, s.app.span_id, s.app.sampled) == ("ok", 0xAB, 0xCD, True)
    assert s.app.attrs == b"\0\1x" and not s.app.attrs_cut and s.ustack is None
    ustack = records.SessionUstackRec(2, 100, 0, (0x401000, 0x402000))
    (s2,) = feed(asm, [start(tid=2), ustack, end(0, tid=2)])
    assert s2.app is not None and s2.app.status == "invalid" and not s2.app.usable
    assert s2.ustack == (0x401000, 0x402000)
    fault = records.SessionAppRec(3, 100, records.APP_FAULT, 14, b"", b"", 0, 0, 0, b"")
    failed = records.SessionUstackRec(3, 100, 14, ())
    (s3,) = feed(asm, [start(tid=3), fault, failed, end(0, tid=3)])
    assert (s3.app.status, s3.app.error, s3.ustack, s3.ustack_error) == ("fault", 14, None, 14)
    cut = records.SessionAppRec(4, 100, records.APP_OK, 0, trace_id, span_id, 1, 0, 9000, b"y" * 612)
    (s4,) = feed(asm, [start(tid=4), cut, end(0, tid=4)])
    assert s4.app.attrs_cut and not s4.app.sampled


def test_the_kernel_named_executable_reaches_the_session():
    """The kernel reads the exe name as the session ends: a process gone before user space looks at
    /proc/PID/exe still gets its full name, not the 15-character comm."""
    asm = SessionAssembler()
    (s,) = feed(asm, [start(), ent(0, 0, 0, 100), ext(1, 0, 0, 160, 60, -22),
                      end(2)._replace(exe="simfail-long-executable")])
    assert s.exe_name == "simfail-long-executable" and s.proc_comm == "simfail"

"""`trace --origins-interval SECONDS` (issue 46 point 3): each interval's table of error origins from the growth of
the kernel's cumulative counts, a quiet interval in one line, the last interval at stop, the run's table after it."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections.abc import Iterator
from itertools import pairwise

import pytest

from retsnoop_otel.capture.model import OriginCount, RetKind, TracedFunc
from retsnoop_otel.render.origin_table import Span, counts_since, origin_table, origin_totals, rows_of
from retsnoop_otel.trace.main import run_trace
from retsnoop_otel.trace.origin_intervals import OriginIntervals
from tests.fakes import Clock, FakeTracer, World, error_session

FUNCS = [TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
         TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False),
         TracedFunc(2, "htab_map_alloc_check", 0, RetKind.INT32, False)]
# Reads of the kernel's origin map during a run of tests/vm/scenarios/kernel_origins.py's workload (bpf() failing in
# array_map_alloc_check, then in htab_map_alloc_check): cumulative, an entry appearing when its origin first fails.
READS = [[],
         [OriginCount(0, 1, "EINVAL", 3)],
         [OriginCount(0, 1, "EINVAL", 7), OriginCount(0, 2, "EINVAL", 2)],
         [OriginCount(0, 1, "EINVAL", 7), OriginCount(0, 2, "EINVAL", 2)],
         [OriginCount(0, 1, "EINVAL", 7), OriginCount(0, 2, "EINVAL", 5)]]
WALL0 = 1_765_000_000_000_000_000  # 2025-12-06 05:46:40 UTC


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC, for the headers' HH:MM:SS."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_an_interval_is_what_the_counts_grew_by() -> None:
    before, now = origin_totals([(FUNCS, READS[1])]), origin_totals([(FUNCS, READS[2])])
    assert counts_since(now, before) == {("__x64_sys_bpf", "array_map_alloc_check", "EINVAL"): 4,
                                         ("__x64_sys_bpf", "htab_map_alloc_check", "EINVAL"): 2}
    assert counts_since(now, now) == {}
    assert counts_since(before, now) == {}  # a count never goes down; if one did, it is not shown negative


def test_the_intervals_add_up_to_the_run() -> None:
    totals = [origin_totals([(FUNCS, r)]) for r in READS]
    summed: dict = {}
    for before, now in pairwise(totals):
        for key, n in counts_since(now, before).items():
            summed[key] = summed.get(key, 0) + n
    assert summed == totals[-1]


def test_an_interval_table_names_its_span_and_shares_within_it(utc: None) -> None:
    rows = rows_of(counts_since(origin_totals([(FUNCS, READS[2])]), origin_totals([(FUNCS, READS[1])])))
    span = Span(WALL0, WALL0 + 5_000_000_000)
    assert origin_table(rows, span) == (
        "ERROR ORIGINS 05:46:40.000000 -> 05:46:45.000000 (5.0 s, 6 failing sessions, counted in the kernel):\n"
        "COUNT  ERRNO   ORIGIN                 ENTRY          SHARE\n"
        "    4  EINVAL  array_map_alloc_check  __x64_sys_bpf  66.7%\n"
        "    2  EINVAL  htab_map_alloc_check   __x64_sys_bpf  33.3%\n")
    assert origin_table([], span) == "ERROR ORIGINS 05:46:40.000000 -> 05:46:45.000000 (5.0 s): no failing sessions\n"
    assert origin_table([]) == ""  # the run's table: nothing when nothing failed, as before


def _intervals(as_json: bool, every: float = 5.0) -> tuple[OriginIntervals, Clock, io.StringIO, list]:
    clock, out, reads = Clock(100.0), io.StringIO(), list(READS)
    iv = OriginIntervals(every, lambda: [(FUNCS, reads.pop(0))], out, as_json, clock, lambda: WALL0)
    return iv, clock, out, reads


def test_each_due_interval_prints_one_json_object_and_the_stop_the_rest() -> None:
    iv, clock, out, reads = _intervals(as_json=True)
    for step in (4.9, 0.1, 5.0, 5.0, 5.0, 5.0):  # the first is not due yet: no read, nothing printed
        clock.t += step
        iv.tick()
    clock.t += 2.5
    iv.stop([(FUNCS, [OriginCount(0, 1, "EINVAL", 8), OriginCount(0, 2, "EINVAL", 5)])])
    objs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert reads == []
    assert [(o["seconds"], o["end_ns"] - o["start_ns"]) for o in objs] == [(5.0, 5_000_000_000)] * 5 + \
        [(2.5, 2_500_000_000)]
    assert [o["start_ns"] for o in objs[1:]] == [o["end_ns"] for o in objs[:-1]]  # back to back from the start
    assert objs[0] == {"start_ns": WALL0, "end_ns": WALL0 + 5_000_000_000, "seconds": 5.0, "origins": []}
    assert [[(r["origin"], r["count"], r["share"]) for r in o["origins"]] for o in objs[1:]] == [
        [("array_map_alloc_check", 3, 1.0)],
        [("array_map_alloc_check", 4, 0.666667), ("htab_map_alloc_check", 2, 0.333333)],
        [],
        [("htab_map_alloc_check", 3, 1.0)],
        [("array_map_alloc_check", 1, 1.0)]]


def test_text_intervals_print_a_quiet_one_in_a_line_and_the_stop_under_done(utc: None) -> None:
    """Among the sessions a table is a block followed by a blank line, as a session is; at stop it comes after a
    blank line, as the run's table does."""
    iv, clock, out, _reads = _intervals(as_json=False)
    for _ in range(2):
        clock.t += 5.0
        iv.tick()
    clock.t += 1.0
    iv.stop([(FUNCS, [OriginCount(0, 1, "EINVAL", 3), OriginCount(0, 2, "E2BIG", 1)])])
    assert out.getvalue() == (
        "ERROR ORIGINS 05:46:40.000000 -> 05:46:45.000000 (5.0 s): no failing sessions\n\n"
        "ERROR ORIGINS 05:46:45.000000 -> 05:46:50.000000 (5.0 s, 3 failing sessions, counted in the kernel):\n"
        "COUNT  ERRNO   ORIGIN                 ENTRY           SHARE\n"
        "    3  EINVAL  array_map_alloc_check  __x64_sys_bpf  100.0%\n\n"
        "\nERROR ORIGINS 05:46:50.000000 -> 05:46:51.000000 (1.0 s, 1 failing session, counted in the kernel):\n"
        "COUNT  ERRNO  ORIGIN                ENTRY           SHARE\n"
        "    1  E2BIG  htab_map_alloc_check  __x64_sys_bpf  100.0%\n")


def test_late_polls_do_not_drift_the_intervals_and_a_stall_skips_ahead() -> None:
    iv, clock, out, _reads = _intervals(as_json=True, every=1.0)
    for step in (1.3, 0.8, 3.5, 0.9, 0.2):  # due at 101, 102; then the stall: 105.6, next due 106.6
        clock.t += step
        iv.tick()
    ends = [round((json.loads(line)["end_ns"] - WALL0) / 1e9, 3) for line in out.getvalue().splitlines()]
    assert ends == [1.3, 2.1, 5.6, 6.7]


def _trace(argv: list[str], world: World, polls: int, per_poll_s: float) -> str:
    """run_trace with a clock that moves `per_poll_s` at each poll of the loop; the tracer stops itself (SIGTERM, as
    a user) at its `polls`th poll. The kernel's counts: READS, one more at each interval (the last one from then on)."""
    out, clock = io.StringIO(), Clock(100.0)
    deps = world.deps(console=out)
    deps.monotonic = clock
    reads = list(READS)
    done = {"polls": 0}
    real_poll = FakeTracer.poll

    def poll(self: FakeTracer, timeout_ms: int, wake_fd: int | None = None) -> int:
        if timeout_ms == 0:  # the drain after detaching
            return real_poll(self, timeout_ms)
        done["polls"] += 1
        clock.t += per_poll_s
        if done["polls"] == 2:
            self.pending += error_session(self)  # a session printed in the same poll as an interval's table
        if done["polls"] == polls:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_poll(self, timeout_ms)

    def origin_counts(self: FakeTracer) -> list[OriginCount]:
        read = reads.pop(0) if len(reads) > 1 else reads[0]
        return [OriginCount(self.fid(FAKE_NAMES[c.entry_func_id]), self.fid(FAKE_NAMES[c.origin_func_id]), c.error,
                            c.count) for c in read]

    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(FakeTracer, "poll", poll)
            mp.setattr(FakeTracer, "origin_counts", origin_counts)
            assert run_trace(argv, out, io.StringIO(), deps) == 0
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return out.getvalue()


FAKE_NAMES = ["__x64_sys_bpf", "array_map_alloc_check", "bpf_check"]  # FUNCS' in the fake kernel (tests/fakes.py)
ARGS = ["-e", "__x64_sys_bpf", "-a", "array_map_alloc_check", "-a", "bpf_check"]


def test_trace_json_prints_an_object_per_interval_then_the_run(world: World) -> None:
    out = _trace([*ARGS, "--json", "--origins-interval", "2"], world, polls=9, per_poll_s=1.0)
    objs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    sessions = [o for o in objs if "origins" not in o]
    intervals = [o for o in objs if "start_ns" in o and "origins" in o]
    assert len(sessions) == 1 and objs.index(sessions[0]) == 0, out  # the session came before the first table
    assert objs[-1] == {"origins": [
        {"count": 7, "error": "EINVAL", "origin": "array_map_alloc_check", "entry": "__x64_sys_bpf", "share": 0.583333},
        {"count": 5, "error": "EINVAL", "origin": "bpf_check", "entry": "__x64_sys_bpf", "share": 0.416667}]}
    assert [o["seconds"] for o in intervals] == [2.0, 2.0, 2.0, 2.0, 1.0], out  # the last one ends at the stop
    summed: dict = {}
    for o in intervals:
        for r in o["origins"]:
            summed[r["origin"]] = summed.get(r["origin"], 0) + r["count"]
    assert summed == {r["origin"]: r["count"] for r in objs[-1]["origins"]}


def test_trace_text_prints_the_tables_between_sessions_then_the_run(world: World) -> None:
    out = _trace([*ARGS, "--origins-interval", "2"], world, polls=3, per_poll_s=1.0)
    receiving, done = out.index("Receiving data...\n"), out.index("Detaching... DONE in")
    between = out[receiving:done]
    assert between.count("ERROR ORIGINS") == 1, out  # due at the 2nd poll, after that poll's session
    assert between.index("!    1us [-EINVAL]  array_map_alloc_check") < between.index("ERROR ORIGINS"), out
    assert "(2.0 s): no failing sessions\n" in between, out
    tail = out[done:]
    assert "(1.0 s, 3 failing sessions, counted in the kernel):" in tail, out
    assert tail.endswith("ERROR ORIGINS (3 failing sessions, counted in the kernel):\n"
                         "COUNT  ERRNO   ORIGIN                 ENTRY           SHARE\n"
                         "    3  EINVAL  array_map_alloc_check  __x64_sys_bpf  100.0%\n"), out


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "1e9", "86401", "0.01", "5s", ""])
def test_bad_intervals_are_refused_in_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run_trace([*ARGS, "--origins-interval", value], io.StringIO(), io.StringIO(), World().deps())
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--origins-interval" in err and "seconds" in err, err

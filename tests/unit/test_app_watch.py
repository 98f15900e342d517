"""The application watcher against scripted process readers and fake BPF maps: probes answered, rechecks
backed off, exited processes forgotten, sessions annotated and counted."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest

from retsnoop_otel.appctx.process_readers import AppSources
from retsnoop_otel.appctx.thread_ctx import TlsLocation
from retsnoop_otel.appctx.watch import RECHECK_FIRST_S, SWEEP_S, AppWatcher
from retsnoop_otel.capture.model import AppContext, UserFrame
from retsnoop_otel.command.logs import EventLog
from tests.fakes import Clock, tree_session


class FakeMap:
    def __init__(self) -> None:
        self.entries: dict[int, tuple] = {}
        self.forgotten: list[int] = []

    def set_app_target(self, tgid, tp_offset=0, offset=0, modid=0, publishes=True):
        self.entries[tgid] = (tp_offset, offset, modid, publishes)

    def forget_app_target(self, tgid):
        self.entries.pop(tgid, None)
        self.forgotten.append(tgid)


LOC = TlsLocation(0, -8, 0, "/srv/app", "executable")
CTX = SimpleNamespace(attributes={"service.name": "shop", "service.namespace": "retail",
                                  "service.instance.id": "627cc493-f310-47de-96bd-71410b7dec09",
                                  "service.version": 3},  # not a string: not read as one
                      key_map=("http.route",))


def watcher(tmp_path, publishing=(), alive=(), symbolizer=None, errors=None):
    for pid in alive:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
    located: list[int] = []

    def locate(pid, _deadline=None):
        located.append(pid)
        if errors and pid in errors:
            raise OSError(errors[pid])
        return LOC if pid in publishing else None

    sources = AppSources(locate, lambda pid: CTX if pid in publishing else None,
                         lambda data, keys: {keys[0]: data.decode()}, symbolizer)
    clock = Clock(100.0)
    w = AppWatcher(sources, clock, EventLog(level="error"), str(tmp_path), start_worker=False)
    maps = [FakeMap(), FakeMap()]
    w.set_targets(maps)
    return w, maps, clock, located


def test_probe_answers_reach_every_probe_set(tmp_path):
    w, maps, _, located = watcher(tmp_path, publishing={10}, alive={10, 11})
    w.asked(10)
    w.asked(11)
    w.asked(10)  # several probe sets asked about the same process: checked once
    w.service()
    assert located == [10, 11]
    for m in maps:
        assert m.entries == {10: (-8, 0, 0, True), 11: (0, 0, 0, False)}
    assert (w.counters.processes_checked, w.counters.processes_publishing) == (2, 1)
    # a probe set created by a reload gets every known answer
    new = FakeMap()
    w.set_targets([new])
    assert new.entries == maps[0].entries


def test_a_probe_can_be_answered_before_the_records_that_follow_it(tmp_path):
    """The runtime answers at once: the probe's own session end (and its user stack) comes after it."""
    w, maps, _, located = watcher(tmp_path, publishing={10}, alive={10})
    w.asked(10, answer=True)
    assert located == [10] and maps[0].entries == {10: (-8, 0, 0, True)}
    w.asked(10, answer=True)  # another probe set's probe: the answer is pushed again, not looked up again
    assert located == [10]


def test_non_publishers_are_rechecked_with_back_off_and_exited_processes_forgotten(tmp_path):
    w, maps, clock, located = watcher(tmp_path, alive={11})
    w.asked(11)
    w.service()
    clock.t += max(RECHECK_FIRST_S, SWEEP_S) + 0.01
    w.service()  # the sweep withdraws the answer: the next session asks again
    assert 11 not in maps[0].entries and maps[0].forgotten == [11]
    w.asked(11)
    w.service()
    assert located == [11, 11] and maps[0].entries[11][3] is False
    assert w._known[11].recheck_at - clock.t == 2 * RECHECK_FIRST_S  # the back-off doubled
    (tmp_path / "11").rmdir()
    clock.t += 5
    w.service()
    assert 11 not in maps[0].entries and w._known == {}


def test_sessions_are_annotated_and_counted(tmp_path):
    frames = [UserFrame(0x401000, "main", 0x10, "/bin/app")]
    sym = SimpleNamespace(remember=lambda pid: None, frames=lambda pid, addrs: frames, close=lambda: None)
    w, _, _, _ = watcher(tmp_path, publishing={40}, alive={40}, symbolizer=sym)
    early = w.annotate(tree_session())  # before the process was located: not counted, nothing known
    assert early.app is None and w.counters.sessions["unknown_process"] == 0
    w.asked(40)
    w.service()
    late = w.annotate(tree_session())  # located, but this session started before: it was not read
    assert w.counters.sessions["unknown_process"] == 1 and late.app is None
    w.annotate(tree_session(), reads_app=False)  # a probe set that only takes user stacks misses no context
    assert w.counters.sessions["unknown_process"] == 1
    app = AppContext("ok", 0xAB, 0xCD, 1, b"/users")
    s = w.annotate(tree_session(app=app, ustack=(0x401010,)))
    assert s.app.attributes == (("http.route", "/users"),) and s.app.service_name == "shop"
    # the rest of the application's identity, for its service.namespace and service.instance.id on our spans
    assert (s.app.service_namespace, s.app.service_instance_id) == ("retail", "627cc493-f310-47de-96bd-71410b7dec09")
    assert s.user_frames == ()  # symbolized off the loop, once held (tests/unit/test_user_stack_queue.py)
    w.annotate(tree_session(app=AppContext("ok", 0xAB, 0xCD, 0)))
    w.annotate(tree_session(app=AppContext("fault", error=14)))
    assert {k: v for k, v in w.counters.sessions.items() if v} == {"linked": 1, "ok": 1, "fault": 1,
                                                                     "unknown_process": 1}


def test_unreadable_processes_are_counted_and_logged_a_few_times(tmp_path):
    w, maps, _, _ = watcher(tmp_path, alive=set(range(20)), errors={i: "Permission denied" for i in range(20)})
    w.log = EventLog(io.StringIO(), level="warning")
    for pid in range(20):
        w.asked(pid)
    w.service()
    assert w.counters.check_errors == 20 and len(maps[0].entries) == 20
    assert w.log._stream.getvalue().count("not located") == 5


def test_processes_running_at_start_are_checked_after_the_probes(tmp_path, monkeypatch):
    from retsnoop_otel.appctx import watch as app_watch
    monkeypatch.setattr(app_watch, "MAX_CHECKS_PER_SERVICE", 2)
    for pid in (5, 6, 7):
        (tmp_path / str(pid)).mkdir()
    w, maps, _, located = watcher(tmp_path, publishing={6})
    w.asked(99)
    w.service()
    assert located[0] == 99 and len(located) == 2  # the probe first, then one of the running processes
    w.service()
    w.service()
    assert sorted(located) == [5, 6, 7, 99] and maps[0].entries[6] == (-8, 0, 0, True)


def test_the_proc_readers_import_their_modules_at_their_first_call() -> None:
    """appctx.process_context and appctx.thread_ctx (0.24 s of an emulated start) load only once a process is
    read: a run whose sessions come from no publishing process never imports them."""
    code = ("import os, sys\nfrom retsnoop_otel.appctx.process_readers import AppSources\n"
            "mods = ('retsnoop_otel.appctx.process_context', 'retsnoop_otel.appctx.thread_ctx')\n"
            "sources = AppSources.from_proc('/proc', False)\nprint([m in sys.modules for m in mods])\n"
            "print(sources.read_context(os.getpid()), [m in sys.modules for m in mods])\n"
            "sources.locate(os.getpid())\nprint([m in sys.modules for m in mods])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[False, False]", "None [True, False]", "[True, True]"]


def test_the_config_decides_whether_and_what_the_watcher_reads(tmp_path):
    def ps(app_context=False, user_stacks=False, mode="errors", attach_mode="auto"):
        return SimpleNamespace(app_context=app_context, user_stacks=user_stacks, mode=mode, attach_mode=attach_mode)

    made: list[tuple] = []

    def sources(proc_root, stacks, lines):
        made.append((proc_root, stacks, lines))
        return AppSources(lambda pid, _deadline=None: None, lambda pid: None, lambda data, keys: {})

    log = EventLog(level="error")
    # a metrics-only set reports no session: nothing to watch
    clock = Clock(100.0)
    assert AppWatcher.for_config([ps(True, True, "metrics"), ps()], str(tmp_path), True, sources, clock, log) is None
    # nor a set counted from the returns alone (--origins-only): it has no sessions
    assert AppWatcher.for_config([ps(True, attach_mode="origin_exits")], str(tmp_path), True, sources, clock,
                                 log) is None
    assert made == []
    w = AppWatcher.for_config([ps(user_stacks=True), ps(app_context=True, mode="metrics")], str(tmp_path), False,
                              sources, Clock(100.0), log)
    assert w is not None and not w.read_app and made == [(str(tmp_path), True, False)]
    w = AppWatcher.for_config([ps(app_context=True)], str(tmp_path), True, sources, Clock(100.0), log)
    assert w is not None and w.read_app and made[-1] == (str(tmp_path), False, True)


# ---- processes born after the start: watched from their exec -------------------------------------------------

def exec_watcher(tmp_path, pids, cost=0.0, where=None):
    """A watcher whose locate() records when it ran: each pid publishes once it is in `loaded` (its libraries
    loaded); a pid whose folder is gone has exited. `cost`: seconds each check takes on the fake clock.
    `where`: pid -> the location its checks find (default LOC)."""
    for pid in pids:
        (tmp_path / str(pid)).mkdir()
    clock = Clock(100.0)
    loaded: set[int] = set()
    checks: list[tuple[int, float]] = []

    def locate(pid, _deadline=None):
        checks.append((pid, clock.t))
        clock.t += cost
        if not (tmp_path / str(pid)).exists():
            raise OSError(f"pid {pid}: the process has exited")
        return (where or {}).get(pid, LOC) if pid in loaded else None

    sources = AppSources(locate, lambda pid: CTX if pid in loaded else None, lambda data, keys: {})
    w = AppWatcher(sources, clock, EventLog(level="error"), str(tmp_path))
    maps = [FakeMap(), FakeMap()]
    w.set_targets(maps)
    w._backlog = []  # the processes running at start are another test's
    return w, maps, clock, loaded, checks


def run_until(w, clock, end, step=0.01):
    """service() every `step` seconds of the fake clock (a poll-loop turn each) up to `end`."""
    while clock.t < end:
        w.service()
        clock.t = round(clock.t + step, 6)


def test_an_exec_is_checked_at_once_then_50ms_doubling_until_its_library_loads(tmp_path):
    from retsnoop_otel.appctx.exec_watch import EXEC_RECHECK_FIRST_S
    w, maps, clock, loaded, checks = exec_watcher(tmp_path, [30])
    w.born(30)
    t0 = clock.t
    run_until(w, clock, t0 + 0.5)
    # at once (the exec just read), then 50 ms, 100 ms, 200 ms apart: checked at 0, 0.05, 0.15, 0.35 s (at the
    # first turn from then on: turns are 10 ms apart here)
    offsets = [t - t0 for _, t in checks]
    assert offsets == pytest.approx([0.0, EXEC_RECHECK_FIRST_S, 0.15, 0.35], abs=0.0101)
    assert maps[0].entries == {} and maps[1].entries == {}  # nothing found yet: no answer, no "does not publish"
    loaded.add(30)  # its publisher's library loads
    run_until(w, clock, t0 + 1.0)
    assert [t - t0 for _, t in checks][4:] == pytest.approx([0.75], abs=0.0101)  # found at the next check
    for m in maps:  # in every probe set's map before any session of the process asked
        assert m.entries == {30: (-8, 0, 0, True)}
    assert w.counters.exec_watches["located"] == 1 and w.counters.processes_publishing == 1
    run_until(w, clock, t0 + 5.0)
    assert len(checks) == 5  # located: no more checks
    assert w.annotate(tree_session(pid=30, app=AppContext("ok", 1, 2, 1))).app.service_name == "shop"


def test_a_location_not_settled_is_written_and_checked_again_until_glibc_placed_the_block(tmp_path):
    """A TLSDESC library just dlopen'ed: its module id is counted, but glibc decides at the first access whether
    its block goes to static TLS. The counted answer is written at once, the watch goes on, and the settled
    answer replaces it (an early check must not leave a wrong location for good)."""
    counted = TlsLocation(5, 0, 16, "/lib/libotel_thread_ctx.so", "dtv", settled=False)
    static = TlsLocation(0, -4096, 16, "/lib/libotel_thread_ctx.so", "static-tls")
    where = {33: counted}
    w, maps, clock, loaded, checks = exec_watcher(tmp_path, [33], where=where)
    loaded.add(33)
    w.born(33)
    t0 = clock.t
    run_until(w, clock, t0 + 0.02)
    assert maps[0].entries == {33: (0, 16, 5, True)} and w.counters.exec_watches["located"] == 1  # said once
    where[33] = static  # its first span: the descriptor is resolved, into static TLS
    run_until(w, clock, t0 + 1.0)
    assert maps[0].entries == maps[1].entries == {33: (-4096, 16, 0, True)}
    assert w.counters.exec_watches["located"] == 1 and w.counters.processes_publishing == 1
    n = len(checks)
    run_until(w, clock, t0 + 5.0)
    assert len(checks) == n  # settled: no more checks


def test_a_publish_record_checks_a_watched_process_at_once_and_restarts_its_intervals(tmp_path):
    """A service that loaded its publisher between two timed checks (1 s apart by then) and makes its first
    request a few milliseconds later: its publish record has it checked when the record is read."""
    from retsnoop_otel.appctx.exec_watch import EXEC_RECHECK_FIRST_S
    from retsnoop_otel.capture.records import AppPublishRec
    counted = TlsLocation(5, 0, 16, "/lib/libotel_thread_ctx.so", "dtv", settled=False)
    where = {35: counted}
    w, maps, clock, loaded, checks = exec_watcher(tmp_path, [35], where=where)
    w.born(35)
    t0 = clock.t
    run_until(w, clock, t0 + 3.2)
    n = len(checks)
    assert checks[-1][1] - checks[-2][1] == pytest.approx(1.0, abs=0.0101)  # 1 s apart by now
    loaded.add(35)
    w.heard(AppPublishRec(35))  # its memfd_create("OTEL_CTX"): read ahead of the next poll-loop turn
    assert len(checks) == n + 1 and checks[-1] == (35, clock.t)
    assert maps[0].entries == maps[1].entries == {35: (0, 16, 5, True)}
    assert w.counters.exec_watches["located"] == 1
    w.service()
    assert len(checks) == n + 1  # its stale timed check is not run
    run_until(w, clock, clock.t + 0.1)
    assert len(checks) == n + 2 and checks[-1][1] - checks[-2][1] == pytest.approx(EXEC_RECHECK_FIRST_S, abs=0.0101)
    where[35] = TlsLocation(5, 0, 16, "/lib/libotel_thread_ctx.so", "dtv")  # settled at its first span
    run_until(w, clock, clock.t + 2.0)
    assert w.execs.watched == {} and len(checks) == n + 3 and w.counters.exec_watches["located"] == 1


def test_a_publish_record_of_a_process_found_not_to_publish_asks_again_at_once(tmp_path):
    from retsnoop_otel.capture.records import AppExecRec, AppProbeRec, AppPublishRec
    w, maps, clock, located = watcher(tmp_path, alive={40, 41})
    w.heard(AppProbeRec(40))  # its first session asked: not publishing yet
    assert located == [40] and maps[0].entries == {40: (0, 0, 0, False)}
    w.sources.locate = lambda pid, _deadline=None: located.append(pid) or LOC
    w.sources.read_context = lambda pid: CTX
    w.heard(AppPublishRec(40))  # well before its back-off ends
    assert located == [40, 40] and maps[0].entries == maps[1].entries == {40: (-8, 0, 0, True)}
    w.heard(AppPublishRec(40))  # an update of its context (or another probe set's record): no check, a re-read
    assert located == [40, 40] and w._known[40].context_read_at == float("-inf")
    w.heard(AppExecRec(41))
    assert 41 in w.execs.watched


def test_the_watch_is_bounded_and_then_the_process_is_handled_by_its_sessions(tmp_path):
    from retsnoop_otel.appctx.exec_watch import EXEC_RECHECK_MAX_S, EXEC_WATCH_S
    w, maps, clock, _, checks = exec_watcher(tmp_path, [31])
    w.born(31)
    t0 = clock.t
    run_until(w, clock, t0 + EXEC_WATCH_S + 10, step=0.05)
    times = [t - t0 for _, t in checks]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) <= EXEC_RECHECK_MAX_S + 0.05 and gaps == sorted(gaps)  # doubling, then capped
    assert times[-1] <= EXEC_WATCH_S < times[-1] + 2 * EXEC_RECHECK_MAX_S  # checked for EXEC_WATCH_S, no longer
    assert w.counters.exec_watches["not_located"] == 1 and maps[0].entries == {}
    assert w.counters.processes_checked == len(checks)
    w.asked(31)  # its first reported session asks, as any process's would
    w.service()
    assert maps[0].entries == {31: (0, 0, 0, False)}


def test_an_exec_reported_by_every_probe_set_is_watched_once(tmp_path):
    w, _, clock, _, checks = exec_watcher(tmp_path, [32])
    w.born(32)
    w.born(32)
    w.service()
    assert checks == [(32, clock.t)]


def test_a_process_that_exits_while_watched_is_dropped_without_an_error(tmp_path):
    w, maps, clock, _, checks = exec_watcher(tmp_path, [33])
    w.born(33)
    w.service()
    (tmp_path / "33").rmdir()
    run_until(w, clock, clock.t + 1)
    assert len(checks) == 2 and w.counters.exec_watches["exited"] == 1 and w.counters.check_errors == 0
    assert maps[0].entries == {} and w.execs.watched == {} and w._known == {}


def test_a_new_image_withdraws_the_old_answer_from_every_probe_set(tmp_path):
    """A pid that exec'd again (or was reused before the sweep saw its predecessor exit): the old location
    points into another image's memory."""
    w, maps, clock, loaded, _ = exec_watcher(tmp_path, [34])
    loaded.add(34)
    w.asked(34)
    w.service()
    assert maps[0].entries == {34: (-8, 0, 0, True)}
    loaded.clear()
    w.born(34)
    assert maps[0].entries == {} and maps[1].forgotten == [34]
    run_until(w, clock, clock.t + 0.2)
    assert maps[0].entries == {} and 34 in w.execs.watched  # the new image is watched, nothing claimed for it yet


def test_exec_checks_come_after_the_probes_and_within_the_per_turn_bounds(tmp_path, monkeypatch):
    from retsnoop_otel.appctx import watch as app_watch
    monkeypatch.setattr(app_watch, "MAX_CHECKS_PER_SERVICE", 4)
    w, _, clock, _, checks = exec_watcher(tmp_path, range(40, 50))
    for pid in range(40, 49):
        w.born(pid)
    w.asked(49)
    w.service()
    assert [pid for pid, _ in checks] == [49, 40, 41, 42]  # the probe first, then the oldest execs
    w.service()
    assert len(checks) == 8


def test_exec_checks_stop_once_the_turns_time_budget_is_spent(tmp_path):
    """Checks that take 4 ms each (on the fake clock): three fit in BACKLOG_BUDGET_S (10 ms) of one turn."""
    w, _, _, _, checks = exec_watcher(tmp_path, range(40, 50), cost=0.004)
    for pid in range(40, 50):
        w.born(pid)
    w.service()
    assert len(checks) == 3
    w.service()
    assert len(checks) == 6


def test_too_many_execs_at_once_are_left_to_their_sessions(tmp_path, monkeypatch):
    from retsnoop_otel.appctx import exec_watch
    monkeypatch.setattr(exec_watch, "MAX_EXEC_WATCHED", 2)
    w, _, _, _, _ = exec_watcher(tmp_path, [60, 61, 62])
    for pid in (60, 61, 62):
        w.born(pid)
    assert sorted(w.execs.watched) == [60, 61] and w.counters.exec_watches["skipped"] == 1


def test_no_exec_watch_where_thread_context_is_not_read(tmp_path):
    w, _, _, _, checks = exec_watcher(tmp_path, [70])
    w.read_app = False
    w.born(70)
    w.service()
    assert checks == [] and w.execs.watched == {}


# ---- a check past its turn's time goes on at the next turn (CheckDeferred) ------------------------------------

def _deferring(tmp_path, defer_first: set[int], exec_pids=()):
    """A watcher whose locate() defers each pid of `defer_first` once (as TlsLocator does past the deadline it got),
    then answers; calls are recorded with the deadline they had."""
    from retsnoop_otel.appctx.deferral import CheckDeferred
    for pid in exec_pids:
        (tmp_path / str(pid)).mkdir()
    calls: list[tuple[int, float | None]] = []

    def locate(pid, deadline=None):
        calls.append((pid, deadline))
        if pid in defer_first and deadline is not None:  # as TlsLocator: only a check given a deadline defers
            defer_first.discard(pid)
            raise CheckDeferred(pid)
        return LOC

    clock = Clock(100.0)
    w = AppWatcher(AppSources(locate, lambda pid: CTX, lambda data, keys: {}), clock, EventLog(level="error"),
                   str(tmp_path), start_worker=False)
    maps = [FakeMap()]
    w.set_targets(maps)
    w._backlog = []
    return w, maps, calls


def test_a_deferred_backlog_check_ends_the_turn_and_goes_on_first_at_the_next(tmp_path):
    w, maps, calls = _deferring(tmp_path, {5})
    w._backlog = [7, 6, 5]  # popped from the end: 5 first
    w.service()
    assert [p for p, _ in calls] == [5] and calls[0][1] is not None  # a deadline given; the turn ended there
    assert 5 not in maps[0].entries and w.counters.processes_checked == 0  # nothing recorded for a deferral
    w.service()
    assert [p for p, _ in calls] == [5, 5, 6, 7] and maps[0].entries[5] == (-8, 0, 0, True)
    assert w.counters.processes_checked == 3


def test_a_deferred_exec_check_is_due_again_without_advancing_its_watch(tmp_path):
    w, maps, calls = _deferring(tmp_path, {40}, exec_pids=[40])
    w.born(40)
    w.service()
    watch = w.execs.watched[40]
    assert [p for p, _ in calls] == [40] and watch.checks == 0
    w.service()  # the same clock: due as it was, so checked at the next turn, not an interval later
    assert [p for p, _ in calls] == [40, 40] and maps[0].entries[40] == (-8, 0, 0, True)
    assert 40 not in w.execs.watched  # located and settled: the watch ended


def test_a_deferred_probe_answer_comes_first_at_the_next_turn(tmp_path):
    w, maps, calls = _deferring(tmp_path, {99})
    w.asked(99)
    w.asked(98)
    w.service()
    assert [p for p, _ in calls] == [99]
    w.service()
    assert [p for p, _ in calls] == [99, 99, 98] and set(maps[0].entries) == {98, 99}


def test_a_probe_answered_before_its_sessions_end_is_checked_whole(tmp_path):
    """asked(answer=True) comes before the records that follow it (its session's end): no deadline, no deferral."""
    w, maps, calls = _deferring(tmp_path, {99})
    w.asked(99, answer=True)
    assert calls == [(99, None)] and maps[0].entries[99] == (-8, 0, 0, True)

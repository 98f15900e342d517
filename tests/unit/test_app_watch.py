"""The application watcher against scripted process readers and fake BPF maps: probes answered, rechecks
backed off, exited processes forgotten, sessions annotated and counted."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

from retsnoop_otel.appctx.watch import RECHECK_FIRST_S, SWEEP_S, AppSources, AppWatcher
from retsnoop_otel.capture.model import AppContext, UserFrame
from retsnoop_otel.runtime.logs import EventLog
from tests.fakes import tree_session


class FakeMap:
    def __init__(self) -> None:
        self.entries: dict[int, tuple] = {}
        self.forgotten: list[int] = []

    def set_app_target(self, tgid, tp_offset=0, offset=0, modid=0, publishes=True):
        self.entries[tgid] = (tp_offset, offset, modid, publishes)

    def forget_app_target(self, tgid):
        self.entries.pop(tgid, None)
        self.forgotten.append(tgid)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


LOC = SimpleNamespace(tp_offset=-8, offset=0, modid=0)
CTX = SimpleNamespace(attributes={"service.name": "shop"}, key_map=("http.route",))


def watcher(tmp_path, publishing=(), alive=(), symbolizer=None, errors=None):
    for pid in alive:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
    located: list[int] = []

    def locate(pid):
        located.append(pid)
        if errors and pid in errors:
            raise OSError(errors[pid])
        return LOC if pid in publishing else None

    sources = AppSources(locate, lambda pid: CTX if pid in publishing else None,
                         lambda data, keys: {keys[0]: data.decode()}, symbolizer)
    clock = Clock()
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
    code = ("import os, sys\nfrom retsnoop_otel.appctx.watch import AppSources\n"
            "mods = ('retsnoop_otel.appctx.process_context', 'retsnoop_otel.appctx.thread_ctx')\n"
            "sources = AppSources.from_proc('/proc', False)\nprint([m in sys.modules for m in mods])\n"
            "print(sources.read_context(os.getpid()), [m in sys.modules for m in mods])\n"
            "sources.locate(os.getpid())\nprint([m in sys.modules for m in mods])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[False, False]", "None [True, False]", "[True, True]"]


def test_the_config_decides_whether_and_what_the_watcher_reads(tmp_path):
    def ps(app_context=False, user_stacks=False, mode="errors"):
        return SimpleNamespace(app_context=app_context, user_stacks=user_stacks, mode=mode)

    made: list[tuple] = []

    def sources(proc_root, stacks, lines):
        made.append((proc_root, stacks, lines))
        return AppSources(lambda pid: None, lambda pid: None, lambda data, keys: {})

    log = EventLog(level="error")
    # a metrics-only set reports no session: nothing to watch
    assert AppWatcher.for_config([ps(True, True, "metrics"), ps()], str(tmp_path), True, sources, Clock(), log) is None
    assert made == []
    w = AppWatcher.for_config([ps(user_stacks=True), ps(app_context=True, mode="metrics")], str(tmp_path), False,
                              sources, Clock(), log)
    assert w is not None and not w.read_app and made == [(str(tmp_path), True, False)]
    w = AppWatcher.for_config([ps(app_context=True)], str(tmp_path), True, sources, Clock(), log)
    assert w is not None and w.read_app and made[-1] == (str(tmp_path), False, True)

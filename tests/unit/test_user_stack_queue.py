"""User stacks symbolized off the capture loop (appctx/stacks.py): the real worker and queue against a fake
symbolizer that finishes only when a test lets it, and a fake clock for the bound. No test sleeps or times
anything: a session's bound is the clock's, and the worker's progress is the symbolizer's events."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from prometheus_client import generate_latest

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.appctx.process_readers import AppSources
from retsnoop_otel.appctx.stacks import HeldSessions, StackWorker
from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import UserFrame
from retsnoop_otel.command.logs import EventLog
from tests.fakes import AGENT_CONFIG, Clock, World, by_set, error_session, tree_session


class SlowSymbolizer:
    """frames() of a pid in `gates` waits for its event (a large binary's first stack); the others answer at once.
    `entered` tells the test that the worker is inside a stack; `calls` is what was symbolized, in order."""

    def __init__(self, gates: dict[int, threading.Event] | None = None, fail: set[int] = frozenset()) -> None:
        self.gates = gates or {}
        self.fail = fail
        self.calls: list[tuple[str, int]] = []
        self.entered = threading.Event()
        self.closed_in: str | None = None

    def remember(self, pid: int) -> None:
        self.calls.append(("remember", pid))

    def frames(self, pid: int, addrs) -> list[UserFrame]:
        self.calls.append(("frames", pid))
        self.entered.set()
        if pid in self.gates:
            self.gates[pid].wait()
        if pid in self.fail:
            raise OSError("map_files: Permission denied")
        return [UserFrame(a, f"func_{pid}", 4, "/bin/app") for a in addrs]

    def close(self) -> None:
        self.closed_in = threading.current_thread().name


def session(pid: int, ustack: tuple[int, ...] | None = (0x401000, 0x402000)):
    return tree_session(pid=pid, tid=pid, ustack=ustack)


def test_a_slow_stack_holds_the_sessions_behind_it_no_longer_than_the_bound() -> None:
    sym, clock = SlowSymbolizer(), Clock()
    worker = StackWorker(sym, start=False)  # the test runs the worker's turns itself
    held: HeldSessions[str] = HeldSessions(worker, clock, wait_s=1.0)
    first, plain, third = session(1), session(2, ustack=None), session(3)
    held.hold("a", first)
    held.hold("b", plain)  # no user stack: nothing to wait for, but it keeps its place behind the first
    clock.t += 0.5
    held.hold("c", third)
    assert held.due() == []
    clock.t += 0.5  # the first session's bound: it goes out without symbols, the one behind it with it
    assert held.due() == [("a", first), ("b", plain)]
    assert first.ustack_unsymbolized == "timeout" and [f.function for f in first.user_frames] == [None, None]
    assert [f.addr for f in first.user_frames] == [0x401000, 0x402000]  # the raw addresses, for the console
    assert not plain.ustack_unsymbolized and plain.user_frames == ()
    assert worker.run_one() and sym.calls == [("frames", 3)]  # the first one's stack is not worked on any more
    assert held.due() == [("c", third)]
    assert [f.function for f in third.user_frames] == ["func_3", "func_3"] and not third.ustack_unsymbolized
    assert held.unsymbolized == {"queue_full": 0, "timeout": 1, "error": 0} and len(held) == 0


def test_the_capture_loop_does_not_wait_for_a_stack_in_progress() -> None:
    """The worker thread sits inside a slow stack: the loop's due() still answers, and lets the session go
    once its bound passed; the stack behind it is symbolized once the slow one is done."""
    gate = threading.Event()
    sym, clock = SlowSymbolizer({1: gate}), Clock()
    worker = StackWorker(sym)
    try:
        held: HeldSessions[str] = HeldSessions(worker, clock, wait_s=30.0)
        slow, fast = session(1), session(2)
        held.hold("slow", slow)
        assert sym.entered.wait(30)  # the worker took it and is now blocked in it
        clock.t += 10
        held.hold("fast", fast)
        assert held.due() == []
        clock.t += 20
        assert held.due() == [("slow", slow)] and slow.ustack_unsymbolized == "timeout"
        gate.set()
        assert held.due(wait=True) == [("fast", fast)]  # waits out at most what is left of its bound
        assert fast.user_frames[0].function == "func_2" and not fast.ustack_unsymbolized
        assert sym.calls == [("frames", 1), ("frames", 2)]
        assert slow.user_frames[0].function is None  # the slow stack's late frames were dropped
    finally:
        gate.set()
        worker.close()
    assert sym.closed_in == "retsnoop-user-stacks"  # closed by the worker thread itself, once it stopped


def test_a_full_queue_is_counted_and_its_session_keeps_its_place() -> None:
    sym, clock = SlowSymbolizer(), Clock()
    worker = StackWorker(sym, max_queued=1, start=False)
    held: HeldSessions[int] = HeldSessions(worker, clock, wait_s=1.0)
    queued, dropped = session(1), session(2)
    held.hold(1, queued)
    held.hold(2, dropped)
    assert dropped.ustack_unsymbolized == "queue_full" and held.unsymbolized["queue_full"] == 1
    assert held.due() == []  # it is ready, but behind a session that waits
    worker.run_one()
    assert held.due() == [(1, queued), (2, dropped)]
    assert queued.user_frames[0].function == "func_1" and sym.calls == [("frames", 1)]


def test_a_symbolizer_error_is_counted_and_reported_on_the_loop() -> None:
    sym, clock = SlowSymbolizer(fail={4}), Clock()
    worker = StackWorker(sym, start=False)
    held: HeldSessions[int] = HeldSessions(worker, clock)
    told: list[tuple[int, str]] = []
    held.on_error = lambda s, error: told.append((s.pid, error))
    bad = session(4)
    held.hold(0, bad)
    worker.run_one()
    assert held.due() == [(0, bad)]
    assert bad.ustack_unsymbolized == "error" and held.unsymbolized["error"] == 1
    assert told == [(4, "map_files: Permission denied")]


def test_stacks_go_before_snapshots_and_a_drain_lets_everything_out() -> None:
    sym, clock = SlowSymbolizer(), Clock()
    worker = StackWorker(sym, start=False)
    held: HeldSessions[int] = HeldSessions(worker, clock, wait_s=0.01)
    worker.remember(5)
    worker.remember(5)  # one snapshot per process
    s = session(6)
    held.hold(0, s)
    assert worker.run_one() and worker.run_one() and not worker.run_one()
    assert sym.calls == [("frames", 6), ("remember", 5)]  # a session waits on the stack, nothing on the snapshot
    stuck = session(7)
    held.hold(1, stuck)  # never worked on: the drain waits out its bound (the clock stands still: the real one)
    assert held.due(wait=True) == [(0, s), (1, stuck)]
    assert not s.ustack_unsymbolized and stuck.ustack_unsymbolized == "timeout"


def test_a_stack_seen_before_is_answered_on_the_loop_and_not_held_up() -> None:
    """A failing call in a loop gives the same stack each time: once symbolized, the next ones need no worker,
    so a slow stack of another process ahead of them costs them their place in line only, not their symbols."""
    sym, clock = SlowSymbolizer(), Clock()
    worker = StackWorker(sym, start=False)
    held: HeldSessions[str] = HeldSessions(worker, clock, wait_s=1.0)
    first = session(5)
    held.hold("first", first)
    worker.run_one()
    assert held.due() == [("first", first)]
    slow, again = session(1), session(5)
    held.hold("slow", slow)  # the worker never gets to it in this test: as good as a slow one
    held.hold("again", again)
    assert again.user_frames == first.user_frames and held.due() == []
    clock.t += 1.0
    assert held.due() == [("slow", slow), ("again", again)]
    assert slow.ustack_unsymbolized == "timeout" and not again.ustack_unsymbolized
    assert sym.calls == [("frames", 5)]
    held.forget(5)  # exited: its pid may be another program's next time
    held.hold("reused", session(5))
    assert worker.run_one() and sym.calls[-1] == ("frames", 5)


def test_the_same_stack_held_twice_waits_on_one_task() -> None:
    sym, clock = SlowSymbolizer(), Clock()
    worker = StackWorker(sym, start=False)
    held: HeldSessions[int] = HeldSessions(worker, clock)
    one, two = session(5), session(5)
    held.hold(1, one)
    held.hold(2, two)
    assert worker.run_one() and not worker.run_one()
    assert held.due() == [(1, one), (2, two)] and one.user_frames == two.user_frames != ()
    assert sym.calls == [("frames", 5)]


def test_a_stack_answered_after_its_session_went_out_answers_the_next_one() -> None:
    gate = threading.Event()
    sym, clock = SlowSymbolizer({5: gate}), Clock()
    worker = StackWorker(sym)
    try:
        held: HeldSessions[int] = HeldSessions(worker, clock, wait_s=1.0)
        late = session(5)
        held.hold(1, late)
        assert sym.entered.wait(30)
        clock.t += 1.0
        assert held.due() == [(1, late)] and late.ustack_unsymbolized == "timeout"
        (job,) = held._jobs.values()
        gate.set()
        assert job.done.wait(30)
        nxt = session(5)
        held.hold(2, nxt)  # the first one's answer, found on the loop
        assert nxt.user_frames[0].function == "func_5" and held.due() == [(2, nxt)]
        assert sym.calls == [("frames", 5)]
    finally:
        gate.set()
        worker.close()


def test_close_drops_what_waits_and_stops_the_worker(monkeypatch) -> None:
    from retsnoop_otel.appctx import stacks
    monkeypatch.setattr(stacks, "JOIN_S", 0.0)  # close() does not wait for the stack in progress here
    gate = threading.Event()
    sym = SlowSymbolizer({1: gate})
    worker = StackWorker(sym)
    first = worker.submit(1, (1,))
    assert first is not None and sym.entered.wait(30)
    second = worker.submit(2, (2,))
    assert second is not None
    worker.close()  # the worker is inside the first stack
    assert second.skipped and second.done.is_set() and not first.done.is_set()
    assert worker.submit(3, (3,)) is None  # closed: takes nothing more
    gate.set()
    assert worker._thread is not None
    worker._thread.join(30)
    assert first.answered and ("frames", 2) not in sym.calls
    assert sym.closed_in == "retsnoop-user-stacks"  # by the worker thread, once its stack was done


def test_the_runtime_exports_in_order_without_waiting_on_a_slow_stack(tmp_path: Path) -> None:
    """Through the agent's runtime: the first session's stack is slow, the second's is not. The first goes
    out once its bound passed (the symbolizer still busy with it), saying why; the second keeps its symbols;
    both are exported once, in the order they ended; the metric counts the first."""
    gate = threading.Event()
    sym, clock = SlowSymbolizer({7: gate}), Clock()
    world = World()
    world.app_sources = lambda _root, _stacks, _lines: AppSources(  # type: ignore[method-assign]
        lambda pid, _deadline=None: None, lambda pid: None, lambda data, keys: {}, sym)
    deps = world.deps()
    deps.monotonic = clock
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("allow: [array_map_alloc_check]",
                                                   "allow: [array_map_alloc_check]\n    user_stacks: true")
                   + "limits:\n  user_stack_wait_s: 30\n")
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    agent.start()
    try:
        rt = agent.runtime
        errs = by_set(world, "__x64_sys_bpf")

        def with_stack(tid: int) -> list:
            start, end = error_session(errs, tid)
            return [start, records.SessionUstackRec(tid, 100, 0, (0x401000 + tid,)), end]

        errs.pending = with_stack(7)
        rt.poll_once()
        assert sym.entered.wait(30)  # the worker is inside the slow stack
        clock.t += 10
        errs.pending = with_stack(9)
        rt.poll_once()
        assert len(rt.route.app_watch.stacks) == 2 and world.exported == []  # both held, none sent
        clock.t += 20
        rt.poll_once()  # the first one's bound: it goes, the worker still busy with its stack
        assert len(rt.route.app_watch.stacks) == 1
        text = generate_latest(rt.metrics.registry()).decode()
        gate.set()
    finally:
        gate.set()
        rt.shutdown(5.0)  # the drain lets the second out once its stack is symbolized, then flushes
    roots = [s for s in world.exported if s.parent is None]
    assert [s.attributes["thread.id"] for s in roots] == [7, 9]
    assert roots[0].attributes["retsnoop.user_stack_unsymbolized"] == "timeout"
    assert "retsnoop.user_stacktrace" not in roots[0].attributes  # addresses only with export_addresses
    assert roots[1].attributes["retsnoop.user_stacktrace"] == "func_9+0x4 [app]"
    assert "retsnoop.user_stack_unsymbolized" not in roots[1].attributes
    assert 'retsnoop_user_stacks_unsymbolized_total{reason="timeout"} 1.0' in text
    assert 'retsnoop_user_stacks_unsymbolized_total{reason="queue_full"} 0.0' in text


def test_a_stack_without_symbols_reads_as_its_addresses_and_says_why() -> None:
    from retsnoop_otel.export.span_attributes import session_attrs
    from retsnoop_otel.render.console import session_json
    from retsnoop_otel.render.user_stack import user_stack_lines
    held: HeldSessions[int] = HeldSessions(StackWorker(SlowSymbolizer(), start=False), Clock(), wait_s=0.0)
    s = session(5, ustack=(0x7F0000001D, 0x401136))
    held.hold(0, s)
    assert held.due() == [(0, s)] and s.ustack_unsymbolized == "timeout"
    # the console (on this host) prints the addresses, outermost first, and why there is nothing else
    assert user_stack_lines(s) == ["user stack (not symbolized: timeout):", "   0x401136", "   0x7f0000001d"]
    s.chain = []  # the JSON's chain names traced functions: none here
    js = session_json(s, {}, 0)
    assert js["user_stack_unsymbolized"] == "timeout" and [f["address"] for f in js["user_stack"]] == [
        "0x7f0000001d", "0x401136"]
    # exported data leaves the host: user addresses reveal ASLR, so only with export_addresses
    attrs = session_attrs(s, None, export_addresses=False)
    assert attrs["retsnoop.user_stack_unsymbolized"] == "timeout" and "retsnoop.user_stacktrace" not in attrs
    attrs = session_attrs(s, None, export_addresses=True)
    assert attrs["retsnoop.user_stacktrace"] == "0x0000007f0000001d\n0x0000000000401136"

"""A stop that ended the poll's wait goes straight to detaching: the timed work between polls (the thread-context
watcher's checks, a tenth of a second a turn under emulation) is for a run that goes on, and the drain at detach
emits and flushes what is due."""

from __future__ import annotations

import io
from pathlib import Path

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from tests.fakes import AGENT_CONFIG, World, by_set, error_session


def test_the_poll_a_stop_ended_skips_the_timed_work_and_its_session_is_still_sent(tmp_path: Path,
                                                                                   world: World) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(path), world.deps(), EventLog(io.StringIO()))
    agent.start()
    rt = agent.runtime
    serviced = []
    service = rt.route.service
    rt.route.service = lambda: (serviced.append(1), service())  # type: ignore[method-assign]
    try:
        rt.poll_once()
        assert serviced == [1]
        errs = by_set(world, "__x64_sys_bpf")
        errs.pending = error_session(errs)
        rt.poll_once(lambda: True)  # the signal came while it waited
        assert serviced == [1]
    finally:
        rt.shutdown(2.0)
    assert "__x64_sys_bpf" in {s.name for s in world.exported}  # read by that poll, sent by the drain at detach


def test_a_stop_during_one_sets_wait_leaves_the_other_sets_waits_out(tmp_path: Path, world: World) -> None:
    """Each probe set waits its share of the poll in turn, and the stop's wake fd is drained by the wait it ended:
    the sets after it would wait out their shares before the loop saw the stop."""
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(path), world.deps(), EventLog(io.StringIO()))
    agent.start()
    rt = agent.runtime
    polled: list[int] = []
    stop = []
    for i, tracer in enumerate(world.live()):
        def poll(timeout_ms: int, wake_fd: int | None = None, i: int = i, inner=tracer.poll) -> int:
            polled.append(i)
            stop.append(1)  # the signal comes during this wait
            return inner(timeout_ms, wake_fd)
        tracer.poll = poll  # type: ignore[method-assign]
    try:
        assert len(rt.probe_sets) == len(world.live()) == 2
        rt.poll_once()
        assert sorted(polled) == [0, 1]  # no stop asked: every set waits its share
        polled.clear()
        rt.poll_once(lambda: bool(stop))
        assert len(polled) == 1
    finally:
        rt.shutdown(2.0)

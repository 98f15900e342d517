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

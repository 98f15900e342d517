"""A run whose process ends right after its stop (cli.run: os._exit once main returns) detaches every probe and drains
every session as any stop does, and leaves the BPF objects and their ring buffers to the exit, which frees them: the
ring buffer's unmap and libbpf's frees made once, by the kernel (3 ms of a 7-function stop of about 44 ms under
emulation, bench/RESULTS.md). Runs that go on (a reload) or stay in the process (tests, benches) free them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from retsnoop_otel import cli
from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from tests.fakes import AGENT_CONFIG, World, by_set, error_session


def _stopped_agent(tmp_path: Path, world: World, exiting: bool) -> Agent:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(path), world.deps(), EventLog(io.StringIO()))
    agent.start()
    errs = by_set(world, "__x64_sys_bpf")
    errs.pending = error_session(errs)  # ended before the stop: read by the drain after the detach
    agent.request_stop()
    assert agent.run(exiting=exiting) == 0
    return agent


def test_a_run_the_process_leaves_is_detached_and_drained_its_objects_left_to_the_exit(tmp_path: Path,
                                                                                          world: World) -> None:
    _stopped_agent(tmp_path, world, exiting=True)
    assert world.tracers and world.live() == []
    assert [t.state for t in world.tracers] == ["detached"] * len(world.tracers)
    assert "__x64_sys_bpf" in {s.name for s in world.exported}


def test_a_run_that_stays_in_the_process_frees_them(tmp_path: Path, world: World) -> None:
    _stopped_agent(tmp_path, world, exiting=False)
    assert world.tracers and [t.state for t in world.tracers] == ["closed"] * len(world.tracers)
    assert "__x64_sys_bpf" in {s.name for s in world.exported}


def test_the_installed_command_says_its_process_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.run is what the console script and `python -m retsnoop_otel` call: it leaves through os._exit."""
    asked: list[dict] = []
    monkeypatch.setattr(cli, "main", lambda **kw: asked.append(kw) or 0)

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", leave)
    with pytest.raises(SystemExit):
        cli.run()
    assert asked == [{"exiting": True}]

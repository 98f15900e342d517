"""The agent reloading by itself when its ConfigMap-style config directory is updated (issue 45), with the kernel
faked as in test_agent_lifecycle.py: the new probe sets attach, a broken file keeps them and counts a failure."""

from __future__ import annotations

import io
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from tests.configmap import configmap_update
from tests.fakes import AGENT_CONFIG, World, log_events


def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_a_configmap_update_reloads_and_a_broken_one_keeps_the_running_sets(tmp_path: Path, world: World) -> None:
    mount = tmp_path / "config"
    configmap_update(mount, {"agent.yaml": AGENT_CONFIG.format(prob=1.0)})
    logbuf = io.StringIO()
    agent = Agent(str(mount / "agent.yaml"), world.deps(), EventLog(logbuf), watch=True)
    agent.start()
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        rt = agent.runtime
        assert rt is not None and [ps.name for ps in rt.probe_sets] == ["bpf_errors", "prog_load"]
        configmap_update(mount, {"agent.yaml": AGENT_CONFIG.format(prob=1.0).replace("bpf_errors", "errors2")})
        assert _until(lambda: rt.reloads["success"] == 1), log_events(logbuf)
        assert [ps.name for ps in rt.probe_sets] == ["errors2", "prog_load"] and len(world.live()) == 2
        live = world.live()
        configmap_update(mount, {"agent.yaml": "probe_sets: 5\n"})
        assert _until(lambda: rt.reloads["failure"] == 1), log_events(logbuf)
        assert world.live() == live and [ps.name for ps in rt.probe_sets] == ["errors2", "prog_load"]
        with urllib.request.urlopen(f"http://127.0.0.1:{rt.server.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'retsnoop_config_reloads_total{result="success"} 1.0' in text
        assert 'retsnoop_config_reloads_total{result="failure"} 1.0' in text
    finally:
        agent.request_stop()
        runner.join(10)
    assert not runner.is_alive() and agent.watch is None and world.live() == []
    assert not any(t.name == "config-watch" for t in threading.enumerate())
    events = log_events(logbuf)
    asked = [e for e in events if e["msg"] == "reloading config"]
    assert [e["trigger"] for e in asked] == ["file change", "file change"]
    assert [e["trigger"] for e in events if e["msg"] == "config reloaded"] == ["file change"]
    failed = [e for e in events if e["msg"].startswith("config reload failed")]
    assert len(failed) == 1 and failed[0]["trigger"] == "file change" and "probe_sets" in failed[0]["error"]
    assert next(e for e in events if e["msg"] == "agent started")["watch"] is True


def test_a_change_during_the_start_reloads_once_the_run_begins(tmp_path: Path, world: World) -> None:
    """The file is watched from before it is read: an update while the probe sets attach is not missed."""
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(path), world.deps(), EventLog(io.StringIO()), watch=True)
    real_factory = world.factory
    changed: list[bool] = []

    def factory(funcs, c, b):
        if not changed:
            path.write_text(AGENT_CONFIG.format(prob=1.0).replace("bpf_errors", "errors2"))
            changed.append(True)
        return real_factory(funcs, c, b)

    agent.deps.tracer_factory = factory
    agent.start()
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        assert _until(lambda: agent.runtime.reloads["success"] == 1)
        assert [ps.name for ps in agent.runtime.probe_sets] == ["errors2", "prog_load"]
    finally:
        agent.request_stop()
        runner.join(10)


def test_sighup_is_named_in_the_reload_log(tmp_path: Path, world: World) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    logbuf = io.StringIO()
    agent = Agent(str(path), world.deps(), EventLog(logbuf))
    agent.start()
    try:
        agent.requests._reload(1, None)  # what the SIGHUP handler does
        assert agent.requests.reload and agent.reload() is True
    finally:
        agent.runtime.shutdown(0.5)
    assert [e["trigger"] for e in log_events(logbuf) if e["msg"] == "config reloaded"] == ["SIGHUP"]
    assert agent.watch is None  # not asked for: no thread

"""Each command enters each start phase once, through Runtime.start: `trace` (its -v lines and --dry-run come
from its hook), `agent --check` (up to discovery, nothing bound or attached) and a reload (the same kernel and
attach steps for the new config)."""

from __future__ import annotations

import io
import socket
from collections import Counter
from pathlib import Path

from retsnoop_otel.agent.main import Agent, check
from retsnoop_otel.command.errors import SetupError
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.trace.main import run_trace
from tests.fakes import AGENT_CONFIG, World, log_events


def counted(world: World, console: io.StringIO | None = None) -> tuple:
    """The world's deps, counting how often each phase's entry point is called."""
    deps = world.deps(console)
    calls: Counter[str] = Counter()
    for name in ("find_vmlinux", "check_privileges", "load_env", "tracer_factory", "make_resource"):
        inner = getattr(deps, name)

        def wrapped(*a, _inner=inner, _name=name):
            calls[_name] += 1
            return _inner(*a)

        setattr(deps, name, wrapped)
    return deps, calls


def test_trace_dry_run_enters_each_phase_once_and_attaches_nothing() -> None:
    world, out, err = World(), io.StringIO(), io.StringIO()
    deps, calls = counted(world, out)
    assert run_trace(["-e", "*sys_bpf", "-a", "array_map_alloc_check", "--dry-run", "-v"], out, err, deps) == 0
    assert calls == {"find_vmlinux": 1, "check_privileges": 1, "load_env": 1, "make_resource": 1}
    assert world.tracers == []
    assert "Using attach mode kprobe (auto-detected)" in err.getvalue()
    assert "would attach" in out.getvalue() and "Receiving data" not in out.getvalue()


def test_trace_attaches_once_after_its_verbose_lines(monkeypatch) -> None:
    from retsnoop_otel.runtime.requests import Requests
    world, out, err = World(), io.StringIO(), io.StringIO()
    deps, calls = counted(world, out)
    monkeypatch.setattr(Requests, "install", lambda self, reload: setattr(self, "stop", True) or self)
    assert run_trace(["-e", "*sys_bpf", "-v"], out, err, deps) == 0
    assert calls == {"find_vmlinux": 1, "check_privileges": 1, "load_env": 1, "make_resource": 1,
                     "tracer_factory": 1}
    text = err.getvalue()
    assert text.index("Using attach mode") < text.index("Successfully attached")
    assert out.getvalue().endswith(" ms.\n") and "Detaching... DONE" in out.getvalue()
    assert world.live() == []  # detached at the stop


def test_check_resolves_every_set_without_binding_or_attaching(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:  # the running agent's port: --check must not try to bind it
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("127.0.0.1:0", f"127.0.0.1:{busy.getsockname()[1]}"))
        world = World()
        deps, calls = counted(world)
        out = io.StringIO()
        assert check(str(cfg), out, deps) == 0
    finally:
        busy.close()
    assert calls == {"find_vmlinux": 1, "check_privileges": 1, "load_env": 1}
    assert world.tracers == [] and out.getvalue().count("would attach") == 2


def test_reload_runs_the_kernel_and_attach_steps_again_and_logs_what_it_attached(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    world, logbuf = World(), io.StringIO()
    world.kernel_state = "boot-1"
    deps, calls = counted(world)
    agent = Agent(str(cfg), deps, EventLog(logbuf))
    agent.start()
    try:
        assert calls == {"find_vmlinux": 1, "check_privileges": 1, "load_env": 1, "make_resource": 1,
                         "tracer_factory": 2}
        assert agent.reload() is True
        # the start's steps again, privileges included; the kernel tables kept (same kernel), both sets attached
        # anew; outputs not reopened
        assert calls == {"find_vmlinux": 2, "check_privileges": 2, "load_env": 1, "make_resource": 1,
                         "tracer_factory": 4}
        attached = [e["probe_set"] for e in log_events(logbuf) if e["msg"] == "probe set attached"]
        assert attached == ["bpf_errors", "prog_load"] * 2
    finally:
        agent.runtime.shutdown(0.5)


def test_a_reload_without_the_privileges_to_attach_keeps_the_running_sets(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    world, logbuf = World(), io.StringIO()
    deps = world.deps()
    agent = Agent(str(cfg), deps, EventLog(logbuf))
    agent.start()
    try:
        running = list(agent.runtime.probe_sets)

        def refused() -> None:
            raise SetupError("tracing kernel functions needs root or the CAP_BPF and CAP_PERFMON capabilities")
        deps.check_privileges = refused
        assert agent.reload() is False
        assert agent.runtime.probe_sets == running and agent.runtime.reloads == {"success": 0, "failure": 1}
        assert len(world.tracers) == 2  # nothing attached for the refused config
        (failed,) = [e for e in log_events(logbuf) if e["msg"].startswith("config reload failed")]
        assert "CAP_BPF" in failed["error"]
    finally:
        agent.runtime.shutdown(0.5)


def test_a_reload_refused_by_the_file_is_counted_and_logged_once(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    world, logbuf = World(), io.StringIO()
    agent = Agent(str(cfg), world.deps(), EventLog(logbuf))
    agent.start()
    try:
        cfg.write_text("probe_sets: 5\n")
        assert agent.reload() is False
        failed = [e for e in log_events(logbuf) if e["msg"].startswith("config reload failed")]
        assert len(failed) == 1 and failed[0]["config"] == str(cfg) and "probe_sets" in failed[0]["error"]
        assert agent.runtime.reloads == {"success": 0, "failure": 1}
    finally:
        agent.runtime.shutdown(0.5)

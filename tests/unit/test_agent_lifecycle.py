"""Agent lifecycle without a kernel: start, capture -> export, SIGHUP reload (good and bad), SIGTERM.

The kernel-facing parts are fakes injected through RuntimeDeps (tests/fakes.py: World): a KernelEnv over a tiny
kallsyms, a tracer factory whose tracers deliver scripted records on poll, and an in-memory OTLP sender.
Everything else (config parsing, discovery, session assembly, sampling, span mapping, the export
queue, the HTTP endpoint) is the real code.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from retsnoop_otel.agent.main import Agent, check, main
from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import OriginCount, SessionStats
from retsnoop_otel.command.errors import SetupError
from retsnoop_otel.command.logs import EventLog
from tests.fakes import (
    AGENT_CONFIG,
    FakeTracer,
    World,
    by_set,
    error_session,
    log_events,
    make_env,
    success_calls_session,
    wait_exported,
)


@pytest.fixture()
def setup(tmp_path: Path, world: World):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    logbuf = io.StringIO()
    agent = Agent(str(cfg), world.deps(), EventLog(logbuf))
    yield world, agent, cfg, logbuf
    if agent.runtime is not None:
        agent.runtime.shutdown(0.5)


def test_start_attaches_each_probe_set_with_its_own_capture_config(setup) -> None:
    world, agent, _cfg, logbuf = setup
    agent.start()
    assert len(world.live()) == 2
    errs, loads = by_set(world, "__x64_sys_bpf"), by_set(world, "bpf_prog_load")
    assert {f.name for f in errs.funcs} == {"__x64_sys_bpf", "__sys_bpf", "array_map_alloc_check"}
    assert not errs.cfg.emit_calls and not errs.cfg.capture_success  # stack mode, errors only
    assert loads.cfg.emit_calls and loads.cfg.capture_success  # calls mode, success sampling > 0
    assert errs.cfg.mode == "kprobe"  # attach_mode auto -> the environment's choice
    started = [e for e in log_events(logbuf) if e["msg"] == "agent started"]
    assert started and started[0]["probe_sets"] == 2
    # where the start went, for an agent at scale: the kernel reads, discovery, load and attach of both sets
    assert started[0]["symbols_ms"] == 250.0
    assert all(started[0][f"{p}_ms"] >= 0 for p in ("inputs", "discovery", "load", "attach"))


def test_sessions_become_one_trace_each_with_nesting_and_status(setup) -> None:
    world, agent, _cfg, _log = setup
    agent.start()
    errs, loads = by_set(world, "__x64_sys_bpf"), by_set(world, "bpf_prog_load")
    errs.pending = error_session(errs)
    loads.pending = success_calls_session(loads)
    agent.runtime.poll_once()
    spans = wait_exported(world, 5)
    traces: dict[int, list] = {}
    for s in spans:
        traces.setdefault(s.context.trace_id, []).append(s)
    assert len(traces) == 2
    err_trace = next(t for t in traces.values() if t[0].name == "__x64_sys_bpf")
    root, leaf = err_trace
    assert root.parent is None and leaf.parent.span_id == root.context.span_id
    assert leaf.attributes["error.type"] == "EINVAL" and leaf.status.status_code.name == "ERROR"
    load_trace = next(t for t in traces.values() if t[0].name == "bpf_prog_load")
    root = load_trace[0]
    assert root.status.status_code.name == "UNSET" and root.attributes["retsnoop.return_value"] == 5
    children = [s for s in load_trace if s.parent is not None]
    assert [c.name for c in children] == ["bpf_prog_alloc", "bpf_check"]
    assert all(c.parent.span_id == root.context.span_id for c in children)
    # boot-clock times + the measured offset, children inside the parent
    assert root.start_time == 1_000_000_000_000 + 1000 and root.end_time == 1_000_000_000_000 + 2000
    assert all(root.start_time <= c.start_time <= c.end_time <= root.end_time for c in children)
    agent.runtime.shutdown(5.0)
    flushed = [e for e in log_events(_log) if e["msg"] == "exporters flushed"]
    assert flushed[0]["spans_exported"] == 5 and flushed[0]["spans_dropped"] == 0


def test_success_sessions_are_dropped_when_not_sampled(tmp_path: Path, world: World) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=0.0))
    agent = Agent(str(cfg), world.deps(), EventLog(io.StringIO()))
    agent.start()
    try:
        loads = by_set(world, "bpf_prog_load")
        assert not loads.cfg.capture_success  # sampling 0: the kernel does not even report them
        loads.pending = success_calls_session(loads)
        agent.runtime.poll_once()
        ps = next(p for p in agent.runtime.probe_sets if p.name == "prog_load")
        assert ps.sampled_out == 1 and ps.kept == 0
    finally:
        agent.runtime.shutdown(0.5)
    assert world.exported == []


def test_reload_with_broken_config_keeps_old_probe_sets(setup) -> None:
    world, agent, cfg, logbuf = setup
    agent.start()
    before = world.live()
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("mode: calls", "mode: calls\n    bogus: 1"))
    assert agent.reload() is False
    assert world.live() == before and agent.runtime.reloads == {"success": 0, "failure": 1}
    failed = [e for e in log_events(logbuf) if e["msg"].startswith("config reload failed")]
    assert len(failed) == 1 and "agent.yaml:9: probe_sets[1].bogus: unknown key" in failed[0]["error"]
    # capture goes on with the old sets
    errs = by_set(world, "__x64_sys_bpf")
    errs.pending = error_session(errs)
    agent.runtime.poll_once()
    assert len(wait_exported(world, 2)) == 2


def test_reload_that_fails_to_attach_detaches_the_new_sets_and_keeps_the_old(setup) -> None:
    world, agent, cfg, _log = setup
    agent.start()
    before = world.live()
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("[bpf_check,", "[vfs_read, bpf_check,"))
    world.fail_attach_for = {"vfs_read"}
    assert agent.reload() is False
    assert world.live() == before
    assert len(world.tracers) == 4 and all(t.state == "closed" for t in world.tracers[2:])


def test_reload_with_unresolvable_glob_attaches_nothing_new(setup) -> None:
    world, agent, cfg, logbuf = setup
    agent.start()
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("[bpf_prog_load]", "[no_such_function]"))
    assert agent.reload() is False
    assert len(world.tracers) == 2  # globs are all resolved before anything is loaded
    err = [e for e in log_events(logbuf) if e["msg"].startswith("config reload failed")][0]["error"]
    assert "probe set 'prog_load'" in err and "no_such_function" in err


def test_good_reload_attaches_new_then_detaches_old(setup) -> None:
    world, agent, cfg, logbuf = setup
    agent.start()
    old = world.live()
    order: list[str] = []
    scrape_could_lock: list[bool] = []

    def try_lock() -> None:  # what the scrape thread does
        if agent.runtime.lock.acquire(blocking=False):
            agent.runtime.lock.release()
            scrape_could_lock.append(True)
        else:
            scrape_could_lock.append(False)

    def close_old(t) -> None:  # a detach takes seconds at 10,000 functions: scrapes must not wait for it
        th = threading.Thread(target=try_lock)
        th.start()
        th.join()
        # handed over: the new sets start sessions, the old ones none (no call counted or exported twice)
        order.append(f"close-old ready={t.ready} new ready={[n.ready for n in world.live() if n not in old]}")
        t.state = "closed"

    for t in old:
        t.close = lambda t=t: close_old(t)  # type: ignore[method-assign]
    real_factory = world.factory

    def factory(funcs, c, b):
        t = real_factory(funcs, c, b)
        orig = t.attach
        t.attach = lambda on_error=None, strict=False, ready=True: (  # type: ignore
            order.append(f"attach-new ready={ready}"), orig(ready=ready))[1]
        return t

    agent.deps.tracer_factory = factory
    cfg.write_text(AGENT_CONFIG.format(prob=0.5).replace("bpf_errors", "errors2"))
    assert agent.reload() is True
    assert order == ["attach-new ready=False", "attach-new ready=False",
                     "close-old ready=False new ready=[True, True]", "close-old ready=False new ready=[True, True]"]
    assert scrape_could_lock == [True, True]
    assert [ps.name for ps in agent.runtime.probe_sets] == ["errors2", "prog_load"]
    assert agent.runtime.reloads == {"success": 1, "failure": 0}
    assert all(t.state == "closed" for t in old) and len(world.live()) == 2
    reloaded = [e for e in log_events(logbuf) if e["msg"] == "config reloaded"]
    assert reloaded and reloaded[0]["symbols_ms"] == 250.0 and reloaded[0]["attach_ms"] >= 0


def test_reload_frees_the_previous_configs_tables(setup) -> None:
    """The start freezes the heap (runtime/heap.py): a reload must still free what it replaced."""
    import gc
    import weakref
    world, agent, cfg, _ = setup
    agent.start()
    old_ksyms = weakref.ref(agent.runtime.env.ksyms)
    old_tracers = [weakref.ref(t) for t in world.live()]
    world.tracers.clear()  # the test's own list would keep them
    cfg.write_text(AGENT_CONFIG.format(prob=0.5).replace("bpf_errors", "errors2"))
    assert agent.reload() is True
    assert gc.isenabled()
    assert old_ksyms() is None and all(t() is None for t in old_tracers)


def test_reload_keeps_the_kernel_tables_while_the_kernel_is_unchanged(setup) -> None:
    """Reading them again at every reload grew the agent by megabytes per reload (bench/agent_scale.py);
    a module load (a new kernel state) must still be seen."""
    world, agent, cfg, logbuf = setup
    world.kernel_state = "build:boot:modules-1"
    agent.start()
    env = agent.runtime.env
    closed = []
    env.close = lambda: closed.append(True)
    cfg.write_text(AGENT_CONFIG.format(prob=0.5).replace("bpf_errors", "errors2"))
    assert agent.reload() is True and agent.runtime.env is env and world.env_loads == 1 and closed == []
    reloaded = [e for e in log_events(logbuf) if e["msg"] == "config reloaded"]
    assert reloaded[-1]["symbols_ms"] == 0.0
    world.env_fail = "boom"  # not read again: the reload succeeds with the tables it has
    assert agent.reload() is True and world.env_loads == 1
    world.kernel_state = "build:boot:modules-2"
    assert agent.reload() is False and agent.runtime.env is env and closed == []  # failed: the old env stays
    world.env_fail = None
    assert agent.reload() is True and world.env_loads == 3 and agent.runtime.env is not env and closed == [True]
    assert agent.reload() is True and world.env_loads == 3


def test_signals_drive_reload_and_stop(setup) -> None:
    """Real SIGHUP/SIGTERM to this process: the loop reloads, then detaches, flushes and returns 0."""
    world, agent, cfg, logbuf = setup
    old = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        agent.requests.install(reload=True)
        agent.start()
        cfg.write_text("probe_sets: 5\n")
        result: dict = {}
        runner = threading.Thread(target=lambda: result.setdefault("rc", agent.run()))
        runner.start()
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while agent.runtime.reloads["failure"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert agent.runtime.reloads["failure"] == 1 and len(world.live()) == 2
        os.kill(os.getpid(), signal.SIGTERM)
        runner.join(10)
        assert result == {"rc": 0}
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert world.live() == [] and all(t.state == "closed" for t in world.tracers)
    msgs = [e["msg"] for e in log_events(logbuf)]
    assert "detached" in msgs and "exporters flushed" in msgs


def test_start_failure_leaves_nothing_attached(tmp_path: Path, world: World) -> None:
    world.fail_attach_for = {"bpf_check"}
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(cfg), world.deps(), EventLog(io.StringIO()))
    with pytest.raises(SetupError, match="probe set 'prog_load'.*EBUSY"):
        agent.start()
    assert world.live() == [] and agent.runtime is None


def test_exporters_built_after_the_attach_leave_nothing_attached_when_they_fail(tmp_path: Path, world: World) -> None:
    """The exporters are built once the sets are attached (their imports overlap the kernel's load): one that cannot
    be built then fails the start with every new set detached, and a reload with the old sets still running."""
    deps = world.deps()

    def broken(settings):
        raise SetupError("the OTLP exporter cannot be built here")

    deps.make_sender = broken
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    with pytest.raises(SetupError, match="cannot be built"):
        agent.start()
    assert world.tracers and world.live() == [] and all(t.state == "closed" for t in world.tracers)


def test_a_reload_whose_new_exporters_fail_detaches_its_new_sets(setup) -> None:
    world, agent, cfg, _ = setup
    agent.start()
    running = list(world.live())

    def broken(settings):
        raise SetupError("the OTLP exporter cannot be built here")

    agent.runtime.deps.make_sender = broken
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("4318", "4319"))  # another endpoint: sinks built again
    assert agent.reload() is False
    assert world.live() == running and all(t.state == "closed" for t in world.tracers if t not in running)
    assert len(world.tracers) > len(running)


def test_metrics_and_healthz_over_http(setup) -> None:
    world, agent, _cfg, _log = setup
    agent.start()
    port = agent.runtime.server.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
        assert resp.headers["Content-Type"].startswith("text/plain")
    assert 'retsnoop_attached_functions{mode="kprobe",probe_set="bpf_errors"} 3.0' in text
    assert 'retsnoop_config_reloads_total{result="failure"} 0.0' in text
    assert "retsnoop_agent_up 1.0" in text
    assert 'retsnoop_function_calls_total{function="bpf_check",probe_set="prog_load"} 3.0' in text
    # per-object capture counters get the probe_set label; agent-wide families appear once
    assert 'retsnoop_records_lost_total{probe_set="bpf_errors"} 0.0' in text
    assert 'retsnoop_sessions_evicted_total{probe_set="bpf_errors"} 0.0' in text
    assert text.count("# TYPE retsnoop_spans_exported_total counter") == 1
    assert text.count("# TYPE retsnoop_function_calls_total counter") == 1
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().decode().endswith("# EOF\n")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        health = json.loads(resp.read())
    assert health["status"] == "ok" and health["attached_functions"] == 6
    assert [p["name"] for p in health["probe_sets"]] == ["bpf_errors", "prog_load"]
    agent.runtime.last_poll -= 3600  # the capture loop stalled
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert exc.value.code == 503 and json.loads(exc.value.read())["status"] == "stalled"


def _openmetrics(port: int) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


def _session_histogram(t: FakeTracer) -> None:
    """The kernel's count for error_session(): one session of 5,000 ns, in bucket [4096, 8192) ns."""
    buckets = [0] * records.DUR_BUCKETS
    buckets[12] = 1
    t.session_stats = lambda: [SessionStats(t.fid("__x64_sys_bpf"), 1, 1, tuple(buckets), 5000)]


def _export_error_session(world, agent, errs) -> int:
    """The trace id of one failing session of `errs`, exported by one poll (the exemplars' target)."""
    errs.pending = error_session(errs)
    agent.runtime.poll_once()
    return wait_exported(world, 2)[0].context.trace_id


def test_session_histogram_bucket_links_to_the_exported_trace(setup) -> None:
    world, agent, _cfg, _log = setup
    agent.start()
    errs = by_set(world, "__x64_sys_bpf")
    _session_histogram(errs)
    trace_id = _export_error_session(world, agent, errs)
    text = _openmetrics(agent.runtime.server.port)
    # root span: boot-clock end 5,100 ns + offset 1,000 s; duration 5,000 ns
    assert ('retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="8.192e-06",'
            f'probe_set="bpf_errors"}} 1.0 # {{trace_id="{trace_id:032x}"}} 5e-06 1000.000005100\n') in text
    assert text.count(" # {") == 1
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.runtime.server.port}/metrics", timeout=5) as resp:
        assert " # {" not in resp.read().decode()  # Prometheus text format has no exemplars


def test_origin_series_links_to_an_exported_trace_of_that_origin(setup) -> None:
    """Issue 46: the kernel's origin count carries the trace id of the latest exported failing session that
    started in that function, so the series of a spike leads to a trace of it."""
    world, agent, _cfg, _log = setup
    agent.start()
    errs = by_set(world, "__x64_sys_bpf")
    errs.origin_counts = lambda: [OriginCount(errs.fid("__x64_sys_bpf"), errs.fid("array_map_alloc_check"), "EINVAL",
                                              3)]
    trace_id = _export_error_session(world, agent, errs)
    text = _openmetrics(agent.runtime.server.port)
    assert ('retsnoop_error_origins_total{entry="__x64_sys_bpf",error_type="EINVAL",origin="array_map_alloc_check",'
            f'probe_set="bpf_errors"}} 3.0 # {{trace_id="{trace_id:032x}"}} 1.0 1000.000005100\n') in text


def test_no_exemplar_for_a_trace_the_exporter_did_not_accept(tmp_path: Path, world: World) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0) + "limits:\n  export_queue_spans: 1\n")  # 2-span traces never fit
    agent = Agent(str(cfg), world.deps(), EventLog(io.StringIO()))
    agent.start()
    try:
        errs = by_set(world, "__x64_sys_bpf")
        _session_histogram(errs)
        errs.pending = error_session(errs)
        agent.runtime.poll_once()
        text = _openmetrics(agent.runtime.server.port)
    finally:
        agent.runtime.shutdown(0.5)
    assert 'retsnoop_spans_dropped_total{cause="queue_full"} 2.0' in text
    assert ('retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="8.192e-06",'
            'probe_set="bpf_errors"} 1.0\n') in text
    assert " # {" not in text


def test_console_and_file_outputs(tmp_path: Path, world: World) -> None:
    out_file = tmp_path / "traces.jsonl"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace(
        'otlp: {endpoint: "http://127.0.0.1:4318"}', f"otlp: null\n  file: {out_file}\n  console: true"))
    console = io.StringIO()
    agent = Agent(str(cfg), world.deps(console), EventLog(io.StringIO()))
    agent.start()
    errs = by_set(world, "__x64_sys_bpf")
    errs.pending = error_session(errs)
    agent.runtime.poll_once()
    agent.runtime.shutdown(5.0)
    assert "[bpf_errors]" in console.getvalue() and "array_map_alloc_check" in console.getvalue()
    (line,) = out_file.read_text().splitlines()
    spans = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [s["name"] for s in spans] == ["__x64_sys_bpf", "array_map_alloc_check"]
    assert len(spans[0]["traceId"]) == 32 and spans[1]["parentSpanId"] == spans[0]["spanId"]  # hex ids
    assert spans[1]["status"]["code"] == 2  # OTLP/JSON enums are integers


def test_console_is_written_once_per_poll_not_per_session(tmp_path: Path, world: World) -> None:
    """On a pipe, a flush per session cost a write and a wakeup of the reader per session."""
    class Counting(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1
            super().flush()

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace('otlp: {endpoint: "http://127.0.0.1:4318"}',
                                                   "otlp: null\n  console: true"))
    console = Counting()
    agent = Agent(str(cfg), world.deps(console), EventLog(io.StringIO()))
    agent.start()
    errs = by_set(world, "__x64_sys_bpf")
    errs.pending = error_session(errs, tid=7) + error_session(errs, tid=8) + error_session(errs, tid=9)
    before = console.flushes
    agent.runtime.poll_once()
    assert console.getvalue().count("[bpf_errors]") == 3 and console.flushes == before + 1
    agent.runtime.shutdown(5.0)


def test_check_prints_what_each_probe_set_would_attach(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    out = io.StringIO()
    assert check(str(cfg), out, World().deps()) == 0
    text = out.getvalue()
    assert text.rstrip().splitlines()[-1] == f"{cfg}: configuration is valid (2 probe sets)"  # last, after the sets
    assert "probe set 'bpf_errors' (mode stack, attach_mode auto -> kprobe, success sessions: none)" in text
    assert "would attach 3 (2 entry) in kprobe mode" in text
    assert "success sessions: probability 1" in text
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace("[bpf_prog_load]", "[nope_*]"))
    out, err = io.StringIO(), io.StringIO()
    assert check(str(cfg), out, World().deps(), err=err) == 2  # the run's exit code and stream for bad input
    assert err.getvalue().startswith("retsnoop-otel agent: probe set 'prog_load': ") and "nope_*" in err.getvalue()
    assert out.getvalue() == ""


def test_main_reports_config_and_setup_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("probe_sets:\n  - name: x\n    entry: 5\n")
    err = io.StringIO()
    assert main(["--check", str(cfg)], io.StringIO(), err) == 2
    assert err.getvalue().strip() == ("retsnoop-otel agent: agent.yaml:3: probe_sets[0].entry: expected a list of "
                                      "globs, got int 5")


def test_metrics_otlp_pushes_the_same_families_and_a_last_push_before_detaching(tmp_path: Path, world: World) -> None:
    """metrics.otlp: periodic pushes of /metrics' families; shutdown pushes once more while still attached."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    states_at_push: list = []
    deps = world.deps()
    traces_sender = deps.make_sender

    def sender(settings):
        inner = traces_sender(settings)
        if settings.signal != "metrics":
            return inner

        class Recording:
            def send(self, body, items):
                states_at_push.append(sorted({t.state for t in world.tracers}))
                return inner.send(body, items)

            def shutdown(self):
                inner.shutdown()

        return Recording()

    deps.make_sender = sender
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace(
        'metrics:\n  listen: "127.0.0.1:0"\n',
        'metrics:\n  listen: "127.0.0.1:0"\n  otlp: {endpoint: "http://127.0.0.1:4318", protocol: http/protobuf}\n'
        '  otlp_interval: 1\n'))
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    agent.start()

    def pushed() -> list:
        return [ExportMetricsServiceRequest.FromString(body) for s, body in world.requests if s.signal == "metrics"]

    deadline = time.monotonic() + 10
    while not pushed() and time.monotonic() < deadline:
        agent.runtime.poll_once()
    assert pushed(), "no periodic push"
    settings = next(s for s, _ in world.requests if s.signal == "metrics")
    assert settings.protocol == "http/protobuf" and settings.url == "http://127.0.0.1:4318/v1/metrics"
    agent.runtime.shutdown(1.0)
    assert states_at_push[-1] == ["attached"]  # the last push read the maps before detaching
    metrics = pushed()[-1].resource_metrics[0].scope_metrics[0].metrics
    names = {m.name for m in metrics}
    assert {"retsnoop_function_calls", "retsnoop_function_errors", "retsnoop_function_duration_seconds",
            "retsnoop_attached_functions", "retsnoop_agent_up"} <= names
    calls = next(m for m in metrics if m.name == "retsnoop_function_calls")
    assert {a.value.string_value for p in calls.sum.data_points for a in p.attributes if a.key == "probe_set"} == {
        "bpf_errors", "prog_load"}
    assert agent.runtime.metrics_push is None


def test_lbr_probe_set_refused_where_the_cpu_has_no_lbr() -> None:
    from retsnoop_otel.runtime.config import Limits, ProbeSetConfig
    from retsnoop_otel.runtime.probe_set import capture_config, resolve
    env = make_env()
    env.lbr_missing = "opening a branch-stack perf event was refused (ENOENT)"
    cfg = ProbeSetConfig(name="deep", entry=("bpf_check",), lbr_branch_types=0x22)
    with pytest.raises(SetupError, match="probe set 'deep': lbr needs last branch records, but opening"):
        resolve(cfg, env)
    found = resolve(cfg, make_env())
    assert capture_config(cfg, found.mode, Limits()).lbr_branch_types == 0x22
    assert resolve(cfg._replace(lbr_branch_types=0), env).funcs


def test_cgroup_target_id_and_level(tmp_path: Path) -> None:
    from retsnoop_otel.command.errors import InputError
    from retsnoop_otel.runtime.environment import cgroup_target
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "mounts").write_text("cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    leaf = tmp_path / "sys/fs/cgroup/unified/system.slice/foo.service"
    leaf.mkdir(parents=True)
    want = (leaf.stat().st_ino, 2)
    assert cgroup_target("/sys/fs/cgroup/unified/system.slice/foo.service", root=str(tmp_path)) == want
    assert cgroup_target("system.slice/foo.service", root=str(tmp_path)) == want
    assert cgroup_target("/", root=str(tmp_path))[1] == 0
    with pytest.raises(InputError, match="--cgroup nope: No such file or directory"):
        cgroup_target("nope", "--cgroup", root=str(tmp_path))


def test_library_warnings_follow_the_log_format_and_are_rate_limited() -> None:
    import logging

    from retsnoop_otel.command.log_bridge import LibraryLogBridge
    out = io.StringIO()
    now = {"t": 100.0}
    log = EventLog(out, fmt="json")
    logger = logging.getLogger("opentelemetry.test_bridge")
    logger.handlers[:] = [LibraryLogBridge(log, interval_s=60, clock=lambda: now["t"])]
    logger.propagate = False
    for _ in range(50):
        logger.warning("Transient error %s encountered while exporting traces to %s", "UNAVAILABLE", "x:4317")
    now["t"] += 61
    logger.warning("Transient error %s encountered while exporting traces to %s", "UNAVAILABLE", "x:4317")
    lines = [json.loads(x) for x in out.getvalue().splitlines()]  # every line is JSON
    assert len(lines) == 2
    assert lines[0]["level"] == "warning" and lines[0]["logger"] == "opentelemetry.test_bridge"
    assert lines[0]["msg"] == "Transient error UNAVAILABLE encountered while exporting traces to x:4317"
    assert "repeated" not in lines[0] and lines[1]["repeated"] == 49


def test_application_context_joins_the_sampled_trace_and_survives_a_reload(setup) -> None:
    """A probe record reaches the watcher, whose answer goes into every probe set's map (and into the new
    ones after a reload); a session whose thread held a sampled context becomes a child of its span."""
    world, agent, cfg, _log = setup
    world.publishing[7] = SimpleNamespace(tp_offset=-8, offset=0, modid=0)
    agent.start()
    errs = by_set(world, "__x64_sys_bpf")
    errs.pending = [records.AppProbeRec(7)]
    agent.runtime.poll_once()
    assert all(t.app_targets.get(7) == (-8, 0, 0, True) for t in world.live())
    trace_id, span_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    start, end = error_session(errs)
    app = records.SessionAppRec(7, 100, records.APP_OK, 0, trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big"),
                                1, 1, 5, b"\x00\x03/ok")
    errs.pending = [start, app, end]
    agent.runtime.poll_once()
    root, leaf = wait_exported(world, 2)
    assert root.context.trace_id == leaf.context.trace_id == trace_id and root.parent.span_id == span_id
    assert root.attributes["retsnoop.app.http.route"] == "/ok"
    assert root.attributes["retsnoop.app.service.name"] == "shop"
    from prometheus_client import generate_latest
    text = generate_latest(agent.runtime.metrics.registry()).decode()
    assert 'retsnoop_app_context_sessions_total{outcome="linked"} 1.0' in text
    old = world.live()
    cfg.write_text(AGENT_CONFIG.format(prob=0.5).replace("bpf_errors", "errors2"))
    assert agent.reload() is True
    assert not set(world.live()) & set(old)
    assert all(t.app_targets.get(7) == (-8, 0, 0, True) for t in world.live())


@pytest.mark.parametrize("served", [False, True])
def test_per_function_counts_are_kept_only_where_metrics_read_them(served: bool, world: World) -> None:
    """The kernel's per-function and per-session counts feed /metrics and the OTLP metrics push alone:
    `trace` without either loads its programs without them (a map update less per traced call)."""
    import socket

    from retsnoop_otel.runtime.runtime import Runtime
    from retsnoop_otel.trace import flags

    argv = []
    if served:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            argv = ["--metrics-addr", "127.0.0.1", "--metrics-port", str(s.getsockname()[1])]
    request = flags.parse(["-e", "*sys_bpf", "-a", "array_map_alloc_check", *argv], environ={})
    runtime = Runtime(request.config, world.deps())
    runtime.start()
    try:
        (t,) = world.live()
        assert t.cfg.func_counts is served
        assert t.cfg.workload_stats is False
    finally:
        runtime.shutdown(0.5)


def test_metrics_and_health_answer_only_once_every_probe_set_is_attached(setup) -> None:
    """Issue 49: /metrics answered while the kernel tables were still being read, and the calls a user made on
    seeing it were never counted. The port is bound at start (a busy one still fails first) but refuses
    connections until the probes are attached and start sessions."""
    import socket
    world, agent, cfg, _log = setup
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg.write_text(cfg.read_text().replace('listen: "127.0.0.1:0"', f'listen: "127.0.0.1:{port}"'))
    seen: list[str] = []
    real_factory = world.factory

    def factory(funcs, c, b):
        t = real_factory(funcs, c, b)
        orig = t.attach

        def attach(on_error=None, strict=False, ready=True):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=10).close()
                seen.append("answered")
            except ConnectionRefusedError:
                seen.append("refused")
            return orig(ready=ready)
        t.attach = attach  # type: ignore[method-assign]
        return t

    agent.deps.tracer_factory = factory
    agent.start()
    assert seen == ["refused", "refused"]
    assert all(t.ready for t in world.live())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        assert json.loads(resp.read())["attached_functions"] > 0


def test_a_reload_carries_each_probe_sets_counts_on(setup) -> None:
    """A set that a reload replaces hands its counts to the set of the same name: counters never go down, and
    what it counted after the last scrape is not lost; a set the new config drops takes its series along."""
    world, agent, cfg, _log = setup
    agent.start()
    def calls() -> dict[str, list[tuple[str, int]]]:
        return {ps.name: sorted((ps.funcs[s.func_id].name, s.calls) for s in ps.func_stats())
                for ps in agent.runtime.probe_sets}

    before = calls()
    assert before["bpf_errors"] == [("__sys_bpf", 3), ("__x64_sys_bpf", 3), ("array_map_alloc_check", 3)]
    cfg.write_text(AGENT_CONFIG.format(prob=0.5).replace("allow: [array_map_alloc_check]", "allow: [vfs_read]"))
    assert agent.reload() is True
    after = {name: dict(_sum(v)) for name, v in calls().items()}
    # each fake tracer counts 3 calls per function: the old set's 3 go on under the same names
    assert after["bpf_errors"] == {"__x64_sys_bpf": 6, "__sys_bpf": 6, "vfs_read": 3}
    assert after["prog_load"] == {name: 6 for name in dict(_sum(before["prog_load"]))}
    ps = agent.runtime.probe_sets[0]
    assert ps._prev is None and ps._carried is not None  # the old set is closed and let go
    assert ps.capture_stats() == ps.totals().capture
    # a second reload carries the carried counts on too
    assert agent.reload() is True
    assert dict(_sum(calls()["bpf_errors"]))["__x64_sys_bpf"] == 9


def _sum(pairs):
    out: dict = {}
    for name, n in pairs:
        out[name] = out.get(name, 0) + n
    return out.items()


def test_exported_traces_are_counted_by_the_service_their_spans_carry(setup) -> None:
    """retsnoop_traces_total: the service a trace backend holds a probe set's traces under (the alert rules' trace
    links read it), by status; bounded by metrics.max_workloads per probe set."""
    world, agent, _cfg, _log = setup
    agent.start()
    errs, loads = by_set(world, "__x64_sys_bpf"), by_set(world, "bpf_prog_load")
    errs.pending = error_session(errs)
    loads.pending = success_calls_session(loads)
    agent.runtime.poll_once()
    wait_exported(world, 5)
    port = agent.runtime.server.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'retsnoop_traces_total{probe_set="bpf_errors",service="python",status="error"} 1.0' in text
    assert 'retsnoop_traces_total{probe_set="prog_load",service="python",status="ok"} 1.0' in text


def test_trace_counts_keep_a_probe_sets_services_within_the_bound() -> None:
    from retsnoop_otel.metrics.trace_counts import TraceCounts
    counts = TraceCounts(max_services=2)
    for service in ("a", "b", "c", "a", "d"):
        counts.add("set", service, error=True)
    counts.add("other_set", "c", error=False)
    assert counts.snapshot() == {("set", "a", "error"): 2, ("set", "b", "error"): 1, ("set", "other", "error"): 2,
                                 ("other_set", "c", "ok"): 1}

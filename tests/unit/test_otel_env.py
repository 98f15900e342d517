"""The environment as defaults (sdk-environment-variables.md): the variables the tool honours besides the exporter's
(OTEL_LOG_LEVEL, OTEL_METRICS_EXEMPLAR_FILTER, OTEL_TRACES_EXPORTER=console), those it only warns about
(OTEL_TRACES_SAMPLER), and how every warning reaches the user once: the trace command's stderr, agent --check's
stderr, the agent's log at start and at each reload. Flags and config keys still refuse bad values."""

from __future__ import annotations

import ast
import io
import json
import urllib.request
from pathlib import Path

import pytest

from retsnoop_otel.agent.main import Agent, check
from retsnoop_otel.command.errors import InputError
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.export import otel_env
from retsnoop_otel.export.otel_env import EnvWarnings, exemplars_on, log_level
from retsnoop_otel.runtime.settings import run_settings
from retsnoop_otel.trace.flags import parse
from retsnoop_otel.trace.main import run_trace
from tests.fakes import AGENT_CONFIG, World, by_set, error_session, log_events, wait_exported

PKG = Path(__file__).resolve().parents[2] / "retsnoop_otel"


def _agent(tmp_path: Path, world: World, env: dict[str, str], text: str | None = None,
           console: io.StringIO | None = None) -> tuple[Agent, io.StringIO]:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0) if text is None else text)
    deps = world.deps(console)
    deps.environ = env
    log = io.StringIO()
    return Agent(str(path), deps, EventLog(log)), log


def _warnings(log: io.StringIO) -> list[str]:
    return [e["msg"] for e in log_events(log) if e["level"] == "warning"]


# ---- one module names every variable ----

def test_every_otel_variable_the_product_reads_is_named_in_one_module() -> None:
    """No OTEL_* string literal outside export/otel_env.py, except the thread and process context names (OTEP
    4947/4719: OTEL_CTX, OTEL_PYTHON_CONTEXT), which are not variables of the SDK."""
    found = {}
    for path in PKG.rglob("*.py"):
        if path.name == "otel_env.py" or path.parent.name in ("publisher", "appctx"):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if id(node) in docstrings:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("OTEL_") \
                    and node.value != "OTEL_CTX":
                found.setdefault(str(path.relative_to(PKG)), []).append(node.value)
            if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.Constant) and "OTEL_EXPORTER" in str(v.value)
                                                       for v in node.values):
                found.setdefault(str(path.relative_to(PKG)), []).append(ast.unparse(node))
    assert found == {}
    assert otel_env.otlp_var("TIMEOUT", "traces") == "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
    assert otel_env.otlp_var("ENDPOINT") == otel_env.OTLP_ENDPOINT


# ---- OTEL_LOG_LEVEL ----

@pytest.mark.parametrize(("value", "level"), [("debug", "debug"), ("INFO", "info"), ("warn", "warning"),
                                              ("error", "error"), ("trace", "debug"), ("fatal", "error"), ("", None)])
def test_log_levels_of_the_specification(value: str, level: str | None) -> None:
    warnings = EnvWarnings()
    assert log_level({"OTEL_LOG_LEVEL": value}, warnings) == level and warnings.messages == ()


@pytest.mark.parametrize(("env", "logging", "level"), [
    ({"OTEL_LOG_LEVEL": "debug"}, "", "debug"),
    ({"OTEL_LOG_LEVEL": "warn"}, "", "warning"),
    ({}, "", "info"),
    ({"OTEL_LOG_LEVEL": "debug"}, "  level: error\n", "error"),  # the config key wins
    ({"OTEL_LOG_LEVEL": "verbose"}, "", "info"),  # warned about, ignored
])
def test_otel_log_level_is_the_default_of_the_agents_logging_level(tmp_path: Path, world: World, env: dict,
                                                                   logging: str, level: str) -> None:
    text = AGENT_CONFIG.format(prob=1.0).replace("logging:\n  format: json\n", "logging:\n  format: json\n" + logging)
    agent, log = _agent(tmp_path, world, env, text)
    agent.start()
    try:
        assert agent.log.level == level
        assert agent.reload() and agent.log.level == level  # a reload resolves it the same way
    finally:
        agent.runtime.shutdown(0.5)
    said = _warnings(log)
    if env.get("OTEL_LOG_LEVEL") == "verbose":  # once at start, once at the reload
        assert said == ["OTEL_LOG_LEVEL='verbose': not a log level; write debug, info, warn or error (trace and fatal "
                        "are read as debug and error); ignored, as if unset"] * 2
    else:
        assert said == []


# ---- OTEL_METRICS_EXEMPLAR_FILTER ----

@pytest.mark.parametrize(("value", "on", "warned"), [("", True, False), ("trace_based", True, False),
                                                     ("ALWAYS_ON", True, False), ("always_off", False, False),
                                                     ("sometimes", True, True)])
def test_exemplar_filters(value: str, on: bool, warned: bool) -> None:
    warnings = EnvWarnings()
    assert exemplars_on({"OTEL_METRICS_EXEMPLAR_FILTER": value}, warnings) is on
    assert bool(warnings.messages) is warned


def _openmetrics(port: int) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


@pytest.mark.parametrize("value", ["trace_based", "always_off"])
def test_always_off_leaves_the_metrics_without_exemplars(tmp_path: Path, world: World, value: str) -> None:
    """The same exported session: its trace id is the duration histogram's exemplar, unless always_off."""
    from retsnoop_otel.capture import records
    from retsnoop_otel.capture.model import SessionStats
    agent, _log = _agent(tmp_path, world, {"OTEL_METRICS_EXEMPLAR_FILTER": value})
    agent.start()
    try:
        errs = by_set(world, "__x64_sys_bpf")
        buckets = [0] * records.DUR_BUCKETS
        buckets[12] = 1
        errs.session_stats = lambda: [SessionStats(errs.fid("__x64_sys_bpf"), 1, 1, tuple(buckets), 5000)]
        errs.pending = error_session(errs)
        agent.runtime.poll_once()
        trace_id = wait_exported(world, 2)[0].context.trace_id  # exported either way
        text = _openmetrics(agent.runtime.server.port)
    finally:
        agent.runtime.shutdown(0.5)
    assert 'retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="8.192e-06"' in text
    assert (f'# {{trace_id="{trace_id:032x}"}}' in text) is (value != "always_off")
    assert (" # {" in text) is (value != "always_off")


# ---- OTEL_TRACES_SAMPLER ----

def test_the_sampler_variables_are_warned_about_at_start_and_at_each_reload(tmp_path: Path, world: World) -> None:
    env = {"OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_TRACES_SAMPLER_ARG": "1"}
    agent, log = _agent(tmp_path, world, env)
    agent.start()
    try:
        assert _warnings(log) == [
            "OTEL_TRACES_SAMPLER='parentbased_always_on': not used: sessions are exported as the probe set's sampling "
            "says (agent: sampling.errors or errors_rate_per_s, success_probability or success_rate_per_s; trace: "
            "--error-probability, -S or -T); parentbased_always_on would export every successful kernel call; "
            "ignored, as if unset",
            "OTEL_TRACES_SAMPLER_ARG='1': not used (see OTEL_TRACES_SAMPLER); ignored, as if unset"]
        prog = agent.runtime.config.probe_sets[1]
        assert prog.sampling.success_probability == 1.0  # the probe set's, whatever the variable says
        assert agent.reload()
        assert len(_warnings(log)) == 4  # said again by the reload, each variable once
    finally:
        agent.runtime.shutdown(0.5)


# ---- where the warnings go ----

def test_trace_prints_each_warning_once_on_stderr(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon",
           "OTEL_METRICS_EXPORTER": "none,otlp", "OTEL_SOMETHING_ELSE": "whatever", "OTEL_PROPAGATORS": "b3"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    deps = world.deps()
    deps.environ = env
    out, err = io.StringIO(), io.StringIO()
    assert run_trace(["--dry-run", "-e", "*sys_bpf"], out, err, deps) == 0
    assert err.getvalue().splitlines() == [
        "retsnoop-otel: warning: OTEL_METRICS_EXPORTER='none,otlp': 'none' together with other exporters; give none "
        "alone; ignored, as if unset",
        "retsnoop-otel: warning: OTEL_EXPORTER_OTLP_TIMEOUT='soon': not a positive number; write a timeout > 0 in "
        "milliseconds, such as 10000; ignored, as if unset"]  # variables the tool does not read: nothing


def test_agent_check_prints_the_warnings_on_stderr(tmp_path: Path, world: World) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    deps = world.deps()
    deps.environ = {"OTEL_RESOURCE_ATTRIBUTES": "team=a,broken", "OTEL_BSP_SCHEDULE_DELAY": "1s"}
    out, err = io.StringIO(), io.StringIO()
    assert check(str(path), out, deps, err) == 0
    assert err.getvalue().splitlines() == [
        "retsnoop-otel agent: warning: OTEL_BSP_SCHEDULE_DELAY='1s': not a time in milliseconds; write a whole number "
        "of at least 0, such as 5000, or unset it for the default; ignored, as if unset",
        "retsnoop-otel agent: warning: OTEL_RESOURCE_ATTRIBUTES: entry 2 has no '=' (not shown: it may be part of a "
        "value); "
        "write it like key1=value1,key2=value2 with each value percent-encoded; ignored, as if unset"]
    assert out.getvalue().endswith("configuration is valid (2 probe sets)\n")


# ---- OTEL_TRACES_EXPORTER=console ----

def test_the_agent_prints_otlp_json_lines_on_stdout_with_the_console_exporter(tmp_path: Path, world: World) -> None:
    """console alone: the OTLP/JSON lines on stdout and no OTLP export; otlp,console: both."""
    for value, sent in (("console", False), ("otlp,console", True)):
        console = io.StringIO()
        world.exported.clear()
        agent, log = _agent(tmp_path, world, {"OTEL_TRACES_EXPORTER": value}, console=console)
        agent.start()
        errs = by_set(world, "__x64_sys_bpf")
        errs.pending = error_session(errs)
        agent.runtime.poll_once()
        agent.runtime.shutdown(5.0)
        (line,) = console.getvalue().splitlines()
        spans = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert [s["name"] for s in spans] == ["__x64_sys_bpf", "array_map_alloc_check"]
        assert bool(world.exported) is sent and _warnings(log) == []
        started = [e for e in log_events(log) if e["msg"] == "OTLP export turned off by the environment"]
        assert [e["variables"] for e in started] == ([] if sent else ["OTEL_TRACES_EXPORTER=console"])


def test_trace_makes_spans_for_the_console_exporter_alone() -> None:
    """trace exports only when asked: an endpoint, or the console exporter (then its sessions record calls)."""
    assert parse(["-e", "f"], environ={}).config.exporter.otlp is None
    cfg = parse(["-e", "f"], environ={"OTEL_TRACES_EXPORTER": "console"}).config
    assert cfg.probe_sets[0].mode == "calls" and cfg.exporter.otlp_needs_endpoint
    assert parse(["-e", "f"], environ={"OTEL_TRACES_EXPORTER": "zipkin"}).config.probe_sets[0].mode == "stack"


# ---- resolution: a bad variable falls back, a bad flag or key is refused ----

def _settings(argv: list[str], env: dict[str, str]):
    return run_settings(parse(argv, environ=env).config, env, "/", lambda _s, _n: None)


def test_a_bad_signal_endpoint_falls_back_to_the_generic_one() -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318"}
    s = _settings(["-e", "f"], env)
    assert s.traces is not None and s.traces.url == "http://gw:4318/v1/traces"
    (text,) = s.warnings
    assert text.startswith("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='collector:4318': not an http:// or https:// URL")


def test_trace_with_only_an_unusable_endpoint_variable_exports_nothing() -> None:
    """Not the specification's default endpoint: trace sends only where it was told to."""
    s = _settings(["-e", "f"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://gw"})
    assert s.traces is None and s.config.exporter.otlp is None and len(s.warnings) == 1


def test_the_flag_still_refuses_a_bad_value_whatever_the_variables_say() -> None:
    with pytest.raises(InputError, match="^--otlp-endpoint='gw:4318': not an http:// or https:// URL"):
        _settings(["-e", "f", "--otlp-endpoint", "gw:4318"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318"})


def test_the_event_limits_reach_the_encoder(tmp_path: Path, world: World) -> None:
    env = {"OTEL_SPAN_EVENT_COUNT_LIMIT": "3", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "2"}
    agent, _log = _agent(tmp_path, world, env)
    agent.start()
    try:
        errs = by_set(world, "__x64_sys_bpf")
        encoder = agent.runtime.route.sinks._outputs(agent.runtime.probe_sets[0]).encoder  # noqa: SLF001
        assert errs is not None and (encoder.event_limit, encoder.event_attribute_limit) == (3, 2)
    finally:
        agent.runtime.shutdown(0.5)

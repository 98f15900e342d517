"""OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER: read once, applied to the run's config; a
value that is none of theirs is warned about once and ignored."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.export.otel_env import EnvWarnings
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.runtime.config import ExporterConfig, MetricsConfig, RuntimeConfig
from retsnoop_otel.runtime.sdk_env import SdkSwitches, apply_switches, read_switches
from tests.fakes import AGENT_CONFIG, World, by_set, error_session, log_events


@pytest.mark.parametrize(("env", "want"), [
    ({}, SdkSwitches(True, True, "")),
    ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "prometheus,otlp"},
     SdkSwitches(True, True, "")),
    ({"OTEL_SDK_DISABLED": "TRUE"}, SdkSwitches(False, False, "OTEL_SDK_DISABLED=true", file=False)),
    ({"OTEL_TRACES_EXPORTER": " none "}, SdkSwitches(False, True, "OTEL_TRACES_EXPORTER=none", file=False)),
    ({"OTEL_METRICS_EXPORTER": "none", "OTEL_SDK_DISABLED": ""},
     SdkSwitches(True, False, "OTEL_METRICS_EXPORTER=none")),
    ({"OTEL_TRACES_EXPORTER": "Console"}, SdkSwitches(False, True, "OTEL_TRACES_EXPORTER=console", console=True)),
    ({"OTEL_TRACES_EXPORTER": "otlp, console"}, SdkSwitches(True, True, "", console=True)),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
     SdkSwitches(False, False, "OTEL_SDK_DISABLED=true", file=False)),
])
def test_switches(env: dict[str, str], want: SdkSwitches) -> None:
    warnings = EnvWarnings()
    assert read_switches(env, warnings) == want
    assert warnings.messages == ()


@pytest.mark.parametrize(("env", "want", "message"), [
    ({"OTEL_SDK_DISABLED": "yes"}, SdkSwitches(),
     "OTEL_SDK_DISABLED='yes': not a boolean; write true or false; ignored, as if unset"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, SdkSwitches(),
     "OTEL_TRACES_EXPORTER='zipkin': 'zipkin' is not an exporter this tool has (otlp, console, none); ignored, "
     "as if unset"),
    ({"OTEL_TRACES_EXPORTER": "jaeger,console,zipkin"}, SdkSwitches(False, True, "OTEL_TRACES_EXPORTER=console",
                                                                    console=True),
     "OTEL_TRACES_EXPORTER='jaeger,console,zipkin': 'jaeger', 'zipkin' are not exporters this tool has (otlp, console, "
     "none); left out, console used"),
    ({"OTEL_METRICS_EXPORTER": "none,otlp"}, SdkSwitches(),
     "OTEL_METRICS_EXPORTER='none,otlp': 'none' together with other exporters; give none alone; ignored, as if unset"),
    ({"OTEL_METRICS_EXPORTER": "logging"}, SdkSwitches(),
     "OTEL_METRICS_EXPORTER='logging': 'logging' is not an exporter this tool has (otlp, prometheus, "
     "none); ignored, as if unset"),
])
def test_values_that_are_not_switches_are_warned_about_and_ignored(env: dict[str, str], want: SdkSwitches,
                                                                   message: str) -> None:
    warnings = EnvWarnings()
    assert read_switches(env, warnings) == want
    assert warnings.messages == (message,)


def test_applied_to_the_config() -> None:
    cfg = RuntimeConfig(probe_sets=(), exporter=ExporterConfig(otlp=OtlpConfig(), file="/tmp/x.jsonl"),
                        metrics=MetricsConfig(otlp=OtlpConfig()))
    off = apply_switches(cfg, SdkSwitches(False, False, "x", file=False))
    assert (off.exporter.otlp, off.exporter.file, off.metrics.otlp, off.exporter.spans) == (None, None, None, False)
    assert apply_switches(cfg, SdkSwitches(True, True, "")) == cfg
    console = apply_switches(cfg, SdkSwitches(False, True, "x", console=True))  # console alone: no OTLP export
    assert (console.exporter.otlp, console.exporter.file, console.exporter.otlp_console) == (None, "/tmp/x.jsonl",
                                                                                             True)
    both = apply_switches(cfg, SdkSwitches(True, True, "", console=True))
    assert both.exporter == cfg.exporter._replace(otlp_console=True)


@pytest.mark.parametrize("disabled", [False, True])
def test_sdk_disabled_agent_exports_nothing_and_says_why(tmp_path: Path, disabled: bool, world: World) -> None:
    """The shipped kind of config (an OTLP exporter): the same failing session is exported, unless
    OTEL_SDK_DISABLED=true, when nothing is sent and the log says which variable turned it off."""
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    deps = world.deps()
    deps.environ = {"OTEL_SDK_DISABLED": "true"} if disabled else {}
    log = io.StringIO()
    agent = Agent(str(path), deps, EventLog(log))
    try:
        agent.start()
        errs = by_set(world, "__x64_sys_bpf")
        errs.pending = error_session(errs)
        agent.runtime.poll_once()
        assert agent.runtime.route.sinks is not None and bool(agent.runtime.route.sinks.exporters) is not disabled
    finally:
        agent.runtime.shutdown(2.0)
    assert bool(world.exported) is not disabled
    events = [e for e in log_events(log) if e["msg"] == "OTLP export turned off by the environment"]
    assert [e["variables"] for e in events] == (["OTEL_SDK_DISABLED=true"] if disabled else [])

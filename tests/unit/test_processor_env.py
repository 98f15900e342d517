"""OTEL_BSP_* and OTEL_METRIC_EXPORT_*: read as the SDKs read them, warned about once and ignored when they are no
number, applied to the exporters, and a config key given explicitly wins."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.export.otel_env import EnvWarnings
from retsnoop_otel.export.processor_env import BatchSettings, ReaderSettings, batch_settings, bounded, reader_settings
from tests.fakes import AGENT_CONFIG, World, log_events

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def test_read_in_milliseconds_and_spans() -> None:
    assert batch_settings({}) == BatchSettings(0.0, None, None, 512)
    assert batch_settings({"OTEL_BSP_MAX_QUEUE_SIZE": "100"}) == BatchSettings(0.0, None, 100, 100)  # at most the queue
    env = {"OTEL_BSP_SCHEDULE_DELAY": "250", "OTEL_BSP_EXPORT_TIMEOUT": " 1500 ", "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
           "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64", "OTEL_METRIC_EXPORT_INTERVAL": "15000",
           "OTEL_METRIC_EXPORT_TIMEOUT": "2000"}
    assert batch_settings(env) == BatchSettings(0.25, 1.5, 4096, 64)
    assert reader_settings(env) == ReaderSettings(15.0, 2.0)
    assert reader_settings({"OTEL_METRIC_EXPORT_INTERVAL": ""}) == ReaderSettings(None, None)
    assert batch_settings({"OTEL_BSP_SCHEDULE_DELAY": "0"}).schedule_delay_s == 0.0
    assert bounded(10.0, 1.5) == 1.5 and bounded(10.0, None) == 10.0 and bounded(1.0, 30.0) == 1.0


@pytest.mark.parametrize(("env", "message"), [
    ({"OTEL_BSP_SCHEDULE_DELAY": "5s"}, "OTEL_BSP_SCHEDULE_DELAY='5s': not a time in milliseconds; write a whole "
                                        "number of at least 0, such as 5000, or unset it for the default; ignored, as "
                                        "if unset"),
    ({"OTEL_BSP_EXPORT_TIMEOUT": "0"}, "OTEL_BSP_EXPORT_TIMEOUT='0': not a time in milliseconds; write a whole "
                                       "number of at least 1"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "-1"}, "OTEL_BSP_MAX_QUEUE_SIZE='-1': not a number of spans"),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1e3"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE='1e3': not a number of spans"),
    ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "600", "OTEL_BSP_MAX_QUEUE_SIZE": "512"},
     "OTEL_BSP_MAX_EXPORT_BATCH_SIZE='600': larger than OTEL_BSP_MAX_QUEUE_SIZE=512; a batch is taken from the "
     "queue"),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "1.5"}, "OTEL_METRIC_EXPORT_INTERVAL='1.5': not a time in milliseconds"),
    ({"OTEL_METRIC_EXPORT_TIMEOUT": "9" * 20}, "OTEL_METRIC_EXPORT_TIMEOUT='" + "9" * 20),
    ({"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "exponential"},
     "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION='exponential': not a histogram aggregation; write "
     "explicit_bucket_histogram or base2_exponential_bucket_histogram"),
    ({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "sometimes"},
     "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE='sometimes': not a temporality; write cumulative, delta "
     "or lowmemory"),
])
def test_values_that_are_no_number_are_warned_about_and_ignored(env: dict[str, str], message: str) -> None:
    """One warning naming the variable; the settings are the defaults', as if it were unset (a batch larger
    than the queue: the queue's size)."""
    warnings = EnvWarnings()
    batch, reader = batch_settings(env, warnings), reader_settings(env, warnings)
    (text,) = warnings.messages
    assert text.startswith(message) and text.endswith("; ignored, as if unset"), text
    var = text.split("=")[0]
    rest = {k: v for k, v in env.items() if k != var}
    assert (batch, reader) == (batch_settings(rest), reader_settings(rest))
    assert batch.max_batch_spans <= (batch.max_queue_spans or 65536)  # a batch is at most the queue's size


def _agent(tmp_path: Path, world: World, env: dict[str, str], extra: str = "", metrics: str = "") -> Agent:
    path = tmp_path / "agent.yaml"
    text = AGENT_CONFIG.format(prob=1.0) + extra
    if metrics:
        text = text.replace('metrics:\n  listen: "127.0.0.1:0"\n', 'metrics:\n  listen: "127.0.0.1:0"\n' + metrics)
    path.write_text(text)
    deps = world.deps()
    deps.environ = env
    made = world.made = []  # type: ignore[attr-defined]
    inner = deps.make_sender

    def sender(settings):  # the settings each exporter was built with
        made.append(settings)
        return inner(settings)

    deps.make_sender = sender
    return Agent(str(path), deps, EventLog(io.StringIO()))


def test_the_agent_warns_about_them_at_start_and_uses_the_defaults(tmp_path: Path, world: World) -> None:
    agent = _agent(tmp_path, world, {"OTEL_BSP_MAX_QUEUE_SIZE": "lots", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100"})
    log = agent.log._stream  # noqa: SLF001
    agent.start()
    try:
        (sink,) = agent.runtime.route.sinks.exporters
        assert (sink._max_queue, sink._max_batch) == (65536, 100)  # noqa: SLF001
        assert world.tracers  # attached
    finally:
        agent.runtime.shutdown(1.0)
    warned = [e for e in log_events(log) if e["level"] == "warning"]
    assert [e["msg"] for e in warned] == ["OTEL_BSP_MAX_QUEUE_SIZE='lots': not a number of spans; write a whole number "
                                          "of at least 1, such as 65536, or unset it for the default; ignored, as if "
                                          "unset"]


@pytest.mark.parametrize(("extra", "queue"), [("", 1000), ("limits:\n  export_queue_spans: 300\n", 300)])
def test_the_trace_exporter_takes_them_and_the_config_key_wins(tmp_path: Path, extra: str, queue: int,
                                                               world: World) -> None:
    env = {"OTEL_BSP_MAX_QUEUE_SIZE": "1000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
           "OTEL_BSP_EXPORT_TIMEOUT": "700", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    agent = _agent(tmp_path, world, env, extra)
    agent.start()
    try:
        (sink,) = agent.runtime.route.sinks.exporters
        assert (sink._max_queue, sink._max_batch, sink._delay) == (queue, 100, 0.05)  # noqa: SLF001
        assert [s.timeout_s for s in world.made if s.signal == "traces"] == [0.7]
    finally:
        agent.runtime.shutdown(1.0)


@pytest.mark.parametrize(("interval", "want"), [("", 1.0), ("  otlp_interval: 3600\n", 3600.0)])
def test_the_metrics_push_takes_them_and_the_config_key_wins(tmp_path: Path, interval: str, want: float,
                                                             world: World) -> None:
    """OTEL_METRIC_EXPORT_INTERVAL=1000 with no metrics.otlp_interval: a push within seconds (the default
    would wait a minute); the key, when given, wins; OTEL_METRIC_EXPORT_TIMEOUT bounds the exporter's."""
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_METRIC_EXPORT_TIMEOUT": "1200",
           "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
           "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "Base2_Exponential_Bucket_Histogram"}
    agent = _agent(tmp_path, world, env, metrics='  otlp: {endpoint: "http://127.0.0.1:4318"}\n' + interval)
    agent.start()
    try:
        assert agent.runtime.metrics_push._interval == want  # noqa: SLF001
        assert [s.timeout_s for s in world.made if s.signal == "metrics"] == [1.2]
        deadline = time.monotonic() + 10
        while want == 1.0 and not any(s.signal == "metrics" for s, _ in world.requests) \
                and time.monotonic() < deadline:
            agent.runtime.poll_once()
        pushed = [ExportMetricsServiceRequest.FromString(body) for s, body in world.requests if s.signal == "metrics"]
        assert bool(pushed) == (want == 1.0)
        sums = [m.sum for r in pushed for m in r.resource_metrics[0].scope_metrics[0].metrics if m.HasField("sum")]
        assert all(s.aggregation_temporality == DELTA for s in sums) and (sums or not pushed)
        names = {m.name: m.WhichOneof("data") for r in pushed for m in r.resource_metrics[0].scope_metrics[0].metrics}
        assert not pushed or names["retsnoop_function_duration_nanoseconds"] == "exponential_histogram"
    finally:
        agent.runtime.shutdown(1.0)

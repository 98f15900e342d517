"""OTLP metrics export: the collectors' families converted exactly, pushed to a real receiver over gRPC and HTTP."""

from __future__ import annotations

import socket
import time

import pytest
from google.protobuf.json_format import MessageToDict

from retsnoop_otel.capture.model import CaptureStats, FuncStats, RetKind, TracedFunc
from retsnoop_otel.export.metrics_push import OtlpMetricsPusher, metrics_request
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.export.semconv import SCHEMA_URL
from retsnoop_otel.export.senders import build_sender
from retsnoop_otel.metrics.kernel_families import KernelCollector
from retsnoop_otel.metrics.otlp_units import OTLP_UNITS
from retsnoop_otel.runtime.config import AGENT_NAMES
from retsnoop_otel.runtime.settings import otlp_settings
from tests.fakes import FakeProbeSet
from tests.otlp_receiver import start_receiver

FUNCS = {0: TracedFunc(0, "do_open", 0, RetKind.INT32, True), 1: TracedFunc(1, "may_open", 0, RetKind.INT32, False)}


def collector(calls: list[int]) -> KernelCollector:
    """`calls[0]` grows between pushes, so a test can tell a later push from an earlier one."""
    ps = FakeProbeSet(name="vfs", funcs=FUNCS, capture=CaptureStats(
        dropped_sessions=2, incomplete_sessions=0, dropped_records=7, sessions_started=20, sessions_reported=18),
        stats=lambda: [FuncStats(0, calls[0], {"EINVAL": 1}, (0, 1, 0, calls[0] - 1), 1_500_000_000),
                       FuncStats(1, 4, {"EPERM": 2}, (0, 0, 4, 0), 40)])
    return KernelCollector(lambda: [ps], stats_enabled=lambda: False)


def sender(port: int, protocol: str | None, timeout_s: float = 5, environ: dict[str, str] | None = None):
    cfg = OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout_s=timeout_s)
    return build_sender(otlp_settings(cfg, "metrics", AGENT_NAMES.metrics_otlp, environ or {}))


def point_attrs(point) -> dict:
    return {a.key: a.value.string_value for a in point.attributes}


def test_families_convert_to_sums_gauges_and_explicit_bucket_histograms() -> None:
    request = metrics_request(collector([3]).collect(), {"service.instance.id": "t"}, 10, 20, OTLP_UNITS, SCHEMA_URL)
    (rm,) = request.resource_metrics
    assert {a.key: a.value.string_value for a in rm.resource.attributes} == {"service.instance.id": "t"}
    assert rm.schema_url == SCHEMA_URL and rm.scope_metrics[0].schema_url == ""  # our own metric names
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    calls = metrics["retsnoop_function_calls"]
    assert calls.WhichOneof("data") == "sum" and calls.sum.is_monotonic and calls.unit == "{call}"
    assert metrics["retsnoop_function_errors"].unit == "{error}"
    assert metrics["retsnoop_attached_functions"].unit == "{function}"  # not "1": no _ratio suffix for a gauge
    assert {(point_attrs(p)["function"], p.as_int) for p in calls.sum.data_points} == {("do_open", 3), ("may_open", 4)}
    errors = metrics["retsnoop_function_errors"]
    assert {(point_attrs(p)["function"], point_attrs(p)["error_type"], p.as_int) for p in errors.sum.data_points} == {
        ("do_open", "EINVAL", 1), ("may_open", "EPERM", 2)}
    hist = metrics["retsnoop_function_duration_seconds"]
    assert hist.WhichOneof("data") == "histogram" and hist.unit == "s"
    point = next(p for p in hist.histogram.data_points if point_attrs(p)["function"] == "do_open")
    assert list(point.explicit_bounds) == [2e-9, 4e-9, 8e-9]  # log2 ns bounds; the kernel's last bucket is +Inf
    assert list(point.bucket_counts) == [0, 1, 0, 2] and point.count == 3 and point.sum == pytest.approx(1.5)
    assert "le" not in point_attrs(point) and point_attrs(point)["probe_set"] == "vfs"
    assert point.start_time_unix_nano == 10 and point.time_unix_nano == 20
    assert metrics["retsnoop_records_lost"].sum.data_points[0].as_int == 7
    assert metrics["retsnoop_attached_functions"].WhichOneof("data") == "gauge"
    assert "retsnoop_bpf_program_runs" not in metrics  # families without samples are left out


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_pusher_sends_to_a_real_receiver_and_pushes_once_more_on_stop(protocol: str) -> None:
    receiver = start_receiver(port=0, http_port=0)
    try:
        port = receiver.port if protocol == "grpc" else receiver.http_port
        calls = [3]
        pusher = OtlpMetricsPusher(lambda: collector(calls).collect(), sender(port, protocol),
                                   {"service.instance.id": "t"}, interval_s=0.2, units=OTLP_UNITS,
                                   schema_url=SCHEMA_URL).start()
        deadline = time.monotonic() + 20
        while not receiver.metric_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver.metric_requests, "no periodic push"
        calls[0] = 9
        pusher.stop()
        assert pusher.stats.failures == 0 and pusher.stats.pushes >= 2
        last = MessageToDict(receiver.metric_requests[-1])
        metrics = {m["name"]: m for m in last["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]}
        points = metrics["retsnoop_function_calls"]["sum"]["dataPoints"]
        values = {next(a["value"]["stringValue"] for a in p["attributes"] if a["key"] == "function"): p["asInt"]
                  for p in points}
        assert values == {"do_open": "9", "may_open": "4"}  # the final push carries the latest counts
        assert metrics["retsnoop_function_calls"]["sum"]["isMonotonic"] is True
        hist = metrics["retsnoop_function_duration_seconds"]["histogram"]["dataPoints"]
        assert {p["count"] for p in hist} == {"9", "4"}
        # units and the schema URL as the receiver got them
        assert last["resourceMetrics"][0]["schemaUrl"] == SCHEMA_URL
        assert {name: m.get("unit", "") for name, m in metrics.items()} == {
            name: OTLP_UNITS[name] for name in metrics}
        assert metrics["retsnoop_function_calls"]["unit"] == "{call}"
        assert metrics["retsnoop_function_duration_seconds"]["unit"] == "s"
        assert metrics["retsnoop_records_lost"]["unit"] == "{record}"
    finally:
        receiver.stop()


def test_metrics_protocol_comes_from_the_metrics_variable() -> None:
    """OTEL_EXPORTER_OTLP_METRICS_PROTOCOL picks OTLP/HTTP for metrics over a generic gRPC setting: the push
    reaches the receiver's HTTP port, as a POST to /v1/metrics."""
    receiver = start_receiver(port=0, http_port=0)
    try:
        environ = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}
        pusher = OtlpMetricsPusher(lambda: collector([3]).collect(), sender(receiver.http_port, None, environ=environ),
                                   {"service.instance.id": "t"}, interval_s=3600, units=OTLP_UNITS)
        assert pusher.push(), pusher.last_error
        pusher.stop(final_push=False)
        assert len(receiver.metric_requests) == 1 and receiver.http_peers  # it came over HTTP
    finally:
        receiver.stop()


def test_pusher_counts_failures_when_nobody_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pusher = OtlpMetricsPusher(lambda: collector([3]).collect(), sender(port, "http/protobuf", 1),
                               {"service.instance.id": "t"}, interval_s=3600)
    assert pusher.push() is False
    pusher.stop(final_push=False)
    assert pusher.stats.pushes == 1 and pusher.stats.failures == 1 and pusher.last_error


def test_delta_and_exponential_pushes_reach_a_real_receiver_as_set() -> None:
    """The reader variables as the receiver gets them: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta (the
    second push carries what changed since the first) and ..._DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_
    bucket_histogram (the kernel's slots one for one, in nanoseconds)."""
    from retsnoop_otel.export.processor_env import reader_settings
    reader = reader_settings({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
                              "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION":
                                  "base2_exponential_bucket_histogram"})
    receiver = start_receiver(port=0, http_port=0)
    try:
        calls = [3]
        pusher = OtlpMetricsPusher(lambda: collector(calls).collect(), sender(receiver.port, "grpc"),
                                   {"service.instance.id": "t"}, interval_s=3600, units=OTLP_UNITS,
                                   temporality=reader.temporality, exponential=reader.exponential)
        assert pusher.push(), pusher.last_error
        calls[0] = 9
        assert pusher.push(), pusher.last_error
        pusher.stop(final_push=False)
        first, second = (MessageToDict(r)["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
                         for r in receiver.metric_requests)

        def by_function(metrics: list, name: str, kind: str) -> dict:
            m = next(m for m in metrics if m["name"] == name)
            assert m[kind].get("aggregationTemporality") == "AGGREGATION_TEMPORALITY_DELTA"
            return {next(a["value"]["stringValue"] for a in p["attributes"] if a["key"] == "function"): p
                    for p in m[kind]["dataPoints"]}

        assert {f: p["asInt"] for f, p in by_function(second, "retsnoop_function_calls", "sum").items()} == {
            "do_open": "6", "may_open": "0"}
        hist = by_function(first, "retsnoop_function_duration_nanoseconds", "exponentialHistogram")
        assert hist["do_open"]["positive"] == {"offset": 1, "bucketCounts": ["1", "0", "2"]}  # slots (0, 1, 0, 2)
        assert hist["may_open"]["positive"] == {"offset": 2, "bucketCounts": ["4"]}
        later = by_function(second, "retsnoop_function_duration_nanoseconds", "exponentialHistogram")
        assert later["do_open"]["positive"] == {"offset": 3, "bucketCounts": ["6"]}
        assert later["may_open"].get("positive", {}) == {} and later["may_open"].get("count", "0") == "0"
    finally:
        receiver.stop()

"""OTLP metrics export: the collector's families converted exactly, pushed to a real receiver over gRPC and HTTP."""

from __future__ import annotations

import time

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.sdk.metrics.export import Histogram, Sum

from retsnoop_otel.capture.model import CaptureStats, FuncStats, RetKind, TracedFunc
from retsnoop_otel.export.exporters import build_otlp_metric_exporter
from retsnoop_otel.export.otlp_metrics import OtlpMetricsPusher, metrics_data
from retsnoop_otel.export.resource import build_resource
from retsnoop_otel.metrics.collector import MetricsCollector
from retsnoop_otel.runtime.config import OtlpConfig
from tests.otlp_receiver import start_receiver

FUNCS = {0: TracedFunc(0, "do_open", 0, RetKind.INT32, True), 1: TracedFunc(1, "may_open", 0, RetKind.INT32, False)}


def collector(calls: list[int]) -> MetricsCollector:
    """`calls[0]` grows between pushes, so a test can tell a later push from an earlier one."""
    return MetricsCollector(
        "vfs", FUNCS,
        lambda: [FuncStats(0, calls[0], {"EINVAL": 1}, (0, 1, 0, calls[0] - 1), 1_500_000_000),
                 FuncStats(1, 4, {"EPERM": 2}, (0, 0, 4, 0), 40)],
        lambda: CaptureStats(dropped_sessions=2, incomplete_sessions=0, dropped_records=7,
                             sessions_started=20, sessions_reported=18))


def test_families_convert_to_sums_gauges_and_explicit_bucket_histograms() -> None:
    data = metrics_data(collector([3]).collect(), build_resource(instance_id="t"), 10, 20)
    (rm,) = data.resource_metrics
    assert rm.resource.attributes["service.instance.id"] == "t"
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    calls = metrics["retsnoop_function_calls"]
    assert isinstance(calls.data, Sum) and calls.data.is_monotonic and calls.unit == "1"
    assert {(p.attributes["function"], p.value) for p in calls.data.data_points} == {("do_open", 3), ("may_open", 4)}
    errors = metrics["retsnoop_function_errors"]
    assert {(p.attributes["function"], p.attributes["error_type"], p.value) for p in errors.data.data_points} == {
        ("do_open", "EINVAL", 1), ("may_open", "EPERM", 2)}
    hist = metrics["retsnoop_function_duration_seconds"]
    assert isinstance(hist.data, Histogram) and hist.unit == "s"
    point = next(p for p in hist.data.data_points if p.attributes["function"] == "do_open")
    assert point.explicit_bounds == [2e-9, 4e-9, 8e-9]  # log2 ns bounds; the kernel's last bucket is +Inf
    assert list(point.bucket_counts) == [0, 1, 0, 2] and point.count == 3 and point.sum == pytest.approx(1.5)
    assert "le" not in point.attributes and point.attributes["probe_set"] == "vfs"
    assert point.start_time_unix_nano == 10 and point.time_unix_nano == 20
    assert metrics["retsnoop_records_lost"].data.data_points[0].value == 7
    assert all(m.data.data_points for m in metrics.values())


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_pusher_sends_to_a_real_receiver_and_pushes_once_more_on_stop(protocol: str) -> None:
    receiver = start_receiver(port=0, http_port=0)
    try:
        port = receiver.port if protocol == "grpc" else receiver.http_port
        exporter = build_otlp_metric_exporter(
            OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout_s=5))
        calls = [3]
        pusher = OtlpMetricsPusher(lambda: collector(calls).collect(), exporter, build_resource(instance_id="t"),
                                   interval_s=0.2).start()
        deadline = time.monotonic() + 20
        while not receiver.metric_requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver.metric_requests, "no periodic push arrived"
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
    finally:
        receiver.stop()


def test_pusher_counts_failures_when_nobody_listens() -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = build_otlp_metric_exporter(
        OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol="http/protobuf", timeout_s=1))
    pusher = OtlpMetricsPusher(lambda: collector([3]).collect(), exporter, build_resource(instance_id="t"),
                               interval_s=3600)
    assert pusher.push() is False
    pusher.stop(final_push=False)
    assert pusher.stats.pushes == 1 and pusher.stats.failures == 1

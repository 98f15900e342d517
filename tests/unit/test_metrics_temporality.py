"""OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE: successive pushes of kernel totals as deltas."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from retsnoop_otel.export.metrics_push import OtlpMetricsPusher
from retsnoop_otel.export.otel_env import EnvWarnings
from retsnoop_otel.export.processor_env import reader_settings
from retsnoop_otel.export.sending import SendResult

DELTA, CUMULATIVE = (pb.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA,
                     pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE)


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []

    def send(self, body: bytes, items: int) -> SendResult:
        self.requests.append(ExportMetricsServiceRequest.FromString(body))
        return SendResult(True)

    def shutdown(self) -> None:
        pass


def families(calls: dict[str, int], buckets: list[tuple[str, int]], hsum: float, up: int = 1) -> list:
    c = CounterMetricFamily("retsnoop_function_calls", "calls", labels=["function"])
    for fn, n in calls.items():
        c.add_metric([fn], n)
    h = HistogramMetricFamily("retsnoop_function_duration_seconds", "d", labels=["function"])
    h.add_metric(["f"], buckets, hsum)
    g = GaugeMetricFamily("retsnoop_agent_up", "up")
    g.add_metric([], up)
    return [c, h, g]


def pushes(preference: str, readings: list[list]) -> list[dict]:
    receiver, clock = Receiver(), iter(range(1000, 100000, 1000))
    it = iter(readings)
    pusher = OtlpMetricsPusher(lambda: next(it), receiver, {}, 60.0, lambda: next(clock), temporality=preference)
    for _ in readings:
        assert pusher.push()
    out = []
    for request in receiver.requests:
        ms = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
        calls = ms["retsnoop_function_calls"].sum
        hist = ms["retsnoop_function_duration_seconds"].histogram
        out.append({"calls": {p.attributes[0].value.string_value: (p.as_int, p.start_time_unix_nano, p.time_unix_nano)
                              for p in calls.data_points},
                    "calls_temporality": calls.aggregation_temporality,
                    "hist": [(p.count, p.sum, list(p.bucket_counts), p.start_time_unix_nano) for p in hist.data_points],
                    "hist_temporality": hist.aggregation_temporality,
                    "up": ms["retsnoop_agent_up"].gauge.data_points[0].as_int})
    return out


READINGS = [
    families({"f": 5}, [("0.001", 2), ("0.01", 3), ("+Inf", 3)], 0.012),
    families({"f": 8, "g": 1}, [("0.001", 2), ("0.01", 6), ("+Inf", 7)], 0.05),
    families({"f": 3, "g": 4}, [("0.001", 3), ("0.01", 7), ("+Inf", 9)], 0.07),  # f went down: its maps were replaced
]


def test_delta_sums_and_histograms_over_the_time_since_the_previous_push() -> None:
    got = pushes("delta", READINGS)
    assert [p["calls"] for p in got] == [
        {"f": (5, 1000, 2000)},
        {"f": (3, 2000, 3000), "g": (1, 2000, 3000)},  # g is new: all of it, since the previous push
        {"f": (3, 3000, 4000), "g": (3, 3000, 4000)},  # f started over
    ]
    assert [p["hist"] for p in got] == [[(3, 0.012, [2, 1, 0], 1000)],
                                        [(4, pytest.approx(0.038), [0, 3, 1], 2000)],
                                        [(2, pytest.approx(0.02), [1, 0, 1], 3000)]]
    assert {p["calls_temporality"] for p in got} == {p["hist_temporality"] for p in got} == {DELTA}
    assert [p["up"] for p in got] == [1, 1, 1]  # gauges stay as they are


def test_lowmemory_turns_only_the_histograms_and_cumulative_nothing() -> None:
    low = pushes("lowmemory", READINGS)
    assert [p["calls"]["f"][0] for p in low] == [5, 8, 3] and low[1]["calls_temporality"] == CUMULATIVE
    assert [p["hist"][0][0] for p in low] == [3, 4, 2] and low[1]["hist_temporality"] == DELTA
    same = pushes("cumulative", READINGS)
    assert [p["calls"]["f"] for p in same] == [(5, 1000, 2000), (8, 1000, 3000), (3, 1000, 4000)]
    assert [p["hist"][0][:3] for p in same] == [(3, 0.012, [2, 1, 0]), (7, 0.05, [2, 4, 1]), (9, 0.07, [3, 4, 2])]
    assert {p["hist_temporality"] for p in same} == {CUMULATIVE}


def test_the_preference_is_read_as_the_sdks_read_it() -> None:
    assert reader_settings({}).temporality == "cumulative"
    assert reader_settings({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": " Delta "}).temporality == "delta"
    warnings = EnvWarnings()  # not a temporality: warned about, and the default applies
    assert reader_settings({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "deltas"}, warnings).temporality == \
        "cumulative"
    assert warnings.messages == ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE='deltas': not a temporality; write "
                                 "cumulative, delta or lowmemory; ignored, as if unset",)


def test_delta_exponential_histograms_line_up_buckets_whose_offset_moved() -> None:
    """A slot below the previous lowest one appears: the offset moves down, the deltas stay per slot."""
    def reading(counts: dict[int, int]) -> list:
        h = HistogramMetricFamily("retsnoop_function_duration_seconds", "d", labels=["function"])
        total, buckets = 0, []
        for k in range(1, 8):  # le = 2^k ns: slot k - 1
            total += counts.get(k - 1, 0)
            buckets.append((repr(2**k / 1e9), total))
        h.add_metric(["f"], [*buckets, ("+Inf", total)], total * 1e-9)
        return [h]

    receiver, clock = Receiver(), iter(range(1000, 100000, 1000))
    it = iter([reading({3: 2, 5: 1}), reading({1: 4, 3: 2, 5: 3}), reading({5: 1})])
    pusher = OtlpMetricsPusher(lambda: next(it), receiver, {}, 60.0, lambda: next(clock), temporality="delta",
                               exponential=True)
    for _ in range(3):
        assert pusher.push()
    got = []
    for request in receiver.requests:
        (metric,) = request.resource_metrics[0].scope_metrics[0].metrics
        (p,) = metric.exponential_histogram.data_points
        assert metric.exponential_histogram.aggregation_temporality == DELTA and metric.unit == "ns"
        got.append((p.count, p.positive.offset, list(p.positive.bucket_counts), p.start_time_unix_nano))
    assert got == [(3, 3, [2, 0, 1], 1000), (6, 1, [4, 0, 0, 0, 2], 2000), (1, 5, [1], 3000)]  # the last: anew

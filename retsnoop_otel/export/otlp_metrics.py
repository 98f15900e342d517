"""OTLP metrics export, for users without Prometheus: the same families, pushed periodically.

The Prometheus collector stays the single source of the metrics: every interval its families are
read (the same in-kernel map reads a scrape does) and converted into the SDK's MetricsData, which
the SDK's OTLP metric exporter (gRPC or HTTP/protobuf, OTEL_EXPORTER_OTLP_* variables honoured)
encodes and sends. Counters become cumulative monotonic sums, gauges gauges, and the log2
histograms explicit-bucket histograms with the same bounds. Names keep the Prometheus family names
(without `_total`), so a collector's Prometheus exporter gives back the very series the dashboards use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import Metric as PromMetric

from retsnoop_otel import __version__

log = logging.getLogger(__name__)
SCOPE = InstrumentationScope("retsnoop_otel.metrics.collector", __version__)
_UNITS = {"seconds": "s", "bytes": "By"}


def _unit(family: PromMetric) -> str:
    if family.unit:
        return _UNITS.get(family.unit, family.unit)
    for suffix, unit in _UNITS.items():
        if family.name.endswith("_" + suffix):
            return unit
    return "1" if family.type in ("counter", "gauge") else ""


def _key(labels: dict[str, str], drop: str = "") -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _histogram_points(family: PromMetric, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
    """Prometheus cumulative `le` buckets -> OTLP per-bucket counts with explicit (finite) bounds."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in family.samples:
        key = _key(s.labels, "le")
        point = series.setdefault(key, {"buckets": [], "count": 0, "sum": 0.0})
        if s.name.endswith("_bucket"):
            point["buckets"].append((float(s.labels["le"]), int(s.value)))
        elif s.name.endswith("_count"):
            point["count"] = int(s.value)
        elif s.name.endswith("_sum"):
            point["sum"] = float(s.value)
    points = []
    for key, p in series.items():
        cumulative = sorted(p["buckets"])
        bounds = [le for le, _ in cumulative if le != float("inf")]
        counts, previous = [], 0
        for _, total in cumulative:
            counts.append(total - previous)
            previous = total
        if not cumulative or cumulative[-1][0] != float("inf"):
            counts.append(p["count"] - previous)  # no +Inf bucket given: the rest overflows
        points.append(HistogramDataPoint(dict(key), start_ns, now_ns, p["count"], p["sum"], counts, bounds,
                                         None, None))  # type: ignore[arg-type]  # min/max unknown
    return points


def to_metric(family: PromMetric, start_ns: int, now_ns: int) -> Metric | None:
    """One Prometheus family as an OTLP metric; None for families without samples or unknown types."""
    if not family.samples:
        return None
    unit = _unit(family)
    if family.type == "histogram":
        return Metric(family.name, family.documentation, unit,
                      Histogram(_histogram_points(family, start_ns, now_ns), AggregationTemporality.CUMULATIVE))
    if family.type in ("counter", "gauge"):
        points = [NumberDataPoint(dict(_key(s.labels)), start_ns, now_ns,
                                  int(s.value) if float(s.value).is_integer() else float(s.value))
                  for s in family.samples if not s.name.endswith("_created")]
        if family.type == "counter":
            return Metric(family.name, family.documentation, unit,
                          Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True))
        return Metric(family.name, family.documentation, unit, Gauge(points))
    return None


def metrics_data(families: Iterable[PromMetric], resource: Resource, start_ns: int, now_ns: int) -> MetricsData:
    metrics = [m for m in (to_metric(f, start_ns, now_ns) for f in families) if m is not None]
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(SCOPE, metrics, "")], "")])


@dataclass(slots=True)
class PushStats:
    pushes: int = 0
    failures: int = 0


class OtlpMetricsPusher:
    """Reads `collect()` every `interval_s` seconds and exports the result; never blocks capture.

    `stop()` pushes once more so that a short run still delivers its final counts.
    """

    def __init__(self, collect: Callable[[], Iterable[PromMetric]], exporter: Any, resource: Resource,
                 interval_s: float = 60.0, clock: Callable[[], int] = time.time_ns) -> None:
        self._collect = collect
        self._exporter = exporter
        self._resource = resource if resource is not None else Resource.get_empty()
        self._interval = max(0.05, interval_s)
        self._clock = clock
        self._start_ns = clock()
        self._stop = threading.Event()
        self.stats = PushStats()
        self._thread = threading.Thread(target=self._run, name="otlp-metrics", daemon=True)

    def start(self) -> OtlpMetricsPusher:
        self._thread.start()
        return self

    def push(self) -> bool:
        try:
            data = metrics_data(self._collect(), self._resource, self._start_ns, self._clock())
            ok = self._exporter.export(data, timeout_millis=10_000) is MetricExportResult.SUCCESS
        except Exception:  # noqa: BLE001 - a failing read or transport must not end the pusher
            log.debug("OTLP metrics push failed", exc_info=True)
            ok = False
        self.stats.pushes += 1
        self.stats.failures += 0 if ok else 1
        return ok

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.push()

    def stop(self, final_push: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        if final_push:
            self.push()
        try:
            self._exporter.shutdown()
        except Exception:  # noqa: BLE001
            log.debug("OTLP metric exporter shutdown failed", exc_info=True)


"""OTLP metrics export, for users without Prometheus: the same families, pushed periodically.

The Prometheus collectors stay the single source of the metrics: every interval their families
are read (the same in-kernel map reads a scrape does) and written as one ExportMetricsServiceRequest
that an OTLP sender delivers. Counters become cumulative monotonic sums, gauges gauges, and the log2
histograms explicit-bucket histograms with the same bounds (sums and histograms as deltas on request:
export/metrics_temporality.py). Names keep the Prometheus family names
(without `_total`) and units are given per family (metrics/otlp_units.py: UCUM, curly braces for
counts), so a collector's Prometheus translation gives back the very series the dashboards use.
The resource carries its schema URL; the scope does not, as the metric names and their attributes
are our own rather than semantic-convention names.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from prometheus_client.metrics_core import Metric as PromMetric

from retsnoop_otel import __version__
from retsnoop_otel.export.metrics_temporality import Deltas
from retsnoop_otel.export.sending import Sender

log = logging.getLogger(__name__)
SCOPE_NAME = "retsnoop_otel.metrics"
_UNITS = {"seconds": "s", "bytes": "By"}  # for a family without a unit of its own: from its name
_CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def _unit(family: PromMetric, units: Mapping[str, str]) -> str:
    """The family's configured unit; else seconds or bytes from its name; else none (never "1", which the
    Collector reads as a ratio on gauges)."""
    if family.name in units:
        return units[family.name]
    if family.unit:
        return _UNITS.get(family.unit, family.unit)
    for suffix, unit in _UNITS.items():
        if family.name.endswith("_" + suffix):
            return unit
    return ""


def _attributes(labels: Mapping[str, str], drop: str = "") -> list[KeyValue]:
    out = []
    for key in sorted(labels):
        if key != drop:
            kv = KeyValue(key=key)
            kv.value.string_value = labels[key]
            out.append(kv)
    return out


def _key(labels: Mapping[str, str], drop: str = "") -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _histogram(family: PromMetric, start_ns: int, now_ns: int) -> pb.Histogram:
    """Prometheus cumulative `le` buckets -> OTLP per-bucket counts with explicit (finite) bounds."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in family.samples:
        point = series.setdefault(_key(s.labels, "le"), {"labels": s.labels, "buckets": [], "count": 0, "sum": 0.0})
        if s.name.endswith("_bucket"):
            point["buckets"].append((float(s.labels["le"]), int(s.value)))
        elif s.name.endswith("_count"):
            point["count"] = int(s.value)
        elif s.name.endswith("_sum"):
            point["sum"] = float(s.value)
    out = pb.Histogram(aggregation_temporality=_CUMULATIVE)
    for p in series.values():
        cumulative = sorted(p["buckets"])
        counts, previous = [], 0
        for _, total in cumulative:
            counts.append(total - previous)
            previous = total
        if not cumulative or not math.isinf(cumulative[-1][0]):
            counts.append(p["count"] - previous)  # no +Inf bucket given: the rest overflows
        out.data_points.add(attributes=_attributes(p["labels"], "le"), start_time_unix_nano=start_ns,
                            time_unix_nano=now_ns, count=p["count"], sum=p["sum"], bucket_counts=counts,
                            explicit_bounds=[le for le, _ in cumulative if not math.isinf(le)])
    return out


def _exponential(histogram: pb.Histogram) -> pb.ExponentialHistogram:
    """The log2 buckets (bounds 2^k ns) as an exponential histogram at scale 0 in nanoseconds: bucket index k
    holds the kernel's slot k, the durations in [2^k, 2^(k+1)) ns, so every slot arrives as it was counted.
    (OTLP's buckets are (2^k, 2^(k+1)]: a duration of exactly 2^k ns is read one bucket up.) A probe set's
    duration_range merges slots before this: its first bucket (the underflow) lands at the lowest index, the
    kernel's open last slot and the overflow at the highest."""
    out = pb.ExponentialHistogram(aggregation_temporality=histogram.aggregation_temporality)
    for p in histogram.data_points:
        exponents = [round(math.log2(le * 1e9)) for le in p.explicit_bounds]
        slots = [e - 1 for e in exponents] + [exponents[-1] if exponents else 0]  # +Inf: the slot after the last
        counts = dict(zip(slots, p.bucket_counts, strict=True))
        used = [k for k, n in counts.items() if n]
        point = out.data_points.add(attributes=p.attributes, start_time_unix_nano=p.start_time_unix_nano,
                                    time_unix_nano=p.time_unix_nano, count=p.count, sum=p.sum * 1e9, scale=0)
        if used:
            point.positive.offset = min(used)
            point.positive.bucket_counts.extend(counts.get(k, 0) for k in range(min(used), max(used) + 1))
    return out


def _powers_of_two_ns(histogram: pb.Histogram) -> bool:
    bounds = [le * 1e9 for p in histogram.data_points for le in p.explicit_bounds]
    return all(2 <= b <= 2**62 and math.isclose(b, 2 ** round(math.log2(b)), rel_tol=1e-9) for b in bounds)


def _number_points(family: PromMetric, start_ns: int, now_ns: int) -> list[pb.NumberDataPoint]:
    points = []
    for s in family.samples:
        if s.name.endswith("_created"):
            continue
        p = pb.NumberDataPoint(attributes=_attributes(s.labels), start_time_unix_nano=start_ns, time_unix_nano=now_ns)
        if float(s.value).is_integer():
            p.as_int = int(s.value)
        else:
            p.as_double = float(s.value)
        points.append(p)
    return points


def to_metric(family: PromMetric, start_ns: int, now_ns: int, units: Mapping[str, str] | None = None,
              exponential: bool = False) -> pb.Metric | None:
    """One Prometheus family as an OTLP metric; None for families without samples or of other types.

    `exponential`: durations in seconds (log2 bounds, 2^k ns) as exponential histograms in nanoseconds,
    renamed `..._nanoseconds` as their unit now says (OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION);
    /metrics keeps the classic buckets."""
    if not family.samples or family.type not in ("histogram", "counter", "gauge"):
        return None
    metric = pb.Metric(name=family.name, description=family.documentation, unit=_unit(family, units or {}))
    if family.type == "histogram":
        histogram = _histogram(family, start_ns, now_ns)
        if exponential and metric.unit == "s" and _powers_of_two_ns(histogram):
            metric.name = family.name.removesuffix("_seconds") + "_nanoseconds"
            metric.unit = "ns"
            metric.exponential_histogram.CopyFrom(_exponential(histogram))
        else:
            metric.histogram.CopyFrom(histogram)
    elif family.type == "counter":
        metric.sum.CopyFrom(pb.Sum(data_points=_number_points(family, start_ns, now_ns), is_monotonic=True,
                                   aggregation_temporality=_CUMULATIVE))
    else:
        metric.gauge.CopyFrom(pb.Gauge(data_points=_number_points(family, start_ns, now_ns)))
    return metric


def metrics_request(families: Iterable[PromMetric], resource: Mapping[str, Any], start_ns: int,
                    now_ns: int, units: Mapping[str, str] | None = None,
                    schema_url: str = "", exponential: bool = False) -> ExportMetricsServiceRequest:
    """`units`: family name -> OTLP unit; `schema_url`: the resource's (ResourceMetrics.schema_url)."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.schema_url = schema_url
    for key, value in resource.items():
        rm.resource.attributes.add(key=key).value.string_value = str(value)
    sm = rm.scope_metrics.add()
    sm.scope.name, sm.scope.version = SCOPE_NAME, __version__
    sm.metrics.extend(m for m in (to_metric(f, start_ns, now_ns, units, exponential) for f in families)
                      if m is not None)
    return request


@dataclass(slots=True)
class PushStats:
    pushes: int = 0
    failures: int = 0


class OtlpMetricsPusher:
    """Reads `collect()` every `interval_s` seconds and sends the result; never blocks capture.

    `stop()` pushes once more so that a short run still delivers its final counts.
    """

    def __init__(self, collect: Callable[[], Iterable[PromMetric]], sender: Sender, resource: Mapping[str, Any],
                 interval_s: float = 60.0, clock: Callable[[], int] = time.time_ns, *,
                 units: Mapping[str, str] | None = None, schema_url: str = "", temporality: str = "cumulative",
                 exponential: bool = False) -> None:
        self._collect = collect
        self._sender = sender
        self._resource = resource
        self._units = units or {}
        self._schema_url = schema_url
        self._interval = max(0.05, interval_s)
        self._clock = clock
        self._start_ns = clock()
        self._deltas = Deltas(temporality, self._start_ns)
        self._exponential = exponential
        self._stop = threading.Event()
        self.stats = PushStats()
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="otlp-metrics", daemon=True)

    def start(self) -> OtlpMetricsPusher:
        self._thread.start()
        return self

    def push(self) -> bool:
        try:
            now = self._clock()
            request = metrics_request(self._collect(), self._resource, self._start_ns, now, self._units,
                                      self._schema_url, self._exponential)
            self._deltas.apply(request, now)
            points = sum(len(m.sum.data_points) + len(m.gauge.data_points) + len(m.histogram.data_points)
                         + len(m.exponential_histogram.data_points)
                         for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)
            result = self._sender.send(request.SerializeToString(), points)
            ok, self.last_error = result.ok, result.error
        except Exception as exc:  # noqa: BLE001 - a failing read or transport must not end the pusher
            log.debug("OTLP metrics push failed", exc_info=True)
            ok, self.last_error = False, f"{type(exc).__name__}: {exc}"
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
            self._sender.shutdown()
        except Exception:  # noqa: BLE001
            log.debug("OTLP metrics sender shutdown failed", exc_info=True)

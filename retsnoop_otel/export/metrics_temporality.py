"""OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE: the pushed sums and histograms as deltas, for backends
that store those (Datadog, Dynatrace, Elastic, ...).

The kernel keeps running totals, so every push reads cumulative values; a delta is this push's value minus the
previous push's, over the time between the two. A series seen for the first time, or whose total went down
(a reload replaced the maps behind it), starts over: its whole value, from the previous push. Of the
preference's three values, `cumulative` (the default) changes nothing, `delta` turns both kinds, and
`lowmemory` only the histograms: the specification keeps asynchronous counters cumulative there, and every
sum here is read from the kernel at collection, which is what an asynchronous counter is.
"""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

_DELTA = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
Key = tuple[str, tuple[tuple[str, str], ...]]
_INDEXES = 64  # bucket indexes of the exponential histograms (metrics_push: slots 0..39 at scale 0)


def _key(name: str, point: pb.NumberDataPoint | pb.HistogramDataPoint | pb.ExponentialHistogramDataPoint) -> Key:
    return name, tuple((kv.key, kv.value.string_value) for kv in point.attributes)


class Deltas:
    """Turns the cumulative points of successive requests into deltas, remembering each series' last total."""

    def __init__(self, preference: str, start_ns: int) -> None:
        """`preference`: one of processor_env.TEMPORALITIES."""
        self._sums = preference == "delta"
        self._histograms = preference in ("delta", "lowmemory")
        self._last_ns = start_ns  # the previous push (the pusher's start before the first)
        self._totals: dict[Key, tuple[float, ...]] = {}

    @property
    def active(self) -> bool:
        return self._sums or self._histograms

    def apply(self, request: ExportMetricsServiceRequest, now_ns: int) -> None:
        """Rewrite `request` (built from cumulative totals at `now_ns`) in place."""
        if not self.active:
            return
        seen: dict[Key, tuple[float, ...]] = {}
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if self._sums and metric.WhichOneof("data") == "sum" and metric.sum.is_monotonic:
                        metric.sum.aggregation_temporality = _DELTA
                        for p in metric.sum.data_points:
                            total = (p.as_int if p.WhichOneof("value") == "as_int" else p.as_double,)
                            before = self._since(_key(metric.name, p), total, seen, p)
                            if p.WhichOneof("value") == "as_int":
                                p.as_int = int(total[0] - before[0])
                            else:
                                p.as_double = total[0] - before[0]
                    elif self._histograms and metric.WhichOneof("data") == "exponential_histogram":
                        metric.exponential_histogram.aggregation_temporality = _DELTA
                        for e in metric.exponential_histogram.data_points:
                            wide = [0.0] * _INDEXES  # by bucket index, so that offsets may differ between pushes
                            for i, n in enumerate(e.positive.bucket_counts, e.positive.offset):
                                wide[i] = float(n)
                            total = (float(e.count), e.sum, float(e.zero_count), *wide)
                            before = self._since(_key(f"{metric.name} {e.scale}", e), total, seen, e)
                            e.count, e.sum = int(total[0] - before[0]), total[1] - before[1]
                            e.zero_count = int(total[2] - before[2])
                            delta = [int(t - b) for t, b in zip(total[3:], before[3:], strict=True)]
                            used = [i for i, n in enumerate(delta) if n]
                            e.positive.offset = min(used) if used else 0
                            e.positive.bucket_counts[:] = delta[min(used):max(used) + 1] if used else []
                    elif self._histograms and metric.WhichOneof("data") == "histogram":
                        metric.histogram.aggregation_temporality = _DELTA
                        for h in metric.histogram.data_points:
                            key = _key(f"{metric.name} {list(h.explicit_bounds)}", h)  # new bounds: anew
                            total = (float(h.count), h.sum, *map(float, h.bucket_counts))
                            before = self._since(key, total, seen, h)
                            h.count = int(total[0] - before[0])
                            h.sum = total[1] - before[1]
                            h.bucket_counts[:] = [int(t - b) for t, b in zip(total[2:], before[2:], strict=True)]
        self._totals = seen  # series gone from this push are forgotten: if they come back, they start over
        self._last_ns = now_ns

    def _since(self, key: Key, total: tuple[float, ...], seen: dict[Key, tuple[float, ...]],
               point: pb.NumberDataPoint | pb.HistogramDataPoint | pb.ExponentialHistogramDataPoint
               ) -> tuple[float, ...]:
        """The previous total to subtract (zeros when the series is new or went down), and the point's start."""
        seen[key] = total
        point.start_time_unix_nano = self._last_ns
        before = self._totals.get(key)
        if before is None or len(before) != len(total) or any(t < b for t, b in zip(total, before, strict=True)):
            return (0.0,) * len(total)
        return before

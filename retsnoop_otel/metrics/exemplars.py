"""Exemplars: the latest exported trace per duration bucket, so a latency spike on a dashboard leads to a trace.

The one per-event write of the metrics path: a trace that is exported anyway leaves its id here
(one dict write next to encoding the whole trace); the collector reads the store at scrape time, which is when the
entries become prometheus_client Exemplars: a run that exports traces but serves no metrics (`trace
--otlp-endpoint`) never imports prometheus_client.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from retsnoop_otel.capture.records import DUR_BUCKETS

if TYPE_CHECKING:
    from prometheus_client.samples import Exemplar

_Raw = tuple[int, float, int]  # trace id, value, end (wall clock, ns): an exemplar until scrape time

EXEMPLARS_MAX = 4096  # (probe set, entry function, bucket) keys kept; about 1 MB at most


def log2_bucket(duration_ns: int, count: int = DUR_BUCKETS) -> int:
    """The kernel's bucket for a duration (bpf/retsnoop.bpf.c count_into): floor(log2(ns)), last one open."""
    return min(max(duration_ns.bit_length() - 1, 0), count - 1)


class ExemplarStore:
    """The latest exported trace per (probe set, entry function, duration bucket).

    Written by the capture thread when a trace is handed to an exporter, read at scrape time; bounded
    (least recently written key evicted first) so reloads that rename probe sets cannot grow it.
    """

    def __init__(self, max_entries: int = EXEMPLARS_MAX, buckets: int = DUR_BUCKETS) -> None:
        self._max = max(1, max_entries)
        self._buckets = buckets
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str, int], _Raw] = OrderedDict()
        self._origins: OrderedDict[tuple[str, str, str, str], _Raw] = OrderedDict()

    def record(self, probe_set: str, entry_function: str, duration_ns: int, trace_id: int, end_ns: int) -> None:
        """`end_ns`: wall-clock end of the trace's root span, the exemplar's timestamp."""
        key = (probe_set, entry_function, log2_bucket(duration_ns, self._buckets))
        ex = (trace_id, duration_ns / 1e9, end_ns)
        with self._lock:
            self._items[key] = ex
            self._items.move_to_end(key)
            if len(self._items) > self._max:
                self._items.popitem(last=False)

    def record_origin(self, probe_set: str, entry_function: str, origin: str, error: str, trace_id: int,
                      end_ns: int) -> None:
        """The latest exported trace of a failing session with this error origin (retsnoop_error_origins_total)."""
        key = (probe_set, entry_function, origin, error)
        ex = (trace_id, 1.0, end_ns)
        with self._lock:
            self._origins[key] = ex
            self._origins.move_to_end(key)
            if len(self._origins) > self._max:
                self._origins.popitem(last=False)

    def for_origins(self, probe_set: str) -> dict[tuple[str, str, str], Exemplar]:
        """(entry function, origin, error type) -> exemplar, for one probe set's origin series."""
        with self._lock:
            raw = [(k[1:], ex) for k, ex in self._origins.items() if k[0] == probe_set]
        return {k: _exemplar(ex) for k, ex in raw}

    def for_histogram(self, probe_set: str, entry_function: str) -> dict[int, Exemplar]:
        """Bucket index -> exemplar for one entry function's duration histogram."""
        with self._lock:
            found = [(i, self._items.get((probe_set, entry_function, i))) for i in range(self._buckets)]
        return {i: _exemplar(ex) for i, ex in found if ex is not None}

    def __len__(self) -> int:
        return len(self._items)


def _exemplar(raw: _Raw) -> Exemplar:
    """An entry as the exposition wants it (read at scrape time, when prometheus_client is loaded anyway)."""
    from prometheus_client.samples import Exemplar, Timestamp

    trace_id, value, end_ns = raw
    return Exemplar({"trace_id": f"{trace_id:032x}"}, value, Timestamp(end_ns // 1_000_000_000, end_ns % 1_000_000_000))

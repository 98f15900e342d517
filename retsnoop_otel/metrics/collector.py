"""Prometheus metrics read from the kernel-side aggregates at scrape time.

Nothing is updated per event: the collector calls the supplied readers (BPF map reads, sink
counters) when Prometheus scrapes, so the cost is proportional to the scrape rate, not the event rate.
The one exception are exemplars: a trace that is exported anyway also leaves its id in an
ExemplarStore (one dict write next to encoding the whole trace).
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Timestamp
from prometheus_client.utils import floatToGoString

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import CaptureStats, FuncStats, ProgramStats, SessionStats, TracedFunc
from retsnoop_otel.capture.records import DUR_BUCKETS

if TYPE_CHECKING:  # otlp pulls in the OTel SDK: a metrics-only run should not pay for importing it
    from retsnoop_otel.export.otlp import ExportStats

FuncTable = Mapping[int, TracedFunc] | Sequence[TracedFunc]
BPF_STATS_ENABLED = "retsnoop_bpf_stats_enabled"  # host-wide: the agent emits it once, not per probe set
EXEMPLARS_MAX = 4096  # (probe set, entry function, bucket) keys kept; about 1 MB at most


class MetricsPortInUseError(RuntimeError):
    """The metrics port is taken; says which one so the user can pick another."""

    def __init__(self, port: int, addr: str) -> None:
        super().__init__(f"cannot serve metrics on {addr}:{port}: the port is already in use "
                         f"(choose another with --metrics-port)")
        self.port = port
        self.addr = addr


@dataclass(slots=True)
class _Merged:
    calls: int
    errors: dict[str, int]
    buckets: list[int]
    sum_ns: int


def bucket_bounds_seconds(count: int) -> list[str]:
    """`le` labels for log2 ns buckets: bucket i is [2^i, 2^(i+1)) ns, so its upper bound is 2^(i+1) ns.

    The kernel's last bucket is open-ended (it also holds everything longer), so it has no finite
    bound of its own and is covered only by +Inf.
    """
    return list(_bounds(count))


@functools.cache
def _bounds(count: int) -> tuple[str, ...]:
    """Formatted once per bucket count: formatting them per histogram was a third of a scrape's collect()."""
    return (*(floatToGoString(2 ** (i + 1) / 1e9) for i in range(count - 1)), "+Inf")


def log2_bucket(duration_ns: int, count: int = DUR_BUCKETS) -> int:
    """The kernel's bucket for a duration (bpf/retsnoop.bpf.c count_into): floor(log2(ns)), last one open."""
    return min(max(duration_ns.bit_length() - 1, 0), count - 1)


def func_label(funcs: FuncTable, func_id: int) -> str:
    """The `function`/`entry_function` label of a function id (same-named instances share it)."""
    try:
        return funcs[func_id].name
    except (KeyError, IndexError):
        return f"func#{func_id}"


def read_bpf_stats_enabled(root: str = "/") -> bool:
    """kernel.bpf_stats_enabled; False when unreadable (the kernel then keeps run_cnt/run_time_ns still).

    Statistics enabled through a BPF_ENABLE_STATS file descriptor (bpftop) do not show in the sysctl.
    """
    try:
        with open(os.path.join(root, "proc/sys/kernel/bpf_stats_enabled")) as f:
            return f.read().strip() not in ("", "0")
    except OSError:
        return False


class ExemplarStore:
    """The latest exported trace per (probe set, entry function, duration bucket), for histogram exemplars.

    Written by the capture thread when a trace is handed to an exporter, read at scrape time; bounded
    (least recently written key evicted first) so reloads that rename probe sets cannot grow it.
    """

    def __init__(self, max_entries: int = EXEMPLARS_MAX, buckets: int = DUR_BUCKETS) -> None:
        self._max = max(1, max_entries)
        self._buckets = buckets
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str, int], Exemplar] = OrderedDict()

    def record(self, probe_set: str, entry_function: str, duration_ns: int, trace_id: int, end_ns: int) -> None:
        """`end_ns`: wall-clock end of the trace's root span, the exemplar's timestamp."""
        key = (probe_set, entry_function, log2_bucket(duration_ns, self._buckets))
        ex = Exemplar({"trace_id": f"{trace_id:032x}"}, duration_ns / 1e9,
                      Timestamp(end_ns // 1_000_000_000, end_ns % 1_000_000_000))
        with self._lock:
            self._items[key] = ex
            self._items.move_to_end(key)
            if len(self._items) > self._max:
                self._items.popitem(last=False)

    def for_histogram(self, probe_set: str, entry_function: str) -> dict[int, Exemplar]:
        """Bucket index -> exemplar for one entry function's duration histogram."""
        with self._lock:
            found = ((i, self._items.get((probe_set, entry_function, i))) for i in range(self._buckets))
            return {i: ex for i, ex in found if ex is not None}

    def __len__(self) -> int:
        return len(self._items)


OTHER = "other"  # label value of what the series bounds fold together


@dataclass(frozen=True)
class SeriesBounds:
    """Caps on label values, for fleets that trace many functions: 0 / () mean no cap."""

    max_error_types: int = 0  # error_type values per function; the rest are summed as error_type="other"
    functions: tuple[str, ...] = ()  # globs of functions with series of their own; the rest: function="other"


class SeriesLimiter:
    """Applies SeriesBounds the same way at every scrape.

    Which error types of a function get their own series is decided once, when they first appear
    (the largest first), and never changes: a counter that moved between `EINVAL` and `other` from
    one scrape to the next would look like a reset to Prometheus. Memory is bounded by functions x cap.
    """

    def __init__(self, bounds: SeriesBounds) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        self._kept: dict[str, list[str]] = {}
        self._allowed: dict[str, bool] = {}

    def function(self, name: str) -> str:
        if not self.bounds.functions:
            return name
        ok = self._allowed.get(name)
        if ok is None:
            ok = self._allowed[name] = any(fnmatch.fnmatchcase(name, g) for g in self.bounds.functions)
        return name if ok else OTHER

    def errors(self, function: str, errors: Mapping[str, int]) -> dict[str, int]:
        cap = self.bounds.max_error_types
        if not cap:
            return dict(errors)
        with self._lock:
            kept = self._kept.setdefault(function, [])
            for err in sorted(errors, key=lambda e: (-errors[e], e)):
                if err not in kept and len(kept) < cap:
                    kept.append(err)
            chosen = set(kept)
        out = {e: n for e, n in errors.items() if e in chosen}
        rest = sum(n for e, n in errors.items() if e not in chosen)
        if rest:
            out[OTHER] = out.get(OTHER, 0) + rest
        return out


def _cumulative(buckets: Sequence[int]) -> list[int]:
    total, out = 0, []
    for n in buckets:
        total += n
        out.append(total)
    return out


class MetricsCollector(Collector):
    """Custom collector over callables returning the current stats; holds no metric state itself."""

    def __init__(self, probe_set: str, funcs: FuncTable, func_stats: Callable[[], Iterable[FuncStats]],
                 capture_stats: Callable[[], CaptureStats],
                 export_stats: Callable[[], ExportStats] | None = None,
                 session_stats: Callable[[], Iterable[SessionStats]] | None = None, *,
                 program_stats: Callable[[], Iterable[ProgramStats]] | None = None,
                 stats_enabled: Callable[[], bool] = read_bpf_stats_enabled,
                 exemplars: Callable[[str], Mapping[int, Exemplar]] | None = None,
                 limiter: SeriesLimiter | None = None) -> None:
        """`exemplars(entry_function)`: bucket index -> exemplar for the session duration histogram;
        `limiter`: keeps the function and error_type label sets within configured bounds."""
        self._limiter = limiter
        self.probe_set = probe_set
        self.funcs = funcs
        self._func_stats = func_stats
        self._capture_stats = capture_stats
        self._export_stats = export_stats
        self._session_stats = session_stats
        self._program_stats = program_stats
        self._stats_enabled = stats_enabled
        self._exemplars = exemplars

    def _collect_sessions(self) -> Iterator[Metric]:
        ps = self.probe_set
        outcomes = CounterMetricFamily("retsnoop_sessions", "Entry-function sessions by outcome (error: the "
                                       "entry function returned an error)", labels=["probe_set", "entry_function",
                                                                                     "outcome"])
        durations = HistogramMetricFamily("retsnoop_session_duration_seconds",
                                          "Duration of entry-function sessions", labels=["probe_set", "entry_function"])
        merged: dict[str, _Merged] = {}
        for s in self._session_stats():  # type: ignore[misc]
            name = self._name(s.entry_func_id)
            m = merged.setdefault(name, _Merged(0, {"error": 0}, [0] * len(s.duration_buckets), 0))
            m.calls += s.sessions
            m.errors["error"] += s.error_sessions
            m.sum_ns += s.duration_sum_ns
            for i, n in enumerate(s.duration_buckets):
                m.buckets[i] += n
        for name, m in sorted(merged.items()):
            outcomes.add_metric([ps, name, "error"], m.errors["error"])
            outcomes.add_metric([ps, name, "success"], m.calls - m.errors["error"])
            cum = _cumulative(m.buckets)
            exemplars = self._exemplars(name) if self._exemplars is not None else {}
            durations.add_metric([ps, name], _buckets_with_exemplars(cum, exemplars), m.sum_ns / 1e9)
        yield outcomes
        yield durations

    def _collect_programs(self, read: Callable[[], Iterable[ProgramStats]]) -> Iterator[Metric]:
        """BPF program cost. While statistics are off the kernel's counters stand still, so the run families
        carry no samples then: a flat series would read as "costs nothing" rather than "not measured"."""
        ps = self.probe_set
        enabled = self._stats_enabled()
        runs = CounterMetricFamily("retsnoop_bpf_program_runs", "Runs of retsnoop's BPF programs (kernel bpf_stats; "
                                   "only while kernel.bpf_stats_enabled=1)", labels=["probe_set", "program"])
        seconds = CounterMetricFamily("retsnoop_bpf_program_run_seconds", "Time spent in retsnoop's BPF programs "
                                      "(kernel bpf_stats; only while kernel.bpf_stats_enabled=1)",
                                      labels=["probe_set", "program"])
        if enabled:
            for p in read():
                runs.add_metric([ps, p.name], p.run_cnt)
                seconds.add_metric([ps, p.name], p.run_time_ns / 1e9)
        yield runs
        yield seconds
        yield bpf_stats_enabled_family(enabled)

    def _name(self, func_id: int) -> str:
        return func_label(self.funcs, func_id)

    def _merge(self, stats: Iterable[FuncStats]) -> dict[str, _Merged]:
        """One series per function name: same-named instances (e.g. in two modules) are summed, and so are
        the functions the limiter's allow-list leaves out."""
        merged: dict[str, _Merged] = {}
        label = self._limiter.function if self._limiter is not None else None
        for s in stats:
            name = self._name(s.func_id)
            if label is not None:
                name = label(name)
            m = merged.get(name)
            if m is None:
                merged[name] = _Merged(s.calls, dict(s.errors), list(s.duration_buckets), s.duration_sum_ns)
                continue
            m.calls += s.calls
            m.sum_ns += s.duration_sum_ns
            for err, n in s.errors.items():
                m.errors[err] = m.errors.get(err, 0) + n
            if len(s.duration_buckets) > len(m.buckets):
                m.buckets.extend([0] * (len(s.duration_buckets) - len(m.buckets)))
            for i, n in enumerate(s.duration_buckets):
                m.buckets[i] += n
        return merged

    def collect(self) -> Iterator[Metric]:
        ps = self.probe_set
        calls = CounterMetricFamily("retsnoop_function_calls", "Calls of a traced kernel function",
                                    labels=["probe_set", "function"])
        errors = CounterMetricFamily("retsnoop_function_errors",
                                     "Failing returns of a traced kernel function, by error type",
                                     labels=["probe_set", "function", "error_type"])
        durations = HistogramMetricFamily("retsnoop_function_duration_seconds",
                                          "Duration of traced kernel function calls",
                                          labels=["probe_set", "function"])
        for name, m in sorted(self._merge(self._func_stats()).items()):
            calls.add_metric([ps, name], m.calls)
            errs = self._limiter.errors(name, m.errors) if self._limiter is not None else m.errors
            for err, n in sorted(errs.items()):
                errors.add_metric([ps, name, err], n)
            if m.buckets:
                cum = _cumulative(m.buckets)
                durations.add_metric([ps, name], list(zip(_bounds(len(cum)), cum, strict=True)), m.sum_ns / 1e9)
        yield calls
        yield errors
        yield durations
        if self._session_stats is not None:
            yield from self._collect_sessions()
        if self._program_stats is not None:
            yield from self._collect_programs(self._program_stats)

        cap = self._capture_stats()
        yield _counter("retsnoop_sessions_dropped",
                       "Sessions lost in the kernel (sessions map full or end record lost)", cap.dropped_sessions)
        yield _counter("retsnoop_sessions_incomplete",
                       "Sessions that lost per-call records or had mismatched exits", cap.incomplete_sessions)
        yield _counter("retsnoop_records_lost", "Per-call records lost in the kernel (ring buffer full)",
                       cap.dropped_records)
        yield _counter("retsnoop_sessions_started", "Entry-function sessions started", cap.sessions_started)
        yield _counter("retsnoop_sessions_reported", "Sessions sent to user space", cap.sessions_reported)

        exp = self._export_stats() if self._export_stats is not None else None
        yield _counter("retsnoop_spans_exported", "Spans accepted by the OTLP endpoint",
                       exp.spans_exported if exp else 0)
        dropped = CounterMetricFamily("retsnoop_spans_dropped", "Spans not exported, by cause", labels=["cause"])
        for cause, n in sorted(exp.spans_dropped.items() if exp else ()):
            dropped.add_metric([cause], n)
        yield dropped
        yield _counter("retsnoop_export_errors", "Failed OTLP export requests", exp.export_errors if exp else 0)

        info = GaugeMetricFamily("retsnoop_build_info", "retsnoop-otel version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


def _buckets_with_exemplars(cumulative: Sequence[int], exemplars: Mapping[int, Exemplar]
                            ) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
    """(le, count[, exemplar]) per bucket; only OpenMetrics renders the exemplars."""
    out: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
    for i, (le, n) in enumerate(zip(_bounds(len(cumulative)), cumulative, strict=True)):
        ex = exemplars.get(i)
        out.append((le, n) if ex is None else (le, n, ex))
    return out


def bpf_stats_enabled_family(enabled: bool) -> GaugeMetricFamily:
    """Host-wide, so the agent emits it once rather than per probe set."""
    return GaugeMetricFamily(BPF_STATS_ENABLED, "1 while the kernel counts BPF program runs and run time "
                             "(sysctl kernel.bpf_stats_enabled)", value=int(enabled))


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def make_registry(collector: Collector) -> CollectorRegistry:
    """A private registry holding only our collector (no process/platform defaults, no global state)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def serve_metrics(port: int, registry: CollectorRegistry, addr: str = "0.0.0.0") -> tuple[object, threading.Thread]:
    """Serve /metrics from a daemon thread; returns (server, thread). Port 0 picks a free port."""
    try:
        return start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise MetricsPortInUseError(port, addr) from exc
        raise

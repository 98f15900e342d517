"""The kernel-side metric families of every probe set, read from the BPF maps at scrape time.

Nothing is updated per event: the collector asks each probe set for its aggregates when Prometheus
scrapes, so the cost follows the scrape rate, not the event rate. Each family is built once per
scrape with one `probe_set` label value per set, so several probe sets never repeat a family.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from retsnoop_otel.capture.model import CaptureStats, FuncStats, OriginCount, ProgramStats, SessionStats, TracedFunc
from retsnoop_otel.capture.origins import merge_origins
from retsnoop_otel.metrics.buckets import FIRST_EXP, LAST_EXP, DurationRange, merge, slot_buckets
from retsnoop_otel.metrics.series import SeriesLimiter
from retsnoop_otel.metrics.workload_series import WorkloadTotal

FuncTable = Mapping[int, TracedFunc] | Sequence[TracedFunc]
ORIGIN_LABELS = ("probe_set", "entry", "origin", "error_type")  # retsnoop_error_origins_total


class ProbeSetSource(Protocol):
    """What the collector reads of one running probe set (runtime.probe_set.ProbeSet)."""

    name: str
    funcs: FuncTable
    mode: str  # attach mode
    attached: int
    sampled_out: int
    filtered_out: int
    evicted: int
    workload_label: str | None  # label name of the probe set's workload label (None: no such label)

    def func_stats(self) -> Iterable[FuncStats]: ...

    def workload_totals(self) -> Iterable[WorkloadTotal]: ...

    def session_stats(self) -> Iterable[SessionStats]: ...

    def capture_stats(self) -> CaptureStats: ...

    def origin_counts(self) -> Iterable[OriginCount]: ...

    def program_stats(self) -> Iterable[ProgramStats]: ...


@dataclass(slots=True)
class _Merged:
    calls: int
    errors: dict[str, int]
    buckets: list[int]
    sum_ns: int


@functools.cache
def layout(lo: int, hi: int, slots: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`le` labels of the buckets with bounds 2^lo..2^hi ns over `slots` kernel slots, and each slot's bucket.

    Kernel slot i is [2^i, 2^(i+1)) ns, so its upper bound is 2^(i+1) ns; the kernel's last slot is
    open-ended (it also holds everything longer) and is covered only by +Inf (metrics/buckets.py).
    Formatted once per layout: formatting them per histogram was a third of a scrape's collect().
    """
    bounds, owner = slot_buckets(lo, hi, slots)
    return (*(floatToGoString(2 ** k / 1e9) for k in bounds), "+Inf"), owner


def _histogram(buckets: Sequence[int], rng: DurationRange | None) -> tuple[tuple[str, ...], tuple[int, ...], list[int]]:
    """(le labels, slot -> bucket, cumulative counts) of kernel slot counts under a probe set's range."""
    if rng is None:  # the kernel's own layout: every slot is a bucket, nothing to merge
        les, owner = layout(FIRST_EXP, LAST_EXP, len(buckets))
        return les, owner, _cumulative(buckets)
    lo, hi = rng.exponents
    les, owner = layout(lo, hi, len(buckets))
    return les, owner, _cumulative(merge(buckets, owner, len(les)))


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


def _cumulative(buckets: Sequence[int]) -> list[int]:
    total, out = 0, []
    for n in buckets:
        total += n
        out.append(total)
    return out


def _when(ex: Exemplar) -> float:
    return float(ex.timestamp) if ex.timestamp is not None else 0.0


def _buckets_with_exemplars(les: Sequence[str], owner: Sequence[int], cumulative: Sequence[int],
                            exemplars: Mapping[int, Exemplar]) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
    """(le, count[, exemplar]) per bucket; only OpenMetrics renders the exemplars.

    Exemplars are kept per kernel slot: a bucket that merges slots shows the latest of theirs."""
    chosen: dict[int, Exemplar] = {}
    for slot, ex in exemplars.items():
        if 0 <= slot < len(owner):
            b = owner[slot]
            old = chosen.get(b)
            if old is None or _when(ex) >= _when(old):
                chosen[b] = ex
    out: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
    for i, (le, n) in enumerate(zip(les, cumulative, strict=True)):
        ex = chosen.get(i)
        out.append((le, n) if ex is None else (le, n, ex))
    return out


def _merge_funcs(stats: Iterable[FuncStats], funcs: FuncTable, label: Callable[[str], str] | None
                 ) -> dict[str, _Merged]:
    """One series per function name: same-named instances (e.g. in two modules) are summed, and so are
    the functions the limiter's allow-list leaves out."""
    merged: dict[str, _Merged] = {}
    for s in stats:
        name = func_label(funcs, s.func_id)
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


def _merge_sessions(stats: Iterable[SessionStats], funcs: FuncTable) -> dict[str, _Merged]:
    merged: dict[str, _Merged] = {}
    for s in stats:
        m = merged.setdefault(func_label(funcs, s.entry_func_id),
                              _Merged(0, {"error": 0}, [0] * len(s.duration_buckets), 0))
        m.calls += s.sessions
        m.errors["error"] += s.error_sessions
        m.sum_ns += s.duration_sum_ns
        for i, n in enumerate(s.duration_buckets):
            m.buckets[i] += n
    return merged


def _merge_workload(totals: Iterable[WorkloadTotal], funcs: FuncTable, label: Callable[[str], str] | None,
                    sessions: bool) -> dict[tuple[str, str], tuple[int, dict[str, int]]]:
    """(function, workload value) -> (calls, errors by type) of calls, or (sessions, {"error": n}) of sessions."""
    out: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}
    for t in totals:
        if t.session != sessions:
            continue
        name = func_label(funcs, t.func_id)
        if label is not None:
            name = label(name)
        n, errors = out.get((name, t.value), (0, {}))
        if t.error is not None:
            errors[t.error] = errors.get(t.error, 0) + t.count
        out[(name, t.value)] = (n + t.count, errors)
    return out


class KernelCollector(Collector):
    """Per-probe-set families, from callables that return the current probe sets; holds no metric state."""

    def __init__(self, probe_sets: Callable[[], Sequence[ProbeSetSource]], *,
                 stats_enabled: Callable[[], bool] = read_bpf_stats_enabled,
                 exemplars: Callable[[str, str], Mapping[int, Exemplar]] | None = None,
                 origin_exemplars: Callable[[str], Mapping[tuple[str, str, str], Exemplar]] | None = None,
                 limiter: Callable[[str], SeriesLimiter | None] | None = None,
                 duration_range: Callable[[str], DurationRange | None] | None = None) -> None:
        """`exemplars(probe_set, entry_function)`: kernel slot -> exemplar of the session duration histogram;
        `origin_exemplars(probe_set)`: (entry, origin, error type) -> exemplar of the origin counter;
        `limiter(probe_set)`: keeps the function and error_type label sets within configured bounds;
        `duration_range(probe_set)`: the bucket range of its histograms (None: every kernel slot)."""
        self._probe_sets = probe_sets
        self._stats_enabled = stats_enabled
        self._exemplars = exemplars
        self._origin_exemplars = origin_exemplars
        self._limiter = limiter
        self._range = duration_range

    def _range_of(self, probe_set: str) -> DurationRange | None:
        return self._range(probe_set) if self._range is not None else None

    def collect(self) -> Iterator[Metric]:
        sets = list(self._probe_sets())
        stats_on = self._stats_enabled()
        # read once per scrape: folding them retires the counts of cgroups that are gone
        totals = {ps.name: list(ps.workload_totals()) for ps in sets if ps.workload_label}
        workload_labels = sorted({ps.workload_label for ps in sets if ps.workload_label})
        yield from self._functions(sets, totals, workload_labels)
        yield from self._sessions(sets, totals, workload_labels)
        yield self._origins(sets)
        yield from self._programs(sets, stats_on)
        yield from self._capture(sets)

    def _functions(self, sets: Sequence[ProbeSetSource], totals: Mapping[str, list[WorkloadTotal]],
                   wl_labels: Sequence[str]) -> Iterator[Metric]:
        calls = CounterMetricFamily("retsnoop_function_calls", "Calls of a traced kernel function",
                                    labels=["probe_set", "function", *wl_labels])
        errors = CounterMetricFamily("retsnoop_function_errors",
                                     "Failing returns of a traced kernel function, by error type",
                                     labels=["probe_set", "function", "error_type", *wl_labels])
        durations = HistogramMetricFamily("retsnoop_function_duration_seconds",
                                          "Duration of traced kernel function calls", labels=["probe_set", "function"])
        for ps in sets:
            limiter = self._limiter(ps.name) if self._limiter is not None else None
            rng = self._range_of(ps.name)
            fn_label = limiter.function if limiter is not None else None
            merged = _merge_funcs(ps.func_stats(), ps.funcs, fn_label)
            if ps.workload_label:
                counted = _merge_workload(totals[ps.name], ps.funcs, fn_label, sessions=False)
            else:
                counted = {(name, ""): (m.calls, m.errors) for name, m in merged.items()}
            for (name, value), (n_calls, m_errors) in sorted(counted.items()):
                extra = [value if label == ps.workload_label else "" for label in wl_labels]
                calls.add_metric([ps.name, name, *extra], n_calls)
                errs = limiter.errors(name, m_errors) if limiter is not None else m_errors
                for err, n in sorted(errs.items()):
                    errors.add_metric([ps.name, name, err, *extra], n)
            for name, m in sorted(merged.items()):
                if m.buckets:
                    les, _, cum = _histogram(m.buckets, rng)
                    durations.add_metric([ps.name, name], list(zip(les, cum, strict=True)), m.sum_ns / 1e9)
        yield calls
        yield errors
        yield durations

    def _sessions(self, sets: Sequence[ProbeSetSource], totals: Mapping[str, list[WorkloadTotal]],
                  wl_labels: Sequence[str]) -> Iterator[Metric]:
        outcomes = CounterMetricFamily("retsnoop_sessions", "Entry-function sessions by outcome (error: the "
                                       "entry function returned an error)",
                                       labels=["probe_set", "entry_function", "outcome", *wl_labels])
        durations = HistogramMetricFamily("retsnoop_session_duration_seconds", "Duration of entry-function sessions",
                                          labels=["probe_set", "entry_function"])
        for ps in sets:
            rng = self._range_of(ps.name)
            merged = _merge_sessions(ps.session_stats(), ps.funcs)
            if ps.workload_label:
                counted = _merge_workload(totals[ps.name], ps.funcs, None, sessions=True)
            else:
                counted = {(name, ""): (m.calls, m.errors) for name, m in merged.items()}
            for (name, value), (n, errs) in sorted(counted.items()):
                extra = [value if label == ps.workload_label else "" for label in wl_labels]
                outcomes.add_metric([ps.name, name, "error", *extra], errs.get("error", 0))
                outcomes.add_metric([ps.name, name, "success", *extra], n - errs.get("error", 0))
            for name, m in sorted(merged.items()):
                exemplars = self._exemplars(ps.name, name) if self._exemplars is not None else {}
                les, owner, cum = _histogram(m.buckets, rng)
                durations.add_metric([ps.name, name], _buckets_with_exemplars(les, owner, cum, exemplars),
                                     m.sum_ns / 1e9)
        yield outcomes
        yield durations

    def _origins(self, sets: Sequence[ProbeSetSource]) -> Metric:
        """Failing sessions by where their error started, counted in the kernel for every one of them: the
        question of an error spike is which function started it, not which ones passed it up."""
        family = CounterMetricFamily("retsnoop_error_origins", "Failing entry-function sessions by the function "
                                     "their error started in (the deepest function of the error chain, the "
                                     "stack view's '!' row) and the error it returned; every failing session, "
                                     "sampled, exported or not", labels=ORIGIN_LABELS)
        for ps in sets:
            limiter = self._limiter(ps.name) if self._limiter is not None else None
            merged = merge_origins(ps.origin_counts(), ps.funcs, limiter.function if limiter is not None else None)
            exemplars = self._origin_exemplars(ps.name) if self._origin_exemplars is not None and merged else {}
            for key, n in sorted(merged.items()):  # add_sample: 0.20's add_metric (our lowest) takes no exemplar
                labels = dict(zip(ORIGIN_LABELS, (ps.name, *key), strict=True))
                family.add_sample("retsnoop_error_origins_total", labels, n, exemplar=exemplars.get(key))
        return family

    def _programs(self, sets: Sequence[ProbeSetSource], enabled: bool) -> Iterator[Metric]:
        """BPF program cost. While statistics are off the kernel's counters stand still, so the run families
        carry no samples then: a flat series would read as "costs nothing" rather than "not measured"."""
        runs = CounterMetricFamily("retsnoop_bpf_program_runs", "Runs of retsnoop's BPF programs (kernel bpf_stats; "
                                   "only while kernel.bpf_stats_enabled=1)", labels=["probe_set", "program"])
        seconds = CounterMetricFamily("retsnoop_bpf_program_run_seconds", "Time spent in retsnoop's BPF programs "
                                      "(kernel bpf_stats; only while kernel.bpf_stats_enabled=1)",
                                      labels=["probe_set", "program"])
        if enabled:
            for ps in sets:
                for p in ps.program_stats():
                    runs.add_metric([ps.name, p.name], p.run_cnt)
                    seconds.add_metric([ps.name, p.name], p.run_time_ns / 1e9)
        yield runs
        yield seconds

    def _capture(self, sets: Sequence[ProbeSetSource]) -> Iterator[Metric]:
        specs = (("retsnoop_sessions_dropped", "Sessions lost in the kernel (sessions map full or end record lost)",
                  "dropped_sessions"),
                 ("retsnoop_sessions_incomplete", "Sessions that lost per-call records or had mismatched exits",
                  "incomplete_sessions"),
                 ("retsnoop_records_lost", "Per-call records lost in the kernel (ring buffer full)", "dropped_records"),
                 ("retsnoop_sessions_started", "Entry-function sessions started", "sessions_started"),
                 ("retsnoop_sessions_reported", "Sessions sent to user space", "sessions_reported"),
                 ("retsnoop_workload_counts_dropped", "Calls and sessions left out of the per-workload counts "
                  "(the kernel's per-cgroup map was full)", "workload_dropped"),
                 ("retsnoop_error_origins_dropped", "Failing sessions left out of retsnoop_error_origins_total "
                  "(the kernel's origin map was full)", "origins_dropped"))
        families = [CounterMetricFamily(name, doc, labels=["probe_set"]) for name, doc, _ in specs]
        attached = GaugeMetricFamily("retsnoop_attached_functions", "Kernel functions attached, by probe set "
                                     "and attach mode", labels=["probe_set", "mode"])
        not_exported = CounterMetricFamily("retsnoop_sessions_not_exported", "Sessions captured but not exported, "
                                           "by reason (sampled: successful session not sampled; sampled_error: "
                                           "error session not sampled, still counted by origin; filtered: error "
                                           "filter)", labels=["probe_set", "reason"])
        evicted = CounterMetricFamily("retsnoop_sessions_evicted", "Half-assembled sessions dropped in user space "
                                      "because too many threads had one open at once", labels=["probe_set"])
        for ps in sets:
            cap = ps.capture_stats()
            for fam, (_, _, attr) in zip(families, specs, strict=True):
                fam.add_metric([ps.name], getattr(cap, attr))
            attached.add_metric([ps.name, ps.mode], ps.attached)
            not_exported.add_metric([ps.name, "sampled"], ps.sampled_out + cap.sampled_out)  # mostly the kernel's
            not_exported.add_metric([ps.name, "sampled_error"], cap.errors_sampled_out)  # the kernel's alone
            not_exported.add_metric([ps.name, "filtered"], ps.filtered_out)
            evicted.add_metric([ps.name], ps.evicted)
        yield from families
        yield attached
        yield not_exported
        yield evicted

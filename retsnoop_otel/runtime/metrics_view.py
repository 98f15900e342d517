"""The runtime as its metrics see it: the collectors, the /metrics server and its web config, the OTLP push,
and the per-probe-set state that must outlive scrapes (series limiters, per-workload series).

Kept apart from the capture lifecycle (runtime.py): both read the same Runtime, which this only reads.
"""

from __future__ import annotations

import os
from typing import Any

from retsnoop_otel.command.errors import SetupError
from retsnoop_otel.export.resource import with_cluster_name
from retsnoop_otel.metrics.series import SeriesBounds, SeriesLimiter
from retsnoop_otel.metrics.workload_series import WorkloadSeries, label_value
from retsnoop_otel.runtime.config import ProbeSetConfig, RuntimeConfig
from retsnoop_otel.runtime.settings import RunSettings
from retsnoop_otel.runtime.sinks import ExportTotals, check_outputs


def push_key(cfg: RuntimeConfig) -> tuple:
    """What the OTLP metrics push is built from: a reload whose config differs here starts a new one."""
    return cfg.metrics.otlp, cfg.metrics.otlp_interval_s, cfg.kubernetes.cluster_name


class RuntimeMetrics:
    """Built by the Runtime with itself (`rt`); everything it serves is read at scrape or push time."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self._limiters: dict[str, SeriesLimiter] = {}  # per probe set: which error types got own series

    def collectors(self) -> list[Any]:
        """The families /metrics serves and metrics.otlp pushes, the same both ways: every probe set's, the
        run's own, and the process's (CPU, memory)."""
        from prometheus_client import ProcessCollector

        from retsnoop_otel.metrics.kernel_families import KernelCollector
        from retsnoop_otel.metrics.runtime_families import RuntimeCollector
        return [KernelCollector(lambda: list(self._rt.probe_sets), stats_enabled=self.stats_enabled,
                                exemplars=self.exemplars, origin_exemplars=self.origin_exemplars,
                                limiter=self.series_limiter,
                                duration_range=self.duration_range),
                RuntimeCollector(self.counters, stats_enabled=self.stats_enabled),
                ProcessCollector(proc=os.path.join(self._rt.deps.root, "proc"), registry=None)]

    def registry(self) -> Any:
        """The /metrics registry of `collectors()`."""
        from prometheus_client import CollectorRegistry
        registry = CollectorRegistry(auto_describe=True)  # private (no global state); described, so name[] works
        for collector in self.collectors():
            registry.register(collector)
        return registry

    def bind(self, settings: RunSettings) -> Any:
        """The /metrics and /healthz server (metrics.server.MetricsServer), bound now and answering from
        `answer` on, its registry made then; None without a port."""
        cfg = settings.config
        if cfg.metrics.port is None:
            return None
        from retsnoop_otel.metrics.server import ListenError, MetricsServer
        try:
            return MetricsServer(cfg.metrics.host, cfg.metrics.port, self.registry, self.health,
                                 setting=cfg.names.listen, host_setting=cfg.names.listen_host, web=self.web(settings))
        except ListenError as exc:
            raise SetupError(str(exc)) from None

    @staticmethod
    def modules(settings: RunSettings) -> list[str]:
        """What serving /metrics and the OTLP push import, for runtime/prefetch.py: not before they are needed."""
        out = []
        if settings.config.metrics.port is not None:
            out += ["retsnoop_otel.metrics.http_app", "retsnoop_otel.metrics.kernel_families",
                    "retsnoop_otel.metrics.runtime_families"]
        if settings.metrics is not None:
            out.append("retsnoop_otel.export.metrics_push")
        return out

    def check(self, settings: RunSettings) -> None:
        """agent --check's outputs step: /metrics bound (with its web config) and released at once, the output
        files opened the way the run opens them; nothing listens or is written afterwards. An address in use
        passes: the agent this file is checked for may be the one holding it (a reload keeps its listener)."""
        try:
            server = self.bind(settings)
        except SetupError as exc:
            if "already in use" not in exc.message:
                raise
            server = None
        if server is not None:
            server.close()
        check_outputs(settings)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz: the server answers only once the run is attached (answer), so this is about staying so."""
        rt = self._rt
        age = rt.deps.monotonic() - rt.last_poll
        status = "reloading" if rt.reloading else ("ok" if age < rt.config.metrics.stall_after_s else "stalled")
        sets = list(rt.probe_sets)
        return status != "stalled", {
            "status": status,
            "probe_sets": [{"name": ps.name, "mode": ps.cfg.mode, "attach_mode": ps.mode,
                            "attached_functions": ps.attached} for ps in sets],
            "attached_functions": sum(ps.attached for ps in sets),
            "last_poll_age_s": round(age, 3),
            "reloads": dict(rt.reloads),
        }

    @staticmethod
    def answer(server: Any) -> None:
        """The bound server answers from now on: the run counts every call its probe sets trace."""
        from retsnoop_otel.metrics.server import ListenError
        try:
            server.start()
        except ListenError as exc:
            raise SetupError(str(exc)) from None

    def web(self, settings: RunSettings) -> Any:
        """The loaded web config, watched for changes of its files (metrics.web_tls.WebWatcher); None without."""
        if settings.web is None:
            return None
        from retsnoop_otel.metrics.web_tls import WebWatcher
        return WebWatcher(settings.web, lambda error: self._rt.log.warning(
            "web config change not loaded; the previous one stays in force", error=error))

    def push(self, settings: RunSettings) -> Any:
        """metrics.otlp: the /metrics families pushed every otlp_interval seconds (the same collectors)."""
        if settings.metrics is None:
            return None
        from retsnoop_otel.export.metrics_push import OtlpMetricsPusher
        from retsnoop_otel.export.processor_env import DEFAULT_METRIC_INTERVAL_S
        from retsnoop_otel.metrics.otlp_units import OTLP_UNITS
        reader = settings.reader
        interval = settings.config.metrics.otlp_interval_s or reader.interval_s or DEFAULT_METRIC_INTERVAL_S
        collectors = self.collectors()

        def collect() -> list:
            with self._rt.lock:
                return [family for c in collectors for family in c.collect()]

        assert self._rt.resource is not None
        resource = with_cluster_name(self._rt.resource, settings.config.kubernetes.cluster_name)  # as the spans'
        return OtlpMetricsPusher(collect, self._rt.deps.make_sender(settings.metrics), resource.attributes,
                                 interval, units=OTLP_UNITS, schema_url=resource.schema_url,
                                 temporality=reader.temporality, exponential=reader.exponential).start()

    def stats_enabled(self) -> bool:
        from retsnoop_otel.metrics.kernel_families import read_bpf_stats_enabled
        return read_bpf_stats_enabled(self._rt.deps.root)

    def exemplars(self, probe_set: str, entry_function: str) -> dict:
        sinks = self._rt.route.sinks
        if sinks is None or sinks.exemplars is None:
            return {}
        return sinks.exemplars.for_histogram(probe_set, entry_function)

    def origin_exemplars(self, probe_set: str) -> dict:
        sinks = self._rt.route.sinks
        if sinks is None or sinks.exemplars is None:
            return {}
        return sinks.exemplars.for_origins(probe_set)

    def series_limiter(self, probe_set: str) -> SeriesLimiter | None:
        """The label bounds of metrics, kept across scrapes (a new one when the bounds change on reload)."""
        m = self._rt.config.metrics
        bounds = SeriesBounds(m.max_error_types, m.functions)
        if bounds == SeriesBounds():
            return None
        lim = self._limiters.get(probe_set)
        if lim is None or lim.bounds != bounds:
            lim = self._limiters[probe_set] = SeriesLimiter(bounds)
        return lim

    def duration_range(self, probe_set: str) -> Any:
        """The bucket range of a probe set's histograms (metrics.buckets.DurationRange; None: every slot)."""
        own = next((ps.duration_range for ps in self._rt.config.probe_sets if ps.name == probe_set), None)
        return own or self._rt.config.metrics.duration_range

    def counters(self) -> Any:
        """A metrics.runtime_families.RunCounters snapshot, taken at scrape time."""
        from retsnoop_otel.metrics.runtime_families import RunCounters
        sinks = self._rt.route.sinks
        t = sinks.totals() if sinks is not None else ExportTotals()
        watch = self._rt.route.app_watch
        app = watch.counters if watch is not None and watch.read_app else None
        stacks = watch.unsymbolized if watch is not None else None
        k8s = self._rt.route.workloads.counters() if self._rt.route.workloads is not None else None
        app_fields: dict[str, Any] = {} if app is None else {
            "app_sessions": dict(app.sessions), "app_processes_checked": app.processes_checked,
            "app_processes_publishing": app.processes_publishing, "app_check_errors": app.check_errors,
            "app_exec_watches": dict(app.exec_watches)}
        return RunCounters(t.spans_exported, dict(t.spans_dropped), t.export_errors, self._rt.route.errors,
                           dict(self._rt.reloads), k8s=k8s, **app_fields,
                           traces=sinks.traces.snapshot() if sinks is not None else {},
                           user_stacks_unsymbolized=dict(stacks) if stacks is not None else None)

    def workload_series(self, ps: ProbeSetConfig) -> WorkloadSeries:
        """A probe set's per-workload series: its cgroups named by the workload resolver, decided once."""
        kind = ps.workload_label or "container"

        def label_of(cgroup_id: int) -> str | None:
            workloads = self._rt.route.workloads
            if workloads is None or not workloads.knows_cgroup(cgroup_id):
                return None  # not found in cgroupfs yet: pending (then `unknown`)
            return label_value(workloads.of_cgroup(cgroup_id), kind)

        def alive(cgroup_id: int) -> bool:
            workloads = self._rt.route.workloads
            return workloads is None or workloads.cgroup_alive(cgroup_id)

        return WorkloadSeries(label_of, alive, self._rt.deps.monotonic, self._rt.config.metrics.max_workloads)

"""The families that describe the run as a whole: export counters, reloads, build, BPF statistics switch.

Emitted once per scrape, whatever the number of probe sets; the process families (CPU, memory,
file descriptors) come from prometheus_client's own ProcessCollector next to this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from retsnoop_otel import __version__
from retsnoop_otel.metrics.kernel_families import read_bpf_stats_enabled
from retsnoop_otel.workload.k8s_settings import REASONS as WATCH_ERROR_REASONS


@dataclass(frozen=True)
class RunCounters:
    """A snapshot of the run's own counters, taken at scrape time."""

    spans_exported: int = 0
    spans_dropped: Mapping[str, int] = field(default_factory=dict)  # cause -> spans
    export_errors: int = 0
    session_errors: int = 0
    reloads: Mapping[str, int] = field(default_factory=lambda: {"success": 0, "failure": 0})
    app_sessions: Mapping[str, int] | None = None  # outcome -> sessions; None: thread context not read
    app_processes_checked: int = 0
    app_processes_publishing: int = 0
    app_check_errors: int = 0
    user_stacks_unsymbolized: Mapping[str, int] | None = None  # reason -> sessions; None: no user stacks taken
    app_exec_watches: Mapping[str, int] = field(default_factory=dict)  # outcome -> processes watched from exec
    k8s: Any = None  # workload.k8s_watch.WatchCounters while the pod metadata watch is on
    traces: Mapping[tuple[str, str, str], int] = field(default_factory=dict)  # (probe set, service, status) -> n


class RuntimeCollector(Collector):
    def __init__(self, counters: Callable[[], RunCounters],
                 stats_enabled: Callable[[], bool] = read_bpf_stats_enabled) -> None:
        self._counters = counters
        self._stats_enabled = stats_enabled

    def collect(self) -> Iterator[Metric]:
        c = self._counters()
        yield CounterMetricFamily("retsnoop_spans_exported", "Spans accepted by the exporters", value=c.spans_exported)
        dropped = CounterMetricFamily("retsnoop_spans_dropped", "Spans not exported, by cause", labels=["cause"])
        for cause, n in sorted(c.spans_dropped.items()):
            dropped.add_metric([cause], n)
        yield dropped
        yield CounterMetricFamily("retsnoop_export_errors", "Failed export requests", value=c.export_errors)
        traces = CounterMetricFamily("retsnoop_traces", "Traces handed to the exporters, by probe set, the "
                                     "service.name of their spans and their status (error, ok); a probe set's "
                                     "services beyond metrics.max_workloads count as other",
                                     labels=["probe_set", "service", "status"])
        for (probe_set, service, status), n in sorted(c.traces.items()):
            traces.add_metric([probe_set, service, status], n)
        yield traces
        yield CounterMetricFamily("retsnoop_session_errors", "Sessions that could not be turned into spans",
                                  value=c.session_errors)
        reloads = CounterMetricFamily("retsnoop_config_reloads",
                                      "Config reloads (SIGHUP or a change of the file) by result", labels=["result"])
        for result in ("success", "failure"):
            reloads.add_metric([result], c.reloads.get(result, 0))
        yield reloads
        if c.app_sessions is not None:
            yield from _app_families(c)
        if c.user_stacks_unsymbolized is not None:
            unsymbolized = CounterMetricFamily(
                "retsnoop_user_stacks_unsymbolized", "Sessions output without their user stack's symbols (its "
                "addresses only), by reason: timeout (not symbolized within limits.user_stack_wait_s), queue_full "
                "(the symbolizer's queue was full: not even tried), error", labels=["reason"])
            for reason, n in sorted(c.user_stacks_unsymbolized.items()):
                unsymbolized.add_metric([reason], n)
            yield unsymbolized
        if c.k8s is not None:
            yield from _k8s_families(c.k8s)
        yield GaugeMetricFamily("retsnoop_agent_up", "1 while retsnoop-otel runs", value=1)
        yield GaugeMetricFamily("retsnoop_bpf_stats_enabled", "1 while the kernel counts BPF program runs and run "
                                "time (sysctl kernel.bpf_stats_enabled)", value=int(self._stats_enabled()))
        info = GaugeMetricFamily("retsnoop_build_info", "retsnoop-otel version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


def _app_families(c: RunCounters) -> Iterator[Metric]:
    """How often kernel sessions could join the application's trace, and why not when they could not."""
    sessions = CounterMetricFamily(
        "retsnoop_app_context_sessions", "Reported sessions of processes that publish OTel thread context, by what "
        "their thread held: linked (joined the sampled application trace), ok (valid, unsampled: span link), "
        "no_record, invalid, fault (user memory unreadable), unknown_process (started before the process was "
        "located)", labels=["outcome"])
    for outcome, n in sorted((c.app_sessions or {}).items()):
        sessions.add_metric([outcome], n)
    yield sessions
    yield CounterMetricFamily("retsnoop_app_context_processes_checked", "Processes checked for OTel thread context",
                              value=c.app_processes_checked)
    yield CounterMetricFamily("retsnoop_app_context_processes_publishing",
                              "Checks that found a process publishing OTel thread context",
                              value=c.app_processes_publishing)
    yield CounterMetricFamily("retsnoop_app_context_check_errors",
                              "Processes whose thread-context location could not be read", value=c.app_check_errors)
    watches = CounterMetricFamily(
        "retsnoop_app_context_exec_watches", "Processes watched from their exec (checked again as their libraries "
        "load, 50 ms doubling to 1 s, for 60 s), by how the watch ended: located (the answer was in place before "
        "their sessions needed it, unless one came first), not_located (nothing published within 60 s: their "
        "sessions ask instead), exited, error (unreadable), skipped (too many watched at once)", labels=["outcome"])
    for outcome, n in sorted(c.app_exec_watches.items()):
        watches.add_metric([outcome], n)
    yield watches


def _k8s_families(k: Any) -> Iterator[Metric]:
    """Whether the pod names on spans are current: the watch of this node's pods and why it failed."""
    yield GaugeMetricFamily("retsnoop_k8s_metadata_current", "1 while the pod metadata watch is connected "
                            "(k8s.pod.name, k8s.namespace.name, k8s.container.name are current), 0 while the API "
                            "server cannot be reached or refuses", value=int(k.current))
    errors = CounterMetricFamily("retsnoop_k8s_watch_errors", "Failed pod list or watch requests by reason: "
                                 "unreachable, unauthorized, forbidden (RBAC), gone (410: listed again), server_error, "
                                 "invalid_response", labels=["reason"])
    # every reason from the start, at 0: an alert on increase() sees the first error (a series that appears with
    # its first increment has no earlier sample to increase from)
    for reason in sorted({*WATCH_ERROR_REASONS, *k.errors}):
        errors.add_metric([reason], k.errors.get(reason, 0))
    yield errors
    yield CounterMetricFamily("retsnoop_k8s_pod_lists", "Full lists of this node's pods (at start, after a 410 or "
                              "an outage)", value=k.lists)
    yield GaugeMetricFamily("retsnoop_k8s_pods", "Pods of this node known from the API server", value=k.pods)

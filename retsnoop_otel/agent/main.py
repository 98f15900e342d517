"""`retsnoop-otel agent`: the long-running exporter driven by a YAML config.

One capture loop polls every probe set's ring buffer; each kept session becomes one trace handed
to bounded export queues (the network never blocks capture). SIGHUP reloads the config: the new
probe sets are attached before the old ones are detached, and a bad new config (or one that does
not attach) leaves the old ones running. SIGTERM/SIGINT detach everything, flush the exporters
within a deadline and exit 0. Kernel-facing parts come from AgentDeps so tests can replace them.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import Session
from retsnoop_otel.metrics.collector import (
    BPF_STATS_ENABLED,
    ExemplarStore,
    MetricsCollector,
    SeriesBounds,
    SeriesLimiter,
    bpf_stats_enabled_family,
    func_label,
    make_registry,
    read_bpf_stats_enabled,
)
from retsnoop_otel.metrics.server import HttpServer, ListenError
from retsnoop_otel.runtime.config import AgentConfig, ConfigError, OtlpConfig, load_config
from retsnoop_otel.runtime.logs import AgentLog, bridge_library_logs
from retsnoop_otel.runtime.probe_set import (
    KernelEnv,
    ProbeSet,
    ProbeSetError,
    SetupError,
    TracerFactory,
    load_kernel_env,
    real_tracer_factory,
    resolve,
    start_probe_sets,
)

POLL_MS = 100
SHUTDOWN_FLUSH_S = 5.0
HOUSEKEEPING_S = 60.0  # clock offset re-measurement and the periodic loss summary
# metric families that describe the agent as a whole: emitted once, not per probe set
_AGENT_FAMILIES = ("retsnoop_spans_exported", "retsnoop_spans_dropped", "retsnoop_export_errors",
                   "retsnoop_build_info")


def _default_exporter(cfg: OtlpConfig) -> Any:
    from retsnoop_otel.export.exporters import build_otlp_exporter
    return build_otlp_exporter(cfg)


def _default_metric_exporter(cfg: OtlpConfig) -> Any:
    from retsnoop_otel.export.exporters import build_otlp_metric_exporter
    return build_otlp_metric_exporter(cfg)


def _default_offset() -> int:
    from retsnoop_otel.capture.clock import measure_boot_to_wall_offset
    return measure_boot_to_wall_offset()


def _default_resource() -> Any:
    from retsnoop_otel.export.resource import build_resource
    return build_resource()


@dataclass
class AgentDeps:
    """Everything that touches the kernel, the network or the clock."""

    load_env: Callable[[AgentConfig], KernelEnv] = lambda cfg: load_kernel_env(cfg.vmlinux)
    tracer_factory: TracerFactory = real_tracer_factory
    make_exporter: Callable[[OtlpConfig], Any] = _default_exporter
    make_metric_exporter: Callable[[OtlpConfig], Any] = _default_metric_exporter
    boot_to_wall_offset: Callable[[], int] = _default_offset
    make_resource: Callable[[], Any] = _default_resource
    console: TextIO = field(default_factory=lambda: sys.stdout)
    monotonic: Callable[[], float] = time.monotonic


@dataclass
class _Totals:
    spans_exported: int = 0
    spans_dropped: dict[str, int] = field(default_factory=dict)
    export_errors: int = 0


class Outputs:
    """The configured destinations for sessions: OTLP and file exporters (bounded queues), console text."""

    def __init__(self, cfg: AgentConfig, deps: AgentDeps, resource: Any) -> None:
        from retsnoop_otel.export.otlp import OtlpTraceSink
        self.cfg = cfg
        self._console = deps.console if cfg.exporter.console else None
        self._resource = resource
        self.sinks: list[Any] = []
        self.span_limit_dropped = 0
        self._encoders: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._final: _Totals | None = None  # counters at close, when the sinks are gone
        self.exemplars = ExemplarStore()  # exported trace ids for the session duration histograms
        try:
            ex = cfg.exporter
            q = cfg.limits.export_queue_spans
            if ex.otlp is not None:
                self.sinks.append(OtlpTraceSink(protocol=ex.otlp.protocol, exporter=deps.make_exporter(ex.otlp),
                                                max_queue_spans=q))
            if ex.file is not None:
                from retsnoop_otel.export.exporters import OtlpJsonFileExporter
                self.sinks.append(OtlpTraceSink(protocol="grpc", exporter=OtlpJsonFileExporter(ex.file),
                                                max_queue_spans=q))
        except BaseException:
            self.close(0.0)
            raise

    def emit(self, ps: ProbeSet, session: Session, offset_ns: int) -> None:
        if self._console is not None:
            if ps.cfg.mode == "calls" and session.calls:
                from retsnoop_otel.render.calls import render_calls
                from retsnoop_otel.render.stack import render_header
                text = render_header(session, offset_ns) + "\n\n" + render_calls(session, ps.funcs) + "\n"
            else:
                from retsnoop_otel.render.stack import render_stack
                text = render_stack(session, ps.funcs, ps.symbolizer, offset_ns)  # type: ignore[arg-type]
            self._console.write(f"[{ps.name}] {text}")
            self._console.flush()
        if not self.sinks:
            return
        encoder = self._encoders.get(ps)
        if encoder is None:  # one per probe set: a reload builds new probe sets, and so new encoders
            from functools import partial

            from retsnoop_otel.export.otlp_fast import SpanEncoder
            from retsnoop_otel.symbols.symbolize import definition
            encoder = self._encoders[ps] = SpanEncoder(
                ps.funcs, self._resource, symbolize=ps.symbolizer.describe,  # type: ignore[attr-defined]
                locate=partial(definition, ps.symbolizer),
                export_addresses=self.cfg.exporter.export_addresses, max_spans=self.cfg.limits.max_spans_per_trace)
        spans = encoder.encode(session, offset_ns)
        self.span_limit_dropped += spans.spans_dropped + session.calls_cut  # both: the per-trace span limit
        accepted = [sink.submit(spans) for sink in self.sinks]
        if any(accepted) and session.entry_func_id is not None:  # an exemplar must lead to a trace that exists
            self.exemplars.record(ps.name, func_label(ps.funcs, session.entry_func_id),
                                  session.end_ns - session.start_ns, spans.trace_id, session.end_ns + offset_ns)

    def totals(self) -> _Totals:
        if self._final is not None:
            return self._final
        t = _Totals()
        for sink in self.sinks:
            s = sink.stats()
            t.spans_exported += s.spans_exported
            t.export_errors += s.export_errors
            for cause, n in s.spans_dropped.items():
                t.spans_dropped[cause] = t.spans_dropped.get(cause, 0) + n
        if self.span_limit_dropped:
            t.spans_dropped["span_limit"] = t.spans_dropped.get("span_limit", 0) + self.span_limit_dropped
        return t

    def close(self, timeout: float) -> None:
        """Flush within `timeout` in total (shared by the sinks), then stop them."""
        deadline = time.monotonic() + timeout
        for sink in self.sinks:
            sink.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        self._final = self.totals()
        self.sinks = []


class Agent:
    def __init__(self, config_path: str, deps: AgentDeps | None = None, log: AgentLog | None = None) -> None:
        self.config_path = config_path
        self.deps = deps or AgentDeps()
        self.log = log or AgentLog()
        self.config: AgentConfig | None = None
        self.env: KernelEnv | None = None
        self.probe_sets: list[ProbeSet] = []
        self.outputs: Outputs | None = None
        self.http: HttpServer | None = None
        self.metrics_push: Any = None  # otlp_metrics.OtlpMetricsPusher when metrics.otlp is set
        self.reloads = {"success": 0, "failure": 0}
        self.emit_errors = 0
        self.reloading = False
        self._stop = False
        self._reload = False
        self._lock = threading.RLock()  # guards probe_sets/outputs against the scrape thread
        self._resource = None
        self._offset_ns = 0
        self.last_poll = self.deps.monotonic()
        self._next_housekeeping = 0.0
        self._reported: dict[str, int] = {}
        self._limiters: dict[str, SeriesLimiter] = {}  # per probe set: which error types got own series

    def series_limiter(self, probe_set: str) -> SeriesLimiter | None:
        """The label bounds of metrics, kept across scrapes (a new one when the bounds change on reload)."""
        if self.config is None:
            return None
        m = self.config.metrics
        bounds = SeriesBounds(m.max_error_types, m.functions)
        if bounds == SeriesBounds():
            return None
        lim = self._limiters.get(probe_set)
        if lim is None or lim.bounds != bounds:
            lim = self._limiters[probe_set] = SeriesLimiter(bounds)
        return lim

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the config and attach everything; on failure nothing is left attached or listening."""
        cfg = load_config(self.config_path)
        self.log.configure(cfg.logging.format, cfg.logging.level)
        self._offset_ns = self.deps.boot_to_wall_offset()
        self._resource = self.deps.make_resource()
        try:
            self.http = HttpServer(cfg.metrics.host, cfg.metrics.port, make_registry(AgentCollector(self)),
                                   self.health)
            self.env = self.deps.load_env(cfg)
            self.outputs = Outputs(cfg, self.deps, self._resource)
            self.probe_sets = start_probe_sets(cfg.probe_sets, self.env, cfg.limits, self.deps.tracer_factory,
                                               self._on_session)
            self.metrics_push = self._start_metrics_push(cfg)
        except BaseException:
            self.shutdown(0.0)
            raise
        self.config = cfg
        self.last_poll = self.deps.monotonic()
        self._next_housekeeping = self.last_poll + HOUSEKEEPING_S
        for ps in self.probe_sets:
            self._log_attached(ps)
        self.log.info("agent started", config=self.config_path, listen=cfg.metrics.listen,
                      probe_sets=len(self.probe_sets), version=__version__)

    def _start_metrics_push(self, cfg: AgentConfig) -> Any:
        """metrics.otlp: the /metrics families pushed every otlp_interval seconds (same collector)."""
        if cfg.metrics.otlp is None:
            return None
        from retsnoop_otel.export.otlp_metrics import OtlpMetricsPusher
        collector = AgentCollector(self)
        return OtlpMetricsPusher(collector.collect, self.deps.make_metric_exporter(cfg.metrics.otlp),
                                 self._resource, cfg.metrics.otlp_interval_s).start()

    def _log_attached(self, ps: ProbeSet) -> None:
        self.log.info("probe set attached", probe_set=ps.name, mode=ps.cfg.mode, attach_mode=ps.mode,
                      functions=ps.attached, entry_functions=ps.discovery.entry_count,
                      failed=len(ps.attach_failures))
        for name, err in ps.attach_failures[:5]:
            self.log.warning("function not attached", probe_set=ps.name, function=name, error=err.splitlines()[0])

    def request_stop(self) -> None:
        self._stop = True

    def request_reload(self) -> None:
        self._reload = True

    def run(self) -> int:
        """The capture loop; returns when a stop was requested (after shutdown)."""
        try:
            while not self._stop:
                if self._reload:
                    self._reload = False
                    self.reload()
                    continue
                self.poll_once()
        finally:
            self.shutdown(SHUTDOWN_FLUSH_S)
        return 0

    def poll_once(self) -> None:
        sets = self.probe_sets
        per_set = max(1, POLL_MS // max(1, len(sets)))
        for ps in sets:
            if self._stop or self._reload:
                break
            ps.poll(per_set)
        now = self.deps.monotonic()
        self.last_poll = now
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_S
            self._housekeeping()

    def _on_session(self, ps: ProbeSet, session: Session) -> None:
        outputs = self.outputs
        if outputs is None:
            return
        try:
            outputs.emit(ps, session, self._offset_ns)
        except Exception as exc:  # noqa: BLE001 - one bad session must not stop capture
            self.emit_errors += 1
            if self.emit_errors == 1:
                self.log.error("failed to export a session (further failures are counted in "
                               "retsnoop_session_errors_total)", probe_set=ps.name, error=repr(exc))

    def reload(self) -> bool:
        """Apply the config file again; on any error keep what runs now. Returns success."""
        old_cfg = self.config
        try:
            cfg = load_config(self.config_path)
        except ConfigError as exc:
            return self._reload_failed(str(exc))
        self.reloading = True
        new_http = new_outputs = env = None
        new_sets: list[ProbeSet] = []
        try:
            if old_cfg is None or (cfg.metrics.host, cfg.metrics.port) != (old_cfg.metrics.host, old_cfg.metrics.port):
                new_http = HttpServer(cfg.metrics.host, cfg.metrics.port, make_registry(AgentCollector(self)),
                                      self.health)
            if old_cfg is None or (cfg.exporter, cfg.limits) != (old_cfg.exporter, old_cfg.limits):
                new_outputs = Outputs(cfg, self.deps, self._resource)
            env = self.deps.load_env(cfg)
            new_sets = start_probe_sets(cfg.probe_sets, env, cfg.limits, self.deps.tracer_factory, self._on_session)
        except Exception as exc:  # noqa: BLE001 - whatever fails, the running config stays
            if new_http is not None:
                new_http.close()
            if new_outputs is not None:
                new_outputs.close(0.0)
            if env is not None:
                env.close()
            self.reloading = False
            return self._reload_failed(str(exc))
        # the new sets are attached: now drain and detach the old ones
        with self._lock:
            old_sets, self.probe_sets = self.probe_sets, new_sets
            old_outputs = None
            if new_outputs is not None:
                old_outputs, self.outputs = self.outputs, new_outputs
            old_env, self.env = self.env, env
            old_http = None
            if new_http is not None:
                old_http, self.http = self.http, new_http
            for ps in old_sets:
                self._drain_and_close(ps)
        if old_env is not None:
            old_env.close()
        if old_http is not None:
            old_http.close()
        if old_outputs is not None:
            old_outputs.close(SHUTDOWN_FLUSH_S)
        if old_cfg is None or (cfg.metrics.otlp, cfg.metrics.otlp_interval_s) != (
                old_cfg.metrics.otlp, old_cfg.metrics.otlp_interval_s):
            if self.metrics_push is not None:
                self.metrics_push.stop(final_push=True)
            self.metrics_push = None
            try:
                self.metrics_push = self._start_metrics_push(cfg)
            except Exception as exc:  # noqa: BLE001 - capture goes on without the push
                self.log.error("OTLP metrics export not started", error=str(exc))
        self.config = cfg
        self.log.configure(cfg.logging.format, cfg.logging.level)
        self.reloads["success"] += 1
        self.reloading = False
        self.last_poll = self.deps.monotonic()
        self.log.info("config reloaded", config=self.config_path, probe_sets=len(new_sets))
        for ps in new_sets:
            self._log_attached(ps)
        return True

    def _reload_failed(self, why: str) -> bool:
        self.reloads["failure"] += 1
        self.log.error("config reload failed; the previous config keeps running", config=self.config_path,
                       error=why)
        return False

    def _drain_and_close(self, ps: ProbeSet) -> None:
        try:
            ps.poll(0)  # sessions already in the ring buffer still go out
        except Exception as exc:  # noqa: BLE001 - detaching matters more than the last records
            self.log.warning("could not drain probe set before detaching", probe_set=ps.name, error=str(exc))
        ps.close()

    def shutdown(self, flush_s: float) -> None:
        """Detach everything, flush the exporters within `flush_s`, stop listening. Idempotent."""
        if self.metrics_push is not None:  # last push while the kernel maps still hold the counts
            push, self.metrics_push = self.metrics_push, None
            push.stop(final_push=flush_s > 0)
        with self._lock:
            sets, self.probe_sets = self.probe_sets, []
            for ps in sets:
                self._drain_and_close(ps)
        if sets:
            self.log.info("detached", probe_sets=len(sets))
        if self.outputs is not None:
            outputs, self.outputs = self.outputs, None
            t0 = time.monotonic()
            outputs.close(flush_s)
            t = outputs.totals()
            self.log.info("exporters flushed", seconds=round(time.monotonic() - t0, 3),
                          spans_exported=t.spans_exported, spans_dropped=sum(t.spans_dropped.values()))
        if self.http is not None:
            self.http.close()
            self.http = None
        if self.env is not None:
            self.env.close()
            self.env = None

    # ---- observability ---------------------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        age = self.deps.monotonic() - self.last_poll
        stall = self.config.metrics.stall_after_s if self.config else 30.0
        status = "reloading" if self.reloading else ("ok" if age < stall else "stalled")
        sets = list(self.probe_sets)
        return status != "stalled", {
            "status": status,
            "probe_sets": [{"name": ps.name, "mode": ps.cfg.mode, "attach_mode": ps.mode,
                            "attached_functions": ps.attached} for ps in sets],
            "attached_functions": sum(ps.attached for ps in sets),
            "last_poll_age_s": round(age, 3),
            "reloads": dict(self.reloads),
        }

    def _housekeeping(self) -> None:
        """Re-measure the clock offset (NTP steps) and log losses that grew since the last summary."""
        try:
            self._offset_ns = self.deps.boot_to_wall_offset()
        except RuntimeError as exc:
            self.log.warning("clock offset not re-measured", error=str(exc))
        losses: dict[str, int] = {}
        with self._lock:
            for ps in self.probe_sets:
                try:
                    cap = ps.tracer.capture_stats()
                except Exception:  # noqa: BLE001 - a summary is not worth failing the loop
                    continue
                losses[f"{ps.name}.sessions_dropped"] = cap.dropped_sessions
                losses[f"{ps.name}.records_lost"] = cap.dropped_records
            if self.outputs is not None:
                for cause, n in self.outputs.totals().spans_dropped.items():
                    losses[f"spans_dropped.{cause}"] = n
        grown = {k: v - self._reported.get(k, 0) for k, v in losses.items() if v > self._reported.get(k, 0)}
        self._reported.update(losses)
        if grown:
            self.log.warning("data lost since the last summary", **grown)


class AgentCollector(Collector):
    """All probe sets' kernel metrics (probe_set label on each) plus the agent's own.

    `root` is where /proc is looked up (tests point it at a fake tree).
    """

    def __init__(self, agent: Agent, root: str = "/") -> None:
        self.agent = agent
        self.root = root

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        families: dict[str, Metric] = {}
        stats_on = read_bpf_stats_enabled(self.root)  # once per scrape, shared by the probe sets
        attached = GaugeMetricFamily("retsnoop_attached_functions", "Kernel functions attached, by probe set "
                                     "and attach mode", labels=["probe_set", "mode"])
        sampled = CounterMetricFamily("retsnoop_sessions_not_exported", "Sessions captured but not exported, by "
                                      "reason (sampled: successful session not sampled; filtered: error filter)",
                                      labels=["probe_set", "reason"])
        evicted = CounterMetricFamily("retsnoop_sessions_evicted", "Half-assembled sessions dropped in user space "
                                      "because too many threads had one open at once", labels=["probe_set"])
        with agent._lock:
            store = agent.outputs.exemplars if agent.outputs is not None else None
            for ps in agent.probe_sets:
                tr = ps.tracer
                per_set = MetricsCollector(
                    ps.name, ps.funcs, tr.func_stats, tr.capture_stats, None, tr.session_stats,
                    program_stats=tr.program_stats, stats_enabled=lambda: stats_on,
                    exemplars=functools.partial(store.for_histogram, ps.name) if store is not None else None,
                    limiter=agent.series_limiter(ps.name))
                for fam in per_set.collect():
                    if fam.name in _AGENT_FAMILIES or fam.name == BPF_STATS_ENABLED:
                        continue
                    merged = families.get(fam.name)
                    if merged is None:
                        merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                    for s in fam.samples:
                        labels = s.labels if "probe_set" in s.labels else {"probe_set": ps.name, **s.labels}
                        merged.samples.append(s._replace(labels=labels))
                attached.add_metric([ps.name, ps.mode], ps.attached)
                sampled.add_metric([ps.name, "sampled"], ps.sampled_out)
                sampled.add_metric([ps.name, "filtered"], ps.filtered_out)
                evicted.add_metric([ps.name], ps.evicted)
            totals = agent.outputs.totals() if agent.outputs is not None else _Totals()
        yield from families.values()
        yield attached
        yield sampled
        yield evicted
        yield CounterMetricFamily("retsnoop_spans_exported", "Spans accepted by the exporters",
                                  value=totals.spans_exported)
        dropped = CounterMetricFamily("retsnoop_spans_dropped", "Spans not exported, by cause", labels=["cause"])
        for cause, n in sorted(totals.spans_dropped.items()):
            dropped.add_metric([cause], n)
        yield dropped
        yield CounterMetricFamily("retsnoop_export_errors", "Failed export requests", value=totals.export_errors)
        yield CounterMetricFamily("retsnoop_session_errors", "Sessions that could not be turned into spans",
                                  value=agent.emit_errors)
        reloads = CounterMetricFamily("retsnoop_config_reloads", "Config reloads (SIGHUP) by result",
                                      labels=["result"])
        for result in ("success", "failure"):
            reloads.add_metric([result], agent.reloads[result])
        yield reloads
        yield GaugeMetricFamily("retsnoop_agent_up", "1 while the agent runs", value=1)
        yield bpf_stats_enabled_family(stats_on)
        info = GaugeMetricFamily("retsnoop_build_info", "retsnoop-otel version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


# ---- command line --------------------------------------------------------------------------------


def install_signal_handlers(agent: Agent) -> None:
    """SIGHUP: reload; SIGTERM/SIGINT: stop. The loop acts on them between polls."""
    signal.signal(signal.SIGHUP, lambda _s, _f: agent.request_reload())
    signal.signal(signal.SIGTERM, lambda _s, _f: agent.request_stop())
    signal.signal(signal.SIGINT, lambda _s, _f: agent.request_stop())


def check(path: str, out: TextIO, load_env: Callable[[AgentConfig], KernelEnv] | None = None) -> int:
    """`agent --check`: validate, then resolve every probe set's globs against this kernel (no attach)."""
    from retsnoop_otel.symbols.discovery import format_dry_run
    cfg = load_config(path)
    print(f"{path}: configuration is valid ({len(cfg.probe_sets)} probe sets)", file=out)
    env = (load_env or AgentDeps().load_env)(cfg)
    try:
        failed = 0
        for ps in cfg.probe_sets:
            try:
                disc = resolve(ps, env)
            except ProbeSetError as exc:
                print(f"\nprobe set '{ps.name}': ERROR: {exc}", file=out)
                failed += 1
                continue
            sampling = ("success sessions: none" if not ps.sampling.captures_success else
                        f"success sessions: {ps.sampling.success_rate_per_s:g}/s per entry function"
                        if ps.sampling.success_rate_per_s else
                        f"success sessions: probability {ps.sampling.success_probability:g}")
            print(f"\nprobe set '{ps.name}' (mode {ps.mode}, attach_mode {ps.attach_mode} -> {disc.mode}, "
                  f"{sampling}):", file=out)
            print("  " + format_dry_run(disc).replace("\n", "\n  "), file=out)
    finally:
        env.close()
    return 1 if failed else 0


def main(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    p = argparse.ArgumentParser(prog="retsnoop-otel agent", description="Run the long-running exporter: "
                                "probe sets from a YAML config, sessions as OTLP traces, metrics on /metrics.")
    p.add_argument("--config", metavar="FILE", help="YAML config (see config/agent.yaml)")
    p.add_argument("--check", metavar="FILE", help="validate FILE and resolve its globs against the running "
                   "kernel without attaching; exit 0 when every probe set would attach")
    args = p.parse_args(argv)
    if args.check:
        try:
            return check(args.check, out)
        except (ConfigError, SetupError) as exc:
            print(f"retsnoop-otel agent: {exc}", file=err)
            return 1
    if not args.config:
        p.error("--config FILE is required (or --check FILE)")
    log = AgentLog(err)
    bridge_library_logs(log)  # the SDK exporters' own warnings follow the configured log format too
    agent = Agent(args.config, log=log)
    install_signal_handlers(agent)
    try:
        agent.start()
    except ConfigError as exc:
        log.error("invalid config", error=str(exc))
        return 2
    except (SetupError, ProbeSetError, ListenError, ValueError) as exc:
        log.error("cannot start", error=str(exc))
        return 1
    return agent.run()

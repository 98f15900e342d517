"""The one capture runtime behind `trace` and `agent`: inputs, kernel environment, probe sets, poll loop, sinks.

`start` is the one driver of the phases, in the order that keeps a refused run from leaving anything
behind: settings (pure: globs, cgroups, vmlinux, OTLP and OTEL_* settings, web config; settings.py;
the OTEL_* values it ignores go to the hook's warned() at once), outputs (binds /metrics, opens files
and exporters), kernel (privileges, then the kernel's facts), discovery (per probe set, nothing
attached), attach. A command says what it needs between them through a StartHook (trace's -v lines
and --dry-run, agent --check's report, the agent's log) instead of sequencing the phases itself.
`reload` runs the same phases for a new config, building the changed parts beside the running ones
and swapping them in once attached, so a bad new config leaves the old one running. Everything that
touches the kernel, the network or the clock comes in through RuntimeDeps, so the lifecycle runs in
unit tests without a kernel.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from retsnoop_otel.appctx.process_readers import AppSources
from retsnoop_otel.appctx.watch import AppWatcher, watches
from retsnoop_otel.capture.model import CaptureStats, Session
from retsnoop_otel.capture.records import AppRecord
from retsnoop_otel.export.otlp_settings import OtlpSettings
from retsnoop_otel.export.resource import Resource, build_resource
from retsnoop_otel.runtime.config import ProbeSetConfig, RuntimeConfig, SymbolsConfig
from retsnoop_otel.runtime.environment import (
    KernelEnv,
    check_privileges,
    find_vmlinux,
    kernel_state,
    load_kernel_env,
)
from retsnoop_otel.runtime.errors import RunRefused
from retsnoop_otel.runtime.heap import freeze_heap, refreeze_heap
from retsnoop_otel.runtime.logs import EventLog
from retsnoop_otel.runtime.metrics_view import RuntimeMetrics
from retsnoop_otel.runtime.probe_set import (
    ProbeSet,
    TracerFactory,
    hand_over,
    real_tracer_factory,
    resolve,
    start_probe_sets,
)
from retsnoop_otel.runtime.requests import Requests
from retsnoop_otel.runtime.settings import RunSettings, run_settings
from retsnoop_otel.runtime.sinks import Sinks
from retsnoop_otel.runtime.startup import Phase, attach_phases, phase_since
from retsnoop_otel.symbols import discovery
from retsnoop_otel.workload.k8s_settings import KubeSettings
from retsnoop_otel.workload.resolver import WorkloadResolver, build_resolver

POLL_MS = 100
SHUTDOWN_FLUSH_S = 5.0
HOUSEKEEPING_S = 60.0  # clock offset re-measurement and the periodic loss summary
Resolved = list[tuple[Any, discovery.Discovery]]


def _build_sender(settings: OtlpSettings) -> Any:
    from retsnoop_otel.export.senders import build_sender  # grpc and protobuf load only for OTLP runs
    return build_sender(settings)


def _boot_to_wall_offset() -> int:
    from retsnoop_otel.capture.clock import measure_boot_to_wall_offset
    return measure_boot_to_wall_offset()


class RuntimeDeps:
    """Everything that touches the kernel, the network, the clock or the host's files."""

    __slots__ = ("load_env", "kernel_state", "find_vmlinux", "check_privileges", "tracer_factory", "make_sender",
                 "boot_to_wall_offset", "make_resource", "console", "monotonic", "environ", "root", "app_sources",
                 "make_workloads")

    def __init__(self, load_env: Callable[[SymbolsConfig, str | None, tuple[str, str | None] | None], KernelEnv]
                 = load_kernel_env, kernel_state: Callable[[], object] = kernel_state,
                 find_vmlinux: Callable[[SymbolsConfig, str], str | None] = find_vmlinux,
                 check_privileges: Callable[[], None] = check_privileges,
                 tracer_factory: TracerFactory = real_tracer_factory,
                 make_sender: Callable[[OtlpSettings], Any] = _build_sender,
                 boot_to_wall_offset: Callable[[], int] = _boot_to_wall_offset,
                 make_resource: Callable[[Mapping[str, str]], Resource] = build_resource, console: TextIO | None = None,
                 monotonic: Callable[[], float] = time.monotonic, environ: Mapping[str, str] | None = None,
                 root: str = "/", app_sources: Callable[[str, bool, bool], AppSources] = AppSources.from_proc,
                 make_workloads: Callable[[str, Callable[[], float], KubeSettings | None, Any], WorkloadResolver]
                 = build_resolver) -> None:
        self.load_env = load_env
        self.kernel_state = kernel_state  # a reload keeps the loaded env while this is unchanged
        self.find_vmlinux = find_vmlinux
        self.check_privileges = check_privileges
        self.tracer_factory = tracer_factory
        self.make_sender = make_sender  # -> export.senders.Sender
        self.boot_to_wall_offset = boot_to_wall_offset
        self.make_resource = make_resource
        self.console = sys.stdout if console is None else console  # sys.stdout as of construction
        self.monotonic = monotonic
        self.environ = os.environ if environ is None else environ
        self.root = root  # where /proc is read for the process and BPF statistics metrics
        self.app_sources = app_sources  # (proc root, user stacks, lines)
        # (root, clock, pod watch settings or None, log) -> the workload resolver; the watch starts with it
        self.make_workloads = make_workloads


class StartHook:
    """What a command does between the phases of `Runtime.start` and `reload`. This one says nothing and goes
    through every phase: the agent's run."""

    outputs = True  # bind /metrics and open the outputs (agent --check needs neither)
    each_set = False  # a probe set whose functions cannot be resolved goes to discovered(); the rest go on

    def warned(self, runtime: Runtime, messages: tuple[str, ...]) -> None:
        """The OTEL_* values ignored (RunSettings.warnings), right after the settings: one log line each."""
        for message in messages:
            runtime.log.warning(message)

    def discovered(self, ps: ProbeSetConfig, found: discovery.Discovery | None, error: RunRefused | None) -> None:
        """A probe set's functions and attach mode, or (with each_set) why it has none here."""

    def go_on(self, runtime: Runtime, found: Resolved) -> bool:
        """Every set is resolved and nothing is attached yet: False stops the start here (a dry run)."""
        return True

    def attached(self, runtime: Runtime, sets: list[ProbeSet]) -> None:
        """The sets are attached (at a start, or swapped in at a reload)."""


class Runtime:
    def __init__(self, config: RuntimeConfig, deps: RuntimeDeps | None = None, log: EventLog | None = None) -> None:
        self.config = config
        self.deps = deps or RuntimeDeps()
        self.log = log or EventLog(level="error")
        self.env: KernelEnv | None = None
        self.env_key: tuple | None = None  # what self.env was loaded for (None: load again at a reload)
        self.probe_sets: list[ProbeSet] = []
        self.sinks: Sinks | None = None
        self.server: Any = None  # metrics.server.MetricsServer while /metrics is served
        self.metrics_push: Any = None  # export.metrics_push.OtlpMetricsPusher when metrics.otlp is set
        self.reloads = {"success": 0, "failure": 0}
        self.session_errors = 0
        self.reloading = False
        self.lock = threading.RLock()  # guards probe_sets/sinks against the scrape thread
        self.resource: Resource | None = None
        self._offset_ns = 0
        self.last_poll = self.deps.monotonic()
        self._next_housekeeping = 0.0
        self._reported: dict[str, int] = {}
        self.app_watch: AppWatcher | None = None  # while a probe set reads thread context or user stacks
        self.workloads: WorkloadResolver | None = None  # container, pod and executable name of each kept session
        self.metrics = RuntimeMetrics(self)  # collectors, /metrics server, OTLP push
        self.phases: list[Phase] = []  # where the last start or reload spent its time
        self.stop_phases: list[Phase] = []  # and the last shutdown

    # ---- phases ----------------------------------------------------------------------------------

    def settings(self, cfg: RuntimeConfig | None = None) -> RunSettings:
        """The first phase, for both a start and a reload: no side effects (runtime/settings.py)."""
        return run_settings(cfg or self.config, self.deps.environ, self.deps.root, self.deps.find_vmlinux)

    def start(self, hook: StartHook | None = None) -> bool:
        """The phases in order, each entered once: settings, outputs, kernel, discovery, attach. `hook` reports
        between them and may stop before attaching (False is returned then, with nothing left open). On failure
        nothing is left attached, listening or open."""
        hook = hook or StartHook()
        t0 = time.monotonic()
        self.phases = []
        settings = self.settings()
        self.config = settings.config
        hook.warned(self, settings.warnings)
        try:
            if hook.outputs:
                self._open(settings)
            self.phases.append(phase_since("inputs", t0, "flags or config, outputs"))
            self.deps.check_privileges()
            self.env, self.env_key = self._kernel(settings)
            found = self._discover(settings.config, self.env, hook)
            if not hook.go_on(self, found):
                self.shutdown(0.0)
                return False
            sets = self._attach(found, self.env, settings.config)
            with self.lock:
                self.probe_sets = sets
            self._app_targets(sets)
            if self.server is not None:  # "up" and "healthy" only now: every call from here on is counted
                self.metrics.answer(self.server)
            self.metrics_push = self.metrics.push(settings)
        except BaseException:
            self.shutdown(0.0)
            raise
        hook.attached(self, sets)
        self.last_poll = self.deps.monotonic()
        self._next_housekeeping = self.last_poll + HOUSEKEEPING_S
        freeze_heap()
        return True

    def _open(self, settings: RunSettings) -> None:
        """/metrics bound and the outputs opened: everything short of the kernel."""
        if settings.switched_off:
            self.log.info("OTLP export turned off by the environment", variables=settings.switched_off)
        self._offset_ns = self.deps.boot_to_wall_offset()
        self.resource = self.deps.make_resource(self.deps.environ)
        self.server = self.metrics.bind(settings)
        self.sinks = self._sinks(settings)
        self.workloads = self._workloads(settings)

    def _kernel(self, settings: RunSettings) -> tuple[KernelEnv, tuple | None]:
        """The kernel's tables, read again only when the kernel, its modules or the symbol settings changed: a
        reload keeps them (a million objects at 10,000 functions; reading them per reload grew the heap at
        every reload, bench/agent_scale.py). Returns the tables and what they were read for."""
        cfg = settings.config
        state = self.deps.kernel_state()
        lbr = next(((cfg.names.lbr, ps.name) for ps in cfg.probe_sets if ps.lbr_branch_types), None)
        key = None if state is None else (state, cfg.symbols, settings.vmlinux, lbr)
        if self.env is not None and key is not None and key == self.env_key:
            self.phases.append(Phase("symbols", 0.0, "kernel, boot and modules unchanged: tables kept"))
            return self.env, key
        env = self.deps.load_env(cfg.symbols, settings.vmlinux, lbr)
        self.phases.extend(env.phases)
        return env, key

    def _discover(self, cfg: RuntimeConfig, env: KernelEnv, hook: StartHook) -> Resolved:
        """Every probe set's functions and attach mode; all resolve before anything is attached."""
        env.refuse_kernel_only(cfg.probe_sets)
        out = []
        for ps in cfg.probe_sets:
            t0 = time.monotonic()
            try:
                found = resolve(ps, env, cfg.names)
            except RunRefused as exc:
                if not hook.each_set:
                    raise
                hook.discovered(ps, None, exc)
                continue
            self.phases.append(phase_since("discovery", t0, f"{len(found.funcs)} functions"
                                           + (f" of probe set {ps.name}" if len(cfg.probe_sets) > 1 else "")))
            hook.discovered(ps, found, None)
            out.append((ps, found))
        return out

    def _attach(self, found: Resolved, env: KernelEnv, cfg: RuntimeConfig, ready: bool = True) -> list[ProbeSet]:
        """`ready` False: attached, but no session starts before their set_ready (a reload's handover)."""
        self._watch_apps(cfg)
        sets = start_probe_sets(found, env, cfg.limits, self.deps.tracer_factory, self._on_session, cfg.names,
                                self._app_probe, self.metrics.workload_series, cfg.metrics.read, ready=ready)
        self.phases.extend(attach_phases(sets))
        return sets

    # ---- the parts -------------------------------------------------------------------------------

    def _watch_apps(self, cfg: RuntimeConfig) -> None:
        """The application watcher, created the first time a config asks for thread context or user stacks."""
        if self.app_watch is None:
            self.app_watch = AppWatcher.for_config(cfg.probe_sets, os.path.join(self.deps.root, "proc"),
                                                   cfg.symbols.source_lines, self.deps.app_sources,
                                                   self.deps.monotonic, self.log)

    def _workloads(self, settings: RunSettings) -> WorkloadResolver:
        """The resolver (and the pod watch when the config turns it on); nothing here waits for the network."""
        return self.deps.make_workloads(self.deps.root, self.deps.monotonic, settings.kube, self.log)

    def _app_targets(self, sets: list[ProbeSet]) -> None:
        if self.app_watch is not None:
            self.app_watch.set_targets(ps.tracer for ps in sets if watches(ps.cfg))  # type: ignore[misc]
            self.app_watch.set_wait(self.config.limits.user_stack_wait_s)

    def _app_probe(self, rec: AppRecord) -> None:
        if self.app_watch is not None:
            self.app_watch.heard(rec)

    def _sinks(self, settings: RunSettings) -> Sinks:
        assert self.resource is not None
        return Sinks(settings, self.resource, self.deps.console, self.deps.make_sender)

    # ---- running ---------------------------------------------------------------------------------

    def poll_once(self) -> None:
        sets = self.probe_sets
        per_set = max(1, POLL_MS // max(1, len(sets)))
        for ps in sets:
            ps.poll(per_set)
        self._emit_due()
        if self.sinks is not None:
            self.sinks.flush()
        if self.app_watch is not None:
            self.app_watch.service()
        if self.workloads is not None:
            self.workloads.service()
        now = self.deps.monotonic()
        self.last_poll = now
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_S
            self._housekeeping()

    def run(self, requests: Requests, reload: Callable[[], object] | None = None,
            detaching: Callable[[], object] = lambda: None) -> CaptureStats:
        """The capture loop until a stop is requested, reloading between polls when asked (with `reload`); then
        detach everything and flush. Returns the kernel's loss counters, read before detaching."""
        try:
            while not requests.stop:
                if requests.reload and reload is not None:
                    requests.reload = False
                    reload()
                    continue
                self.poll_once()
        finally:
            detaching()
            try:
                stats = self.capture_totals()
            finally:
                self.shutdown(SHUTDOWN_FLUSH_S)
        return stats

    def _on_session(self, ps: ProbeSet, session: Session) -> None:
        sinks = self.sinks
        if sinks is None:
            return
        try:
            workloads = self.workloads
            if workloads is not None:  # cached: dictionary look-ups once a process and its cgroup were seen
                session.workload = workloads.of_session(session.pid, session.cgroup_id, session.proc_comm) or None
                # the kernel names the executable as the session ends; /proc only for older records
                session.exe_name = session.exe_name or workloads.exe_name(session.pid, session.proc_comm)
            if self.app_watch is not None and watches(ps.cfg):
                # out in order, once its user stack is symbolized off the loop or its wait for that ran out
                self.app_watch.hold(ps, self.app_watch.annotate(session, reads_app=ps.cfg.app_context))
                self._emit_due()
            else:
                sinks.emit(ps, session, self._offset_ns)
        except Exception as exc:  # noqa: BLE001 - one bad session must not stop capture
            self._session_failed(ps, exc)

    def _emit_due(self, wait: bool = False) -> None:
        """The held sessions that may go out (`wait`: all of them, each within its bound), in order."""
        for ps, session in self.app_watch.due(wait) if self.app_watch is not None and self.sinks else ():
            try:
                self.sinks.emit(ps, session, self._offset_ns)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - one bad session must not stop capture
                self._session_failed(ps, exc)

    def _session_failed(self, ps: ProbeSet, exc: Exception) -> None:
        self.session_errors += 1
        if self.session_errors == 1:
            self.log.error("failed to output a session (further failures are counted in "
                           "retsnoop_session_errors_total)", probe_set=ps.name, error=repr(exc))

    def capture_totals(self) -> CaptureStats:
        """The kernel's loss counters summed over probe sets (read before detaching)."""
        total = CaptureStats()
        for ps in self.probe_sets:
            c = ps.capture_stats()
            total = CaptureStats(*(a + b for a, b in zip(total, c, strict=True)))
        return total

    def reload(self, cfg: RuntimeConfig, hook: StartHook | None = None) -> bool:
        """Apply a new config; on any error keep what runs now. Returns success."""
        if not self._swap_config(cfg, hook or StartHook()):
            return False
        refreeze_heap()  # here, once the swap's locals no longer hold the previous config's objects
        self.last_poll = self.deps.monotonic()
        return True

    def reload_failed(self, error: str, **fields: Any) -> None:
        """A reload that did not happen, from the config file or from here: counted and said once."""
        self.reloads["failure"] += 1
        self.log.error("config reload failed; the previous config keeps running", error=error, **fields)

    def _swap_config(self, cfg: RuntimeConfig, hook: StartHook) -> bool:
        """The start's phases again for a new config, its new parts built beside the running ones."""
        old = self.config
        self.reloading = True
        new_server = new_sinks = env = web = None
        new_sets: list[ProbeSet] = []
        self.phases = []
        try:
            settings = self.settings(cfg)
            cfg = settings.config
            hook.warned(self, settings.warnings)
            if (cfg.metrics.host, cfg.metrics.port, cfg.names.listen) != (
                    old.metrics.host, old.metrics.port, old.names.listen):
                new_server = self.metrics.bind(settings)
                if new_server is not None:  # the running sets count on meanwhile: this run is ready
                    self.metrics.answer(new_server)
            else:
                web = self.metrics.web(settings)  # read again even when unchanged: SIGHUP is how users ask for that
            if (cfg.exporter, cfg.limits) != (old.exporter, old.limits):
                new_sinks = self._sinks(settings)
            env, env_key = self._kernel(settings)
            new_sets = self._attach(self._discover(cfg, env, hook), env, cfg, ready=False)
        except Exception as exc:  # noqa: BLE001 - whatever fails, the running config stays
            for part in (new_server, env if env is not self.env else None):
                if part is not None:
                    part.close()
            if new_sinks is not None:
                new_sinks.close(0.0)
            self.reloading = False
            self.reload_failed(str(exc))
            return False
        with self.lock:  # the new sets are attached: swap them in; scrapes see the new sets from here on
            old_sets, self.probe_sets = self.probe_sets, new_sets
            hand_over(old_sets, new_sets)
            old_env = self.env if self.env is not env else None
            self.env, self.env_key = env, env_key
            old_sinks = old_server = None
            if new_sinks is not None:
                old_sinks, self.sinks = self.sinks, new_sinks
            if new_server is not None:
                old_server, self.server = self.server, new_server
            elif self.server is not None:
                self.server.use_web(web)
            self.config = cfg
            self._app_targets(new_sets)
        # Drained and detached outside the lock: at 10,000 functions the kernel takes seconds to detach a
        # set, and a scrape waiting for the lock meanwhile would time out.
        for ps in old_sets:
            self._drain_and_close(ps)
        for part in (old_env, old_server):
            if part is not None:
                part.close()
        if old_sinks is not None:
            old_sinks.close(SHUTDOWN_FLUSH_S)
        if cfg.kubernetes != old.kubernetes:  # a new pod watch for new settings (resolved above)
            old_workloads, self.workloads = self.workloads, self._workloads(settings)
            if old_workloads is not None:
                old_workloads.close()
        if (cfg.metrics.otlp, cfg.metrics.otlp_interval_s) != (old.metrics.otlp, old.metrics.otlp_interval_s):
            if self.metrics_push is not None:
                self.metrics_push.stop(final_push=True)
            self.metrics_push = None
            try:
                self.metrics_push = self.metrics.push(settings)
            except Exception as exc:  # noqa: BLE001 - capture goes on without the push
                self.log.error("OTLP metrics export not started", error=str(exc))
        self.reloads["success"] += 1
        self.reloading = False
        hook.attached(self, new_sets)
        return True

    def _drain_and_close(self, ps: ProbeSet) -> None:
        """Detached first, then drained: every session that ended before its probes went is read and sent."""
        t0, drained = time.monotonic(), 0
        ps.detach()
        t1 = time.monotonic()
        try:
            drained = ps.poll(0)
            self._emit_due(wait=True)  # and those waiting for their user stacks' symbols, within the bound
            if self.sinks is not None:
                self.sinks.flush()
        except Exception as exc:  # noqa: BLE001 - freeing the object matters more than the last records
            self.log.warning("could not drain probe set after detaching", probe_set=ps.name, error=str(exc))
        ps.close()
        self.stop_phases += [Phase("detach", t1 - t0, ps.name),
                             phase_since("drain", t1, f"{drained} records of {ps.name}")]

    def shutdown(self, flush_s: float) -> None:
        """Detach everything, flush the exporters within `flush_s`, stop listening. Idempotent."""
        if self.metrics_push is not None:  # last push while the kernel maps still hold the counts
            push, self.metrics_push = self.metrics_push, None
            push.stop(final_push=flush_s > 0)
        with self.lock:
            sets, self.probe_sets = self.probe_sets, []
            for ps in sets:
                self._drain_and_close(ps)
        if sets:
            self.log.info("detached", probe_sets=len(sets))
        if self.sinks is not None:
            sinks, self.sinks = self.sinks, None
            exporting, t0 = bool(sinks.exporters), time.monotonic()
            sinks.close(flush_s)
            self.stop_phases.append(phase_since("flush", t0, "outputs"))
            t = sinks.totals()
            if exporting and (sets or t.spans_exported or t.spans_dropped):  # not after a start that failed
                self.log.info("exporters flushed", seconds=round(time.monotonic() - t0, 3),
                              spans_exported=t.spans_exported, spans_dropped=sum(t.spans_dropped.values()))
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.env is not None:
            self.env.close()
            self.env = None
        if self.app_watch is not None:
            self.app_watch.close()
            self.app_watch = None
        if self.workloads is not None:
            self.workloads.close()
            self.workloads = None

    # ---- observability ---------------------------------------------------------------------------

    def _housekeeping(self) -> None:
        """Re-measure the clock offset (NTP steps) and log losses that grew since the last summary."""
        try:
            self._offset_ns = self.deps.boot_to_wall_offset()
        except RuntimeError as exc:
            self.log.warning("clock offset not re-measured", error=str(exc))
        losses: dict[str, int] = {}
        with self.lock:
            for ps in self.probe_sets:
                try:
                    cap = ps.capture_stats()
                except Exception:  # noqa: BLE001 - a summary is not worth failing the loop
                    continue
                losses[f"{ps.name}.sessions_dropped"] = cap.dropped_sessions
                losses[f"{ps.name}.records_lost"] = cap.dropped_records
            if self.sinks is not None:
                for cause, n in self.sinks.totals().spans_dropped.items():
                    losses[f"spans_dropped.{cause}"] = n
            last_errors = self.sinks.last_errors() if self.sinks is not None else []
        grown = {k: v - self._reported.get(k, 0) for k, v in losses.items() if v > self._reported.get(k, 0)}
        self._reported.update(losses)
        if grown:
            extra = {"last_export_error": last_errors[0]} if last_errors and "spans_dropped.export_failed" in grown \
                else {}
            self.log.warning("data lost since the last summary", **grown, **extra)

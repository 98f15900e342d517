"""The one capture runtime behind `trace` and `agent`: inputs, kernel environment, probe sets, poll loop, sinks.

`_steps` is the one sequence of the start's steps (agent --check's too), in the order that keeps a refused run from
leaving anything behind: settings (pure; settings.py; the OTEL_* values it ignores go to the hook's warned()), outputs
(binds /metrics, checks the output files), privileges, kernel, discovery (per probe set, nothing attached), attach
(what serves the outputs imported beside it: prefetch.py), the exporters. `start` keeps what they made (build.py);
`reload` runs them for a new config, building the changed outputs and the probe sets beside the running ones and
swapping them in once attached, so a bad new config leaves the old one running. Commands act between the steps
through a StartHook (hooks.py); the kernel, the network, the clock: RuntimeDeps.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from retsnoop_otel.appctx.watched import watches
from retsnoop_otel.capture.model import CaptureStats, FuncTable, OriginCount
from retsnoop_otel.command.errors import RunRefused
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.export.resource import Resource
from retsnoop_otel.runtime.build import Build
from retsnoop_otel.runtime.config import RuntimeConfig
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.runtime.heap import freeze_heap, refreeze_heap
from retsnoop_otel.runtime.hooks import Resolved, StartHook
from retsnoop_otel.runtime.losses import LossSummary, losses
from retsnoop_otel.runtime.metrics_view import RuntimeMetrics, push_key
from retsnoop_otel.runtime.prefetch import prefetch
from retsnoop_otel.runtime.probe_set import ProbeSet, hand_over, resolve, start_probe_sets, stop_counts
from retsnoop_otel.runtime.requests import Requests
from retsnoop_otel.runtime.routing import SessionRouter
from retsnoop_otel.runtime.settings import RunSettings, run_settings
from retsnoop_otel.runtime.sinks import Sinks
from retsnoop_otel.runtime.startup import Phase, attach_phases, discovery_note, phase_since

POLL_MS = 100
SHUTDOWN_FLUSH_S = 5.0
HOUSEKEEPING_S = 60.0  # clock offset re-measurement and the periodic loss summary
Hook = Callable[[], object]  # run()'s: `detaching`, and `after_poll` (trace's --origins-interval tables)


class Runtime:
    def __init__(self, config: RuntimeConfig, deps: RuntimeDeps | None = None, log: EventLog | None = None) -> None:
        self.config = config
        self.deps = deps or RuntimeDeps()
        self.log = log or EventLog(level="error")
        self.env: KernelEnv | None = None
        self.env_key: tuple | None = None  # what self.env was loaded for (None: load again at a reload)
        self.probe_sets: list[ProbeSet] = []
        self.origins_at_stop: list[tuple[FuncTable, list[OriginCount]]] = []  # run(): the sets' origin counts
        self.route = SessionRouter(self.log)  # the sinks, the workload resolver and the application watcher
        self.server: Any = None  # metrics.server.MetricsServer while /metrics is served
        self.metrics_push: Any = None  # export.metrics_push.OtlpMetricsPusher when metrics.otlp is set
        self.reloads, self.reloading = {"success": 0, "failure": 0}, False
        self.lock = threading.RLock()  # guards probe_sets/sinks against the scrape thread
        self.resource: Resource | None = None
        self.last_poll = self.deps.monotonic()
        self._next_housekeeping = 0.0
        self._losses = LossSummary()
        self.metrics = RuntimeMetrics(self)  # collectors, /metrics server, OTLP push
        self.phases: list[Phase] = []  # where the last start or reload spent its time
        self.stop_phases: list[Phase] = []  # and the last shutdown

    # ---- the steps -------------------------------------------------------------------------------

    def settings(self, cfg: RuntimeConfig | None = None) -> RunSettings:
        """The first step, for both a start and a reload: no side effects (runtime/settings.py)."""
        return run_settings(cfg or self.config, self.deps.environ, self.deps.root, self.deps.find_vmlinux)

    def _steps(self, b: Build, cfg: RuntimeConfig, hook: StartHook, running: RuntimeConfig | None) -> bool:
        """The steps in order, each entered once, filling `b`: settings, outputs, privileges, kernel, discovery,
        attach. `running` is the config a reload replaces (None at a start): the outputs it has unchanged are
        kept, and the new sets attach not ready, for the handover. False: the hook stopped before attaching."""
        t0 = time.monotonic()
        b.settings = self.settings(cfg)
        if running is None:
            self.config = b.settings.config  # the hooks read the run's config and kernel tables
        hook.warned(self, b.settings.warnings)
        sinks = hook.outputs and self._outputs(b, b.settings, running)
        if not hook.outputs:  # agent --check: the same outputs, opened and released at once
            self.metrics.check(b.settings)
        self.phases.append(phase_since("inputs", t0, "flags or config, outputs"))
        self.deps.check_privileges()
        b.env, b.env_key = self._kernel(b.settings)
        if running is None:
            self.env, self.env_key = b.env, b.env_key
        found = self._discover(b.settings.config, b.env, hook)
        if not hook.go_on(self, found):
            return False
        if hook.outputs:  # read while the kernel loads and attaches
            prefetch([*(Sinks.modules(b.settings) if sinks else ()), *self.metrics.modules(b.settings)])
        b.sets = self._attach(found, b.env, b.settings.config, ready=running is None)
        if sinks:  # their modules were imported beside the load, their files checked before it
            t0 = time.monotonic()
            b.sinks = Sinks(b.settings, self.resource, self.deps.console, self.deps.make_sender)  # type: ignore[arg-type]
            self.phases.append(phase_since("outputs", t0, "exporters"))
        return True

    def _outputs(self, b: Build, s: RunSettings, running: RuntimeConfig | None) -> bool:
        """/metrics bound, output files checked: everything short of the kernel. A reload opens only what its config
        changed. True: the sinks are to be built after the attach (their imports overlap the kernel's load)."""
        cfg = s.config
        if running is None:
            if s.switched_off:
                self.log.info("OTLP export turned off by the environment", variables=s.switched_off)
            self.route.offset_ns = self.deps.boot_to_wall_offset()
            self.resource = self.deps.make_resource(self.deps.environ)
        if running is None or (cfg.metrics.host, cfg.metrics.port, cfg.names.listen) != (
                running.metrics.host, running.metrics.port, running.names.listen):
            b.server = self.metrics.bind(s)
            if running is not None and b.server is not None:
                self.metrics.answer(b.server)
        else:
            b.web = self.metrics.web(s)  # read again even when unchanged: SIGHUP is how users ask for that
        if running is None or cfg.kubernetes.watched != running.kubernetes.watched:  # waits for nothing on the network
            b.workloads = self.deps.make_workloads(self.deps.root, self.deps.monotonic, s.kube, self.log)
        return Sinks.due(s, running)

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
            note = discovery_note(found, ps.syscalls, ps.name if len(cfg.probe_sets) > 1 else None)
            self.phases.append(phase_since("discovery", t0, note))
            hook.discovered(ps, found, None)
            out.append((ps, found))
        return out

    def _attach(self, found: Resolved, env: KernelEnv, cfg: RuntimeConfig, ready: bool = True) -> list[ProbeSet]:
        """`ready` False: attached, but no session starts before their set_ready (a reload's handover)."""
        self.route.watch_apps(cfg, os.path.join(self.deps.root, "proc"), self.deps.app_sources, self.deps.monotonic)
        sets = start_probe_sets(found, env, cfg.limits, self.deps.tracer_factory, self.route.session, cfg.names,
                                self.route.app_probe, self.metrics.workload_series, cfg.metrics.read, ready=ready)
        self.phases.extend(attach_phases(sets))
        return sets

    def _app_targets(self, sets: list[ProbeSet]) -> None:
        if (watch := self.route.app_watch) is not None:
            watch.set_targets(ps.tracer for ps in sets if watches(ps.cfg))  # type: ignore[misc]
            watch.set_wait(self.config.limits.user_stack_wait_s)

    # ---- start and reload ------------------------------------------------------------------------

    def start(self, hook: StartHook | None = None) -> bool:
        """The steps for this runtime's config, then its run begins. `hook` reports between them and may stop
        before attaching (False is returned then, with nothing left open). On failure nothing is left
        attached, listening or open."""
        hook, b = hook or StartHook(), Build()
        self.phases = []
        try:
            went_on = self._steps(b, self.config, hook, None)
        except BaseException:
            b.close(self.env)
            self.shutdown(0.0)
            raise
        self.server, self.route.sinks, self.route.workloads = b.server, b.sinks, b.workloads
        try:
            if not went_on:
                self.shutdown(0.0)
                return False
            with self.lock:
                self.probe_sets = b.sets
            self._app_targets(b.sets)
            if self.server is not None:  # "up" and "healthy" only now: every call from here on is counted
                self.metrics.answer(self.server)
            assert b.settings is not None
            self.metrics_push = self.metrics.push(b.settings)
        except BaseException:
            self.shutdown(0.0)
            raise
        hook.attached(self, b.sets)
        self.last_poll = self.deps.monotonic()
        self._next_housekeeping = self.last_poll + HOUSEKEEPING_S
        freeze_heap()
        return True

    def reload(self, cfg: RuntimeConfig, hook: StartHook | None = None) -> bool:
        """Apply a new config: the start's steps, then the swap; on any error keep what runs now."""
        hook, b = hook or StartHook(), Build()
        self.phases = []
        self.reloading = True
        try:
            went_on = self._steps(b, cfg, hook, self.config)
        except Exception as exc:  # noqa: BLE001 - whatever fails, the running config stays
            went_on, error = False, str(exc)
        else:
            error = "" if went_on else "stopped before attaching"
        if not went_on:
            b.close(self.env)
            self.reloading = False
            self.reload_failed(error)
            return False
        self._swap(b)
        self.reloads["success"] += 1
        self.reloading = False
        hook.attached(self, b.sets)
        refreeze_heap()  # here, once the swap's locals no longer hold the previous config's objects
        self.last_poll = self.deps.monotonic()
        return True

    def reload_failed(self, error: str, **fields: Any) -> None:
        """A reload that did not happen, from the config file or from here: counted and said once."""
        self.reloads["failure"] += 1
        self.log.error("config reload failed; the previous config keeps running", error=error, **fields)

    def _swap(self, b: Build) -> None:
        """The new parts in, at one instant for the scrapes; the replaced ones drained and closed after."""
        assert b.settings is not None
        old, cfg, route = self.config, b.settings.config, self.route
        with self.lock:
            old_sets, self.probe_sets = self.probe_sets, b.sets
            hand_over(old_sets, b.sets)
            old_env = self.env if self.env is not b.env else None
            self.env, self.env_key = b.env, b.env_key
            old_sinks = old_server = old_workloads = None
            if b.sinks is not None:
                old_sinks, route.sinks = route.sinks, b.sinks
            if b.server is not None:
                old_server, self.server = self.server, b.server
            elif self.server is not None:
                self.server.use_web(b.web)
            if b.workloads is not None:
                old_workloads, route.workloads = route.workloads, b.workloads
            self.config = cfg
            self._app_targets(b.sets)
        # Drained and detached outside the lock: at 10,000 functions the kernel takes seconds to detach a
        # set, and a scrape waiting for the lock meanwhile would time out.
        for ps in old_sets:
            self._drain_and_close(ps)
        for part in (old_env, old_server, old_workloads):
            if part is not None:
                part.close()
        if old_sinks is not None:
            old_sinks.close(SHUTDOWN_FLUSH_S)
        if push_key(cfg) != push_key(old):
            if self.metrics_push is not None:
                self.metrics_push.stop(final_push=True)
            self.metrics_push = None
            try:
                self.metrics_push = self.metrics.push(b.settings)
            except Exception as exc:  # noqa: BLE001 - capture goes on without the push
                self.log.error("OTLP metrics export not started", error=str(exc))

    # ---- running and stopping --------------------------------------------------------------------

    def poll_once(self, stopping: Callable[[], bool] = lambda: False, wake_fd: int | None = None) -> None:
        for i, ps in enumerate(sets := self.probe_sets):
            if i and stopping():  # the wait a stop ended drained the wake fd: the next sets' would run their share
                return
            ps.poll(max(1, POLL_MS // max(1, len(sets))), wake_fd)
        if stopping():  # a stop signal ended the wait: the drain at detach emits what is due, no watcher turn
            return
        self.route.service()
        self.last_poll = now = self.deps.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_S
            self._housekeeping()

    def run(self, requests: Requests, reload: Callable[[], object] | None = None,
            detaching: Hook = lambda: None, after_poll: Hook = lambda: None) -> CaptureStats:
        """The capture loop on this thread until a stop (`reload` when asked, `after_poll` after each poll), then detach
        and flush. Returns the kernel's loss counters, read before detaching."""
        try:
            while not requests.stop:
                if requests.reload and reload is not None:
                    requests.reload = False
                    reload()
                    continue
                self.poll_once(lambda: requests.stop, requests.wake_fd)
                after_poll()
        finally:
            detaching()
            stats, self.origins_at_stop = stop_counts(list(self.probe_sets), lambda: self.shutdown(SHUTDOWN_FLUSH_S))
        return stats

    def _drain_and_close(self, ps: ProbeSet) -> None:
        """Detached first, then drained: every session that ended before its probes went is read and sent."""
        t0, drained = time.monotonic(), 0
        ps.detach()
        t1 = time.monotonic()
        try:
            drained = ps.poll(0)
            self.route.emit_due(wait=True)  # and those waiting for their user stacks' symbols, within the bound
            if self.route.sinks is not None:
                self.route.sinks.flush()
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
        if (flushed := self.route.close(flush_s, bool(sets))) is not None:
            self.stop_phases.append(flushed)
        for part in (self.server, self.env):
            if part is not None:
                part.close()
        self.server = self.env = None

    def _housekeeping(self) -> None:
        """Re-measure the clock offset (NTP steps) and log losses that grew since the last summary."""
        try:
            self.route.offset_ns = self.deps.boot_to_wall_offset()
        except RuntimeError as exc:
            self.log.warning("clock offset not re-measured", error=str(exc))
        sinks = self.route.sinks
        with self.lock:
            now = losses(self.probe_sets, sinks)
            last_errors = sinks.last_errors() if sinks is not None else []
        if grown := self._losses.grown(now, last_errors):
            self.log.warning("data lost since the last summary", **grown)

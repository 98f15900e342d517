"""Where an ended session goes: its workload named, held for its user stack's symbols when its probe set
reads the application, then out through the sinks. The runtime owns the outputs' lifecycle (start, reload,
shutdown) and sets them here; a session that cannot be output is counted, never fatal to capture."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from retsnoop_otel.appctx.watched import watches
from retsnoop_otel.capture.model import Session
from retsnoop_otel.capture.records import AppRecord
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.runtime.config import RuntimeConfig
from retsnoop_otel.runtime.sinks import Sinks
from retsnoop_otel.runtime.startup import Phase, phase_since

if TYPE_CHECKING:
    from retsnoop_otel.appctx.process_readers import AppSources
    from retsnoop_otel.appctx.watch import AppWatcher
    from retsnoop_otel.runtime.probe_set import ProbeSet
    from retsnoop_otel.workload.resolver import WorkloadResolver


class SessionRouter:
    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.sinks: Sinks | None = None
        self.workloads: WorkloadResolver | None = None  # container, pod and executable name of each kept session
        self.app_watch: AppWatcher | None = None  # while a probe set reads thread context or user stacks
        self.offset_ns = 0  # boot time to wall clock, re-measured by the runtime's housekeeping
        self.errors = 0  # sessions that could not be output

    def session(self, ps: ProbeSet, session: Session) -> None:
        """A probe set's ended session (the poll loop's callback)."""
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
                self.emit_due()
            else:
                sinks.emit(ps, session, self.offset_ns)
        except Exception as exc:  # noqa: BLE001 - one bad session must not stop capture
            self._failed(ps, exc)

    def app_probe(self, rec: AppRecord) -> None:
        """An application's record (thread context published, exec seen) for the watcher."""
        if self.app_watch is not None:
            self.app_watch.heard(rec)

    def emit_due(self, wait: bool = False) -> None:
        """The held sessions that may go out (`wait`: all of them, each within its bound), in order."""
        sinks, watch = self.sinks, self.app_watch
        for ps, session in watch.due(wait) if watch is not None and sinks is not None else ():
            try:
                sinks.emit(ps, session, self.offset_ns)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - one bad session must not stop capture
                self._failed(ps, exc)

    def watch_apps(self, cfg: RuntimeConfig, proc: str, sources: Callable[[str, bool, bool], AppSources],
                   clock: Callable[[], float]) -> None:
        """The application watcher, made the first time a config reads thread context or user stacks."""
        if self.app_watch is None and any(watches(ps) for ps in cfg.probe_sets):  # else nothing of it imported
            from retsnoop_otel.appctx.watch import AppWatcher
            self.app_watch = AppWatcher.for_config(cfg.probe_sets, proc, cfg.symbols.source_lines, sources, clock,
                                                   self.log)

    def service(self) -> None:
        """Once per poll: the held sessions now due, the outputs flushed, the watchers' timed work."""
        self.emit_due()
        if self.sinks is not None:
            self.sinks.flush()
        if self.app_watch is not None:
            self.app_watch.service()
        if self.workloads is not None:
            self.workloads.service()

    def close(self, flush_s: float, captured: bool) -> Phase | None:
        """The outputs flushed within `flush_s` and closed (`captured`: a run that had probe sets). Returns the
        flush's time, when there were outputs."""
        sinks, self.sinks = self.sinks, None
        flushed = None
        if sinks is not None:
            exporting, t0 = bool(sinks.exporters), time.monotonic()
            sinks.close(flush_s)
            flushed = phase_since("flush", t0, "outputs")
            t = sinks.totals()
            if exporting and (captured or t.spans_exported or t.spans_dropped):  # not after a start that failed
                self.log.info("exporters flushed", seconds=round(time.monotonic() - t0, 3),
                              spans_exported=t.spans_exported, spans_dropped=sum(t.spans_dropped.values()))
        for part in (self.app_watch, self.workloads):
            if part is not None:
                part.close()
        self.app_watch = self.workloads = None
        return flushed

    def _failed(self, ps: ProbeSet, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            self.log.error("failed to output a session (further failures are counted in "
                           "retsnoop_session_errors_total)", probe_set=ps.name, error=repr(exc))

"""The application side of sessions: which processes publish OTel thread context, and what their sessions mean.

The kernel side reads a thread's context only for processes it has a location for (map app_targets).
This watcher finds them, between polls: it locates `otel_thread_ctx_v1` in the process's ELF files, reads
its process context (service.name, the attribute key map), has its mappings snapshotted for user stacks
(symbolized off the loop: appctx/stacks.py), and writes the answer into every probe set's map. It looks at:
- the processes running at start, all of them, a few dozen per poll-loop turn (the backlog); every check stays
  within its turn's time (BACKLOG_BUDGET_S), one that reads many files going on at the next turn (CheckDeferred);
- a process born later, from its exec: the kernel side reports every exec the probe set's filters let
  through (REC_APP_EXEC, bpf/appctx.bpf.h app_exec). Just exec'd, the process has not loaded its libraries
  (nor a runtime its OTel SDK and publisher), so it is checked when the record is read, then again after
  50 ms, doubling up to 1 s between checks, for 60 s (appctx/exec_watch.py): its location is in the maps before
  its first failing request, once it published before that request by at least the current interval. Only a
  success is written to the maps; a process never found this way is handled as below when its sessions ask;
- a process that creates its OTEL_CTX process context (REC_APP_PUBLISH, bpf/appctx.bpf.h app_publish): its
  publisher is loaded by then, and a service may make its first request right after setting up its SDK,
  within less than one interval: it is checked when the record is read (the kernel side wakes the loop for
  it), and its watch starts again from EXEC_RECHECK_FIRST_S while its location settles. That leaves the
  loop's reaction time (a poll and a check), not the interval, between publishing and the first request;
- a process the kernel side knows nothing about when one of its reported sessions ends (born before an
  exec watch could see it, one whose exec record was lost, or after its watch): that session sends one
  probe record (REC_APP_PROBE) and stays unlinked; the answer lands before the next one.

A process found not to publish at a probe is asked about again after a back-off (0.5 s doubling to 60 s), since
runtimes load the publisher late (a Python service imports its SDK after its first system calls). Exited processes
are forgotten at the next sweep; until then (at most SWEEP_S) a reused PID would be read at its predecessor's
location, which gives a fault or an invalid record, never a wrong link: the record's own valid byte and ids are
read from the new process's memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from retsnoop_otel.appctx.deferral import CheckDeferred
from retsnoop_otel.appctx.exec_watch import EXEC_OUTCOMES, ExecWatches, Watch
from retsnoop_otel.appctx.process_readers import AppSources, SourcesFactory, running
from retsnoop_otel.appctx.stacks import WAIT_S, HeldSessions, StackWorker
from retsnoop_otel.appctx.watched import WatchedSet, watches
from retsnoop_otel.capture.model import Session
from retsnoop_otel.capture.records import AppExecRec, AppProbeRec, AppRecord

SWEEP_S = 1.0
RECHECK_FIRST_S = 0.5
RECHECK_MAX_S = 60.0
CONTEXT_REFRESH_S = 5.0  # a publishing process's context (service.name, key map) is re-read at most this often
MAX_CHECKS_PER_SERVICE = 64  # checks per poll-loop turn, so a burst of new processes cannot stall it
BACKLOG_BUDGET_S = 0.01  # poll-loop time per turn spent on exec'd processes, then on those running at start
PUBLISHED = "process published its process context"  # the debug line of a publish record
OUTCOMES = ("linked", "ok", "no_record", "invalid", "fault", "unknown_process")


class Log(Protocol):
    """The run's event log (command.logs.EventLog)."""

    def debug(self, msg: str, **fields: Any) -> None: ...

    def warning(self, msg: str, **fields: Any) -> None: ...


class AppTargets(Protocol):
    """What the watcher needs of a probe set's BPF object (kernel.tracer.Tracer)."""

    def set_app_target(self, tgid: int, tp_offset: int = 0, offset: int = 0, modid: int = 0,
                       publishes: bool = True) -> None: ...

    def forget_app_target(self, tgid: int) -> None: ...


class _Process:
    __slots__ = ("tgid", "location", "context", "context_read_at", "recheck_at", "backoff", "in_kernel")

    def __init__(self, tgid: int, location: Any = None, context: Any = None, context_read_at: float = 0.0,
                 recheck_at: float = 0.0, backoff: float = RECHECK_FIRST_S, in_kernel: bool = True) -> None:
        self.tgid = tgid
        self.location = location  # thread_ctx.TlsLocation; None: publishes no thread context (yet)
        self.context = context  # process_context.ProcessContext
        self.context_read_at = context_read_at
        self.recheck_at = recheck_at
        self.backoff = backoff
        self.in_kernel = in_kernel  # an answer is in the kernel maps (False while waiting for a recheck probe)


class AppCounters:
    """For retsnoop_app_context_* self-metrics: what the watcher did and what the sessions held."""

    __slots__ = ("processes_checked", "processes_publishing", "check_errors", "sessions", "exec_watches")

    def __init__(self, processes_checked: int = 0, processes_publishing: int = 0, check_errors: int = 0,
                 sessions: dict[str, int] | None = None, exec_watches: dict[str, int] | None = None) -> None:
        self.processes_checked = processes_checked
        self.processes_publishing = processes_publishing
        self.check_errors = check_errors
        self.sessions = dict.fromkeys(OUTCOMES, 0) if sessions is None else sessions
        # how the watches of exec'd processes ended (EXEC_OUTCOMES)
        self.exec_watches = dict.fromkeys(EXEC_OUTCOMES, 0) if exec_watches is None else exec_watches


class AppWatcher:
    """The runtime's one handle on the feature: set_targets() after every attach, asked() for each probe
    record, born() for each exec record, service() between polls; for each session of a watched probe set
    annotate() then hold(), and due() for the held sessions that may go out (their user stacks are symbolized
    off the loop, appctx/stacks.py); close() at the end.

    `start_worker=False`: the user-stack worker runs only when `stacks.worker.run_one()` is called (tests)."""

    def __init__(self, sources: AppSources, monotonic: Callable[[], float], log: Log,
                 proc_root: str = "/proc", read_app: bool = True, wait_s: float = WAIT_S,
                 start_worker: bool = True) -> None:
        self.sources = sources
        self._now = monotonic
        self.log = log
        self.proc_root = proc_root.rstrip("/") or "/"
        self.read_app = read_app
        self.counters = AppCounters()
        sym = sources.user_symbolizer
        self.stacks: HeldSessions[Any] = HeldSessions(
            StackWorker(sym, start=start_worker) if sym is not None else None, monotonic, wait_s)
        self.stacks.on_error = lambda s, error: self._log_error("user stack not symbolized", pid=s.pid, error=error)
        self._targets: list[AppTargets] = []
        self._known: dict[int, _Process] = {}
        self._pending: dict[int, None] = {}  # probes (insertion-ordered set): answered first
        self._backlog: list[int] = []  # processes running at start, checked with what budget is left
        self.execs = ExecWatches()  # exec'd processes not located yet, within EXEC_WATCH_S
        self._next_sweep = 0.0
        self._errors_logged = 0

    @classmethod
    def for_config(cls, probe_sets: Iterable[WatchedSet], proc_root: str, source_lines: bool,
                   sources: SourcesFactory, monotonic: Callable[[], float], log: Log) -> AppWatcher | None:
        """The watcher a configuration needs, or None when no probe set reads thread context or user stacks."""
        watched = [ps for ps in probe_sets if watches(ps)]
        if not watched:
            return None
        stacks = any(ps.user_stacks for ps in watched)
        read_app = any(ps.app_context for ps in watched)
        return cls(sources(proc_root, stacks, source_lines), monotonic, log, proc_root, read_app=read_app)

    def set_targets(self, targets: Iterable[AppTargets]) -> None:
        """The probe sets' BPF objects (after start or reload): each gets every answer known so far.

        The first time, every running process is queued for a check, so that the processes already
        running when the agent starts have their sessions linked from the first one on."""
        first = not self._targets and not self._known
        self._targets = list(targets)
        for proc in self._known.values():
            if proc.in_kernel:
                self._push(proc, self._targets)
        if first and self.read_app and self._targets:
            self._backlog = sorted(running(self.proc_root) - {os.getpid()})

    # ---- kernel side's questions ----------------------------------------------------------------

    def heard(self, rec: AppRecord) -> None:
        """A record of the kernel side's for the watcher (capture.records.APP_RECORDS)."""
        if isinstance(rec, AppExecRec):
            self.born(rec.tgid)
        elif isinstance(rec, AppProbeRec):
            self.asked(rec.tgid, answer=True)
        else:
            self.published(rec.tgid)

    def published(self, tgid: int) -> None:
        """A publish record: the process just created its process context, so its publisher's library is loaded.

        Checked at once. A process watched from its exec is watched on from the first interval; one that was
        found not to publish is asked about again; one already located has its process context re-read at
        its next session (an update of the context creates a new one)."""
        if not self.read_app:
            return
        now = self._now()
        w = self.execs.watched.get(tgid)
        self.log.debug(PUBLISHED, pid=tgid, watched=w is not None)
        if w is not None:
            self.execs.restart(w)
            self._recheck(tgid, w, now)
            return
        proc = self._known.get(tgid)
        if proc is not None and proc.location is not None:
            proc.context_read_at = float("-inf")
            return
        if proc is not None:
            del self._known[tgid]  # its "does not publish" answer is stale
        self._pending.pop(tgid, None)
        self._check(tgid, now)

    def asked(self, tgid: int, answer: bool = False) -> None:
        """A probe record: a session started in a process the kernel side has no answer for.

        `answer`: check it at once, before the records that follow it in the ring buffer (its own
        session's end among them: symbolizing a first user stack can keep the loop busy for a while)."""
        self._pending[tgid] = None
        if answer:
            self._answer(self._now(), MAX_CHECKS_PER_SERVICE, bounded=False)  # whole: before its session's end

    def born(self, tgid: int) -> None:
        """An exec record: the process has a new image, not checked yet (its libraries are still loading).

        Checked at the next service(), then on EXEC_RECHECK_* until located, exited or EXEC_WATCH_S have passed.
        An earlier image's answer (a pid reused, or a process that exec'd again) is withdrawn first."""
        if not self.read_app:
            return
        w = self.execs.watched.get(tgid)
        if w is not None and not w.checks:
            return  # another probe set's record of the same exec
        if w is None and self.execs.full():
            self.counters.exec_watches["skipped"] += 1
            return
        if self._known.pop(tgid, None) is not None:
            self._forget(tgid)  # the hook withdrew it from its own probe set's maps, not from the others'
        self.execs.start(tgid, self._now())

    def _answer(self, now: float, budget: int, bounded: bool = True) -> int:
        until = self._now() + BACKLOG_BUDGET_S if bounded else None
        while self._pending and budget:
            tgid = next(iter(self._pending))
            del self._pending[tgid]
            budget -= 1
            if not self._check(tgid, now, until):
                self._pending = {tgid: None, **self._pending}  # first again at the next turn
                break
        return budget

    def service(self) -> None:
        """Between polls: answer pending probes, check the exec'd processes that are due, then the processes
        running at start, all within MAX_CHECKS_PER_SERVICE checks (and BACKLOG_BUDGET_S for the last two);
        every SWEEP_S, forget exited processes."""
        now = self._now()
        budget = self._answer(now, MAX_CHECKS_PER_SERVICE)
        until = self._now() + BACKLOG_BUDGET_S
        while budget and self._now() < until and (due := self.execs.pop_due(now)) is not None:
            budget -= 1
            if not self._recheck(*due, now, until):
                break
        while self._backlog and budget and self._now() < until:
            tgid = self._backlog.pop()
            if tgid not in self._known:
                budget -= 1
                if not self._check(tgid, now, until):
                    self._backlog.append(tgid)  # goes on at the next turn, from the files it read
                    break
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_S
            self._sweep(now)

    def _recheck(self, tgid: int, w: Watch, now: float, until: float | None = None) -> bool:
        """One check of a process watched from its exec; False when it ran past `until` (it goes on at the next
        turn). Only a location is written to the maps: until then the process has no answer there, and its first
        reported session (if it comes first) asks as any would."""
        proc = self._known.get(tgid)
        if proc is not None and proc.location is not None and proc.location.settled:
            self._end_watch(tgid, w, now, "located")  # a probe of one of its sessions found it meanwhile
            return True
        try:
            location, error = self.sources.locate(tgid, until), None
        except CheckDeferred:
            self.execs.again(tgid, w)
            return False
        except Exception as exc:  # noqa: BLE001 - one unreadable process must not stop the others
            location, error = None, exc
        w.checks += 1
        self.counters.processes_checked += 1
        if error is not None:
            if not os.path.exists(f"{self.proc_root}/{tgid}"):
                self._end_watch(tgid, w, now, "exited")  # short-lived: most exec'd processes end this way
                return True
            self.counters.check_errors += 1
            self._log_error("thread context of a process not located", pid=tgid, error=str(error))
            self._end_watch(tgid, w, now, "error")
            return True
        if location is not None and (proc is None or proc.location != location):
            # written at once, even while not settled (its library just loaded: where glibc puts its block is
            # decided at its first access), and again when a later check finds it elsewhere
            if proc is None:
                proc = self._known[tgid] = _Process(tgid)
                if self.stacks.worker is not None:
                    self.stacks.worker.remember(tgid)
            if proc.location is None:
                self.counters.processes_publishing += 1
            proc.location = location
            proc.in_kernel = True
            self._read_context(proc, now)
            if proc.context is None:  # its library loaded, its process context not published yet: read later
                proc.context_read_at = float("-inf")
            self._push(proc, self._targets)
            self._count_watch(tgid, w, now, "located")
        if location is None or not location.settled:
            if not self.execs.schedule_next(tgid, w, now):  # watched long enough: its sessions ask, as any do
                self._end_watch(tgid, w, now, "not_located" if location is None else "located")
            return True
        self._end_watch(tgid, w, now, "located")
        return True

    def _end_watch(self, tgid: int, w: Watch, now: float, outcome: str) -> None:
        self.execs.end(tgid)
        self._count_watch(tgid, w, now, outcome)

    def _count_watch(self, tgid: int, w: Watch, now: float, outcome: str) -> None:
        if w.located:
            return  # said once, when its (not yet settled) location was first written
        w.located = outcome == "located"
        self.counters.exec_watches[outcome] += 1
        self.log.debug("exec'd process watched for thread context", pid=tgid, outcome=outcome, checks=w.checks,
                       after_exec_s=round(now - w.born_at, 3))

    def _check(self, tgid: int, now: float, until: float | None = None) -> bool:
        """False when the check ran past `until`: nothing recorded, the caller queues it for the next turn."""
        proc = self._known.get(tgid)
        if proc is not None and proc.in_kernel:
            self._push(proc, self._targets)  # a probe set that lost or never had the answer (reload)
            return True
        try:
            location, error = (self.sources.locate(tgid, until) if self.read_app else None), None
        except CheckDeferred:
            return False
        except Exception as exc:  # noqa: BLE001 - one unreadable process must not stop the others
            location, error = None, exc
        first = proc is None
        if first:
            proc = self._known[tgid] = _Process(tgid)
            if self.stacks.worker is not None:
                self.stacks.worker.remember(tgid)
        self.counters.processes_checked += 1
        proc.location = location
        if error is not None:
            self.counters.check_errors += 1
            if os.path.exists(f"{self.proc_root}/{tgid}"):
                self._log_error("thread context of a process not located", pid=tgid, error=str(error))
        self.log.debug("process checked for thread context", pid=tgid, first=first,
                       publishes=proc.location is not None)
        if proc.location is not None:
            self.counters.processes_publishing += 1
            self._read_context(proc, now)
        elif self.read_app:
            proc.recheck_at = now + proc.backoff
            proc.backoff = min(proc.backoff * 2, RECHECK_MAX_S)
        else:
            proc.recheck_at = float("inf")  # user stacks only: nothing to find later
        proc.in_kernel = True
        self._push(proc, self._targets)
        return True

    def _push(self, proc: _Process, targets: Iterable[AppTargets]) -> None:
        loc = proc.location
        for t in targets:
            try:
                if loc is None:
                    t.set_app_target(proc.tgid, publishes=False)
                else:
                    t.set_app_target(proc.tgid, loc.tp_offset, loc.offset, loc.modid)
            except OSError as exc:  # the map is full: the process stays unread, its sessions unlinked
                self._log_error("process not added to the thread-context map", pid=proc.tgid, error=str(exc))

    def _sweep(self, now: float) -> None:
        alive = running(self.proc_root)  # one read of the directory: a stat per known process was most of an
        for tgid, proc in list(self._known.items()):  # idle watcher's CPU under emulation
            if tgid not in alive:
                del self._known[tgid]
                self._pending.pop(tgid, None)
                self._forget(tgid)
                self.stacks.forget(tgid)
            elif proc.location is None and proc.in_kernel and now >= proc.recheck_at:
                proc.in_kernel = False  # its next session asks again
                self._forget(tgid)

    def _forget(self, tgid: int) -> None:
        for t in self._targets:
            try:
                t.forget_app_target(tgid)
            except OSError:
                pass

    def _read_context(self, proc: _Process, now: float) -> None:
        proc.context_read_at = now
        try:
            proc.context = self.sources.read_context(proc.tgid) or proc.context
        except Exception as exc:  # noqa: BLE001 - the link does not need it; attributes and service.name do
            self._log_error("process context not read", pid=proc.tgid, error=str(exc))

    def _log_error(self, message: str, **fields: Any) -> None:
        """The first few, then silence: a host full of short-lived processes must not flood the log."""
        self._errors_logged += 1
        if self._errors_logged <= 5:
            self.log.warning(message + ("" if self._errors_logged < 5 else " (further ones are not logged)"),
                             **fields)

    # ---- sessions -----------------------------------------------------------------------------

    def annotate(self, session: Session, reads_app: bool = True) -> Session:
        """The session with its record's attributes named and its service.

        `reads_app`: whether the session's probe set reads thread context (a set that only takes user
        stacks has no context to miss)."""
        app = session.app
        proc = self._known.get(session.pid)
        if app is None:
            if reads_app and proc is not None and proc.location is not None:
                self.counters.sessions["unknown_process"] += 1  # started before the process was located
        else:
            outcome = "linked" if app.usable and app.sampled else app.status
            self.counters.sessions[outcome] = self.counters.sessions.get(outcome, 0) + 1
            if proc is not None:
                now = self._now()
                if now - proc.context_read_at >= CONTEXT_REFRESH_S:
                    self._read_context(proc, now)
                ctx = proc.context
                if ctx is not None:
                    attrs = self.sources.thread_attributes(app.attrs, ctx.key_map) if app.attrs else {}
                    session.app = app._replace(attributes=tuple(attrs.items()),
                                               service_name=_text(ctx.attributes, "service.name"),
                                               service_namespace=_text(ctx.attributes, "service.namespace"),
                                               service_instance_id=_text(ctx.attributes, "service.instance.id"))
        return session

    def hold(self, item: Any, session: Session) -> None:
        """The session (with `item`, the runtime's probe set) waits for its user stack's symbols behind the
        sessions held before it; due() gives it back."""
        self.stacks.hold(item, session)

    def due(self, wait: bool = False) -> list[tuple[Any, Session]]:
        """The held sessions that may go out now, in order (`wait`: all of them, within their bound)."""
        return self.stacks.due(wait)

    def set_wait(self, seconds: float) -> None:
        """How long a session waits for its user stack's symbols (limits.user_stack_wait_s)."""
        self.stacks.wait_s = seconds

    @property
    def unsymbolized(self) -> dict[str, int] | None:
        """Sessions that went out without their user stack's symbols, by reason; None without user stacks."""
        return self.stacks.unsymbolized if self.stacks.worker is not None else None

    def close(self) -> None:
        if self.stacks.worker is not None:
            self.stacks.worker.close()


def _text(attributes: Mapping[str, Any], key: str) -> str:
    """A string attribute of the process context ("" when absent or of another type)."""
    value = attributes.get(key)
    return value if isinstance(value, str) else ""

"""One named probe set at run time: discovery, one BPF object, session assembly and the keep/drop decision.

The BPF object comes from a tracer factory (kernel/tracer.py in production, scripted fakes in unit
tests), so everything here (resolution, capture configuration, acceptance, start/stop order) runs
without a kernel in tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from retsnoop_otel.capture.inject import InjectError, ProbeInfo
from retsnoop_otel.capture.model import (
    CaptureStats,
    FuncStats,
    FuncTable,
    OriginCount,
    ProgramStats,
    Session,
    SessionStats,
    TracedFunc,
    WorkloadCount,
)
from retsnoop_otel.capture.records import APP_RECORDS, SAMPLED_PROBABILITY, AppRecord, Record
from retsnoop_otel.capture.sampling import kernel_sampling
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.command.errors import InputError, RunRefused, SetupError
from retsnoop_otel.kernel import app_hooks
from retsnoop_otel.kernel.attach_modes import BY_NAME, TRAMPOLINE
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import AttachReport
from retsnoop_otel.metrics.workload_series import LABEL_NAMES, WorkloadSeries, WorkloadTotal
from retsnoop_otel.runtime import carry, syscall_set
from retsnoop_otel.runtime.config import AGENT_NAMES, InputNames, Limits, ProbeSetConfig
from retsnoop_otel.runtime.environment import KernelEnv, cgroup_target, lbr_refusal
from retsnoop_otel.symbols import discovery


class TracerLike(Protocol):
    """What a probe set needs from kernel.tracer.Tracer (fakes implement it in unit tests)."""

    def load(self) -> None: ...

    def attach(self, on_error: Callable[[TracedFunc, str], None] | None = None,
               strict: bool = False, ready: bool = True) -> AttachReport: ...

    def set_ready(self, ready: bool) -> None: ...

    def detach(self) -> None: ...

    def open_ring_buffer(self, on_record: Callable[[Record], None]) -> None: ...

    def poll(self, timeout_ms: int, wake_fd: int | None = None) -> int: ...

    def func_stats(self) -> list[FuncStats]: ...

    def session_stats(self) -> list[SessionStats]: ...

    def capture_stats(self) -> CaptureStats: ...

    def origin_counts(self) -> list[OriginCount]: ...

    def program_stats(self) -> list[ProgramStats]: ...

    def set_app_target(self, tgid: int, tp_offset: int = 0, offset: int = 0, modid: int = 0,
                       publishes: bool = True) -> None: ...

    def forget_app_target(self, tgid: int) -> None: ...

    def workload_counts(self) -> list[WorkloadCount]: ...

    def forget_cgroups(self, cgroup_ids: set[int]) -> None: ...

    def close(self) -> None: ...


TracerFactory = Callable[[Sequence[TracedFunc], CaptureConfig, Callable[[str], int | None] | None], TracerLike]
SessionCallback = Callable[["ProbeSet", Session], None]
AppProbeCallback = Callable[[AppRecord], None]  # a session asked about a process, it exec'd, or it published
WorkloadSeriesFactory = Callable[[ProbeSetConfig], WorkloadSeries]  # for probe sets with a workload label
METRICS_ONLY_NS = (1 << 64) - 1  # a minimum session duration nothing reaches


def resolve(cfg: ProbeSetConfig, env: KernelEnv, names: InputNames = AGENT_NAMES) -> discovery.Discovery:
    """The functions a probe set would attach, in the attach mode it would use, and its injected probes checked
    against this kernel (nothing attached): the one resolution of a start, which the attach uses as it is."""
    cfg = syscall_set.with_preset(cfg, env)  # syscalls: true, as the globs of its functions
    user, kernel = discovery.user_and_kernel_globs((*cfg.entry, *cfg.allow))  # values: '@file' read at input
    mode = env.auto_mode if cfg.attach_mode == "auto" else cfg.attach_mode
    try:
        if kernel and env.kernel_refusal:
            raise SetupError(env.kernel_refusal)
        if kernel:
            mode = env.kernel_mode(mode)
        user_mode = env.user_mode(cfg.user_attach_mode) if user else ""
    except SetupError as exc:
        raise SetupError(exc.message, cfg.name) from None
    if cfg.lbr_branch_types and env.lbr_missing:
        raise lbr_refusal(names.lbr, env.lbr_missing, cfg.name)
    try:
        found = discovery.discover(cfg.entry, cfg.allow, cfg.deny, env.ksyms, env.available,  # type: ignore[arg-type]
                                   env.ret_kind, mode or "kprobe", resolve_source_glob=env.resolve_source_glob,
                                   user_mode=user_mode, pids=cfg.pids)
    except discovery.DiscoveryError as exc:
        raise InputError(str(exc), cfg.name) from None
    found.probes = resolve_injected(cfg, env)
    return found


def capture_config(cfg: ProbeSetConfig, mode: str, limits: Limits, names: InputNames = AGENT_NAMES,
                   arg_specs: dict[int, list[int]] | None = None, root: str = "/",
                   counted: bool = True, user_mode: str = "", inject: Sequence[ProbeInfo] = ()) -> CaptureConfig:
    """The one translation of a probe set into what the kernel side records.

    `counted`: something reads the per-function counts (MetricsConfig.read)."""
    try:
        cg, level = cgroup_target(cfg.cgroup, names.cgroup, root) if cfg.cgroup else (0, 0)
    except InputError as exc:
        raise exc.for_set(cfg.name) from None
    counted = (sessions := (kmode := BY_NAME.get(mode)) is None or kmode.sessions) and counted  # else origins only
    common = {"mode": mode, "user_mode": user_mode or "uprobe", "pids": cfg.pids,
              "no_pids": cfg.no_pids, "comms": cfg.comms, "no_comms": cfg.no_comms,
              "cgroup_id": cg, "cgroup_level": level, "max_sessions": limits.max_sessions,
              "workload_stats": counted and cfg.workload_label is not None, "func_counts": counted,
              "syscall_entries": syscall_set.boundaries(cfg)}
    if cfg.mode == "metrics" or not sessions:
        # counted in the kernel, never reported: user space's CPU stays flat with the call rate; one page of ring buffer
        return CaptureConfig(**common, emit_calls=False, capture_success=False, min_duration_ns=METRICS_ONLY_NS,
                             ringbuf_size=4096, kernel_stack=False)
    ks = kernel_sampling(cfg.sampling)
    return CaptureConfig(**common, emit_calls=cfg.records_calls, capture_success=ks.capture_success,
                         success_threshold=ks.threshold, success_interval_ns=ks.interval_ns,
                         success_burst_ns=ks.burst_ns, error_threshold=ks.error_threshold,
                         error_interval_ns=ks.error_interval_ns, error_burst_ns=ks.error_burst_ns,
                         min_duration_ns=cfg.min_duration_ns, ringbuf_size=limits.ringbuf_size,
                         lbr_branch_types=cfg.lbr_branch_types, capture_args=cfg.capture_args,
                         arg_specs=arg_specs or {}, app_context=cfg.app_context, user_stacks=cfg.user_stacks,
                         inject=inject)


def resolve_injected(cfg: ProbeSetConfig, env: KernelEnv, root: str = "/") -> list[ProbeInfo]:
    """The set's injected probes (-J) checked against this kernel; nothing is attached."""
    if not cfg.inject:
        return []
    from retsnoop_otel.kernel import inject_attach
    from retsnoop_otel.kernel.tracefs import TracefsError, find_tracefs
    try:
        inject_attach.check_kernel(cfg.inject)
        return inject_attach.resolve(cfg.inject, find_tracefs(root), env.ksyms.by_name,  # type: ignore[attr-defined]
                                     env.kernel_btf, env.ret_kind, env.tp_formats)
    except (inject_attach.InjectUnsupported, TracefsError) as exc:
        raise SetupError(str(exc), cfg.name) from None
    except InjectError as exc:
        raise InputError(str(exc), cfg.name) from None


class ProbeSet:
    """One named probe set at run time: its BPF object, session assembly and keep/drop decision."""

    def __init__(self, cfg: ProbeSetConfig, found: discovery.Discovery, limits: Limits, env: KernelEnv,
                 tracer_factory: TracerFactory, on_session: SessionCallback, names: InputNames = AGENT_NAMES,
                 on_app_probe: AppProbeCallback | None = None,
                 workload_series: WorkloadSeriesFactory | None = None, counted: bool = True) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.mode = found.mode or found.user_mode  # a set of user functions alone: its user attach mode
        self.discovery = found
        self.funcs = {f.id: f for f in found.funcs}
        self.symbolizer = env.symbolizer
        self._ksyms = env.ksyms
        self.arg_descs: dict[int, list] = {}
        arg_specs = None
        btf = env.kernel_btf() if cfg.capture_args else None
        if btf is not None:
            from retsnoop_otel.symbols.args import describe_args, spec_words
            self.arg_descs = {f.id: d for f in found.funcs if (d := describe_args(btf, f.name, cfg.arg_sizes))}  # type: ignore[arg-type]
            arg_specs = {fid: spec_words(d) for fid, d in self.arg_descs.items()}
        self.btf = btf
        self.probes = list(found.probes)  # resolved with its functions (resolve), not again here
        capture = capture_config(cfg, found.mode, limits, names, arg_specs, counted=counted, user_mode=found.user_mode,
                                 inject=self.probes)
        if cfg.app_context and (mode := BY_NAME.get(found.mode)) is not None and mode.takes_publish:
            capture = capture._replace(publish_targets=app_hooks.publish_targets(env.traceable_once))
        self.tracer = tracer_factory(found.funcs, capture, env.btf_func_id)
        self._sampling = kernel_sampling(cfg.sampling)  # what kept sessions say in their tracestate
        self._on_session = on_session
        self._on_app_probe = on_app_probe
        # calls beyond the span limit would not be exported: do not keep them either
        self._assembler = SessionAssembler(max_open=limits.max_sessions, max_calls=limits.max_calls_per_session,
                                           probes={p.id: p for p in self.probes})
        self.report: AttachReport | None = None
        self.attach_failures: list[tuple[str, str]] = []
        self.load_s = 0.0  # BPF object open, verification and map setup
        self.kept = 0
        self._sampled_out = 0
        self._filtered_out = 0
        self._started = False
        # counts of the set this one replaced at a reload (carry.py): read live until it is closed
        self._stats_lock = threading.Lock()  # a scrape's reads against close() freeing the maps
        self._prev: ProbeSet | None = None
        self._next: ProbeSet | None = None  # the set that replaced this one
        self._carried: carry.Totals | None = None
        self._final: carry.Totals | None = None  # everything it counted, once closed
        self._bpf_names_due = False  # fentry: [bpf] kallsyms not read since attach
        self._workloads = workload_series(cfg) if workload_series is not None and cfg.workload_label else None

    @property
    def attached(self) -> int:
        return len(self.report.attached) if self.report is not None else 0

    def start(self, ready: bool = True) -> AttachReport:
        """Load, attach (exits before entries), open the ring buffer; on any failure nothing stays attached.
        `ready`: sessions start at once (else at set_ready, when a reload hands over from the set it replaces)."""
        try:
            t0 = time.monotonic()
            self.tracer.load()
            self.load_s = time.monotonic() - t0
            report = self.tracer.attach(on_error=lambda f, e: self.attach_failures.append((f.name, e)), ready=ready)
            self.tracer.open_ring_buffer(self._on_record)
            # fexit stacks run through trampolines and our programs, named by a fresh kallsyms read: taken
            # before the first stack is shown rather than here, where it was most of a small set's start
            self._bpf_names_due = self.mode in TRAMPOLINE and hasattr(self._ksyms, "refresh_bpf_symbols")
        except BaseException as exc:
            self.tracer.close()
            if isinstance(exc, RunRefused):
                raise
            if isinstance(exc, InjectError):  # an injected probe the kernel refused: the spec's fault
                raise InputError(str(exc), self.name) from None
            if isinstance(exc, Exception):
                raise SetupError(str(exc), self.name) from exc
            raise
        self.report = report
        self._started = True
        return report

    def _on_record(self, rec: Record) -> None:
        if isinstance(rec, APP_RECORDS):
            if self._on_app_probe is not None:
                self._on_app_probe(rec)
            return
        session = self._assembler.feed(rec)
        if session is not None and self._bpf_names_due and session.kstack:
            self._bpf_names_due = False
            self._ksyms.refresh_bpf_symbols()
        if session is not None and self.accepts(session):
            self.kept += 1
            self._on_session(self, session)

    def accepts(self, session: Session) -> bool:
        """Failing sessions pass the error filter; successful ones arrive sampled by the kernel side.

        A kept session records how it was kept (threshold; the randomness came with it) for the spans'
        tracestate. The kernel counts the sessions it dropped (CaptureStats.sampled_out, errors_sampled_out).
        """
        if session.is_err and not self.cfg.errors.accepts(session, self.funcs):
            self._filtered_out += 1
            return False
        flags = session.kernel_sampling
        if not session.is_err and not flags:  # a success not kept by the kernel's sampler (none sends such)
            self._sampled_out += 1
            return False
        session.sampling_threshold = self._sampling.kept_threshold(session.is_err, bool(flags),
                                                                   bool(flags & SAMPLED_PROBABILITY))
        return True

    def poll(self, timeout_ms: int, wake_fd: int | None = None) -> int:  # wake_fd: runtime/requests.py
        return self.tracer.poll(timeout_ms, wake_fd) if self._started else 0

    def set_ready(self, ready: bool) -> None:
        """Whether calls of its entry functions start sessions (attached probes see the calls either way)."""
        self.tracer.set_ready(ready)

    def carry_from(self, prev: ProbeSet) -> None:
        """Count on from `prev`, the set of the same name this one replaces at a reload: its counts are read
        live until it is closed, then its final ones are kept (and the set let go)."""
        self._prev, prev._next = prev, self

    def _settle(self, final: carry.Totals) -> None:
        with self._stats_lock:
            self._carried, self._prev = final, None

    def _carry(self) -> carry.Totals | None:
        return self._prev.totals() if self._prev is not None else self._carried

    def totals(self) -> carry.Totals:
        """Everything it counted, carried counts included, by function name."""
        with self._stats_lock:
            return self._final if self._final is not None else self._totals_now()

    def _totals_now(self) -> carry.Totals:
        return carry.totals(self.funcs, self.tracer.func_stats(), self.tracer.session_stats(),
                            self._own_workload_totals(), self.tracer.capture_stats(), self.tracer.program_stats(),
                            self._sampled_out, self._filtered_out, self._assembler.evicted, self._carry(),
                            self.tracer.origin_counts())

    # the kernel's aggregates, read at scrape time (metrics.kernel_families.ProbeSetSource); a closed set
    # (one a scrape listed before it was closed) answers its final counts
    def func_stats(self) -> list[FuncStats]:
        with self._stats_lock:
            if self._final is not None:
                return carry.func_stats([], self.funcs, self._final)
            return carry.func_stats(self.tracer.func_stats(), self.funcs, self._carry())

    def session_stats(self) -> list[SessionStats]:
        with self._stats_lock:
            if self._final is not None:
                return carry.session_stats([], self.funcs, self._final)
            return carry.session_stats(self.tracer.session_stats(), self.funcs, self._carry())

    def capture_stats(self) -> CaptureStats:
        with self._stats_lock:
            if self._final is not None:
                return self._final.capture
            return carry.capture_stats(self.tracer.capture_stats(), self._carry())

    def origin_counts(self) -> list[OriginCount]:
        """Failing sessions by entry, error origin and error, counted in the kernel (carried ones included)."""
        with self._stats_lock:
            if self._final is not None:
                return carry.origin_counts([], self.funcs, self._final)
            return carry.origin_counts(self.tracer.origin_counts(), self.funcs, self._carry())

    def program_stats(self) -> list[ProgramStats]:
        with self._stats_lock:
            if self._final is not None:
                return list(self._final.programs.values())
            return carry.program_stats(self.tracer.program_stats(), self._carry())

    def _user_counts(self) -> tuple[int, int, int]:
        """(sampled out, filtered out, evicted) in user space, carried ones included."""
        if self._final is not None:
            return self._final.sampled_out, self._final.filtered_out, self._final.evicted
        c = self._carry()
        own = (self._sampled_out, self._filtered_out, self._assembler.evicted)
        return own if c is None else (own[0] + c.sampled_out, own[1] + c.filtered_out, own[2] + c.evicted)

    @property
    def sampled_out(self) -> int:
        """Successes not exported that the kernel sent (its own drops are in capture_stats)."""
        return self._user_counts()[0]

    @property
    def filtered_out(self) -> int:
        """Failing sessions the error filter kept from export."""
        return self._user_counts()[1]

    @property
    def evicted(self) -> int:
        """Open sessions the assembler had to drop (more threads in sessions than limits.max_sessions)."""
        return self._user_counts()[2]

    @property
    def workload_label(self) -> str | None:
        """The label name its calls, errors and sessions carry per workload (None: not labelled)."""
        return LABEL_NAMES[self.cfg.workload_label] if self._workloads is not None and self.cfg.workload_label \
            else None

    def workload_totals(self) -> list[WorkloadTotal]:
        """Counts per workload label value; the kernel's entries of cgroups that are gone are dropped here."""
        with self._stats_lock:
            if self._final is not None:
                return carry.workload_totals([], self.funcs, self._final)
            return carry.workload_totals(self._own_workload_totals(), self.funcs, self._carry())

    def _own_workload_totals(self) -> list[WorkloadTotal]:
        if self._workloads is None:
            return []
        totals, gone = self._workloads.fold(self.tracer.workload_counts())
        if gone:
            self.tracer.forget_cgroups(gone)
        return totals

    def detach(self) -> None:
        """Every probe detached; the ring buffer and the counts stay readable until close()."""
        self.tracer.detach()

    def close(self) -> None:
        """Detach, keep the final counts (a successor carries them on), free the BPF object."""
        started, self._started = self._started, False
        self.tracer.detach()
        with self._stats_lock:
            if started:
                self._final = self._totals_now()
                self._prev = self._carried = None
            self.tracer.close()
        successor, self._next = self._next, None
        if successor is not None and self._final is not None:
            successor._settle(self._final)


def start_probe_sets(found: Sequence[tuple[ProbeSetConfig, discovery.Discovery]], env: KernelEnv, limits: Limits,
                     tracer_factory: TracerFactory, on_session: SessionCallback, names: InputNames = AGENT_NAMES,
                     on_app_probe: AppProbeCallback | None = None, workload_series: WorkloadSeriesFactory | None = None,
                     counted: bool = True, ready: bool = True) -> list[ProbeSet]:
    """Attach every resolved set, or (on the first failure) detach the ones already attached and raise.
    `ready`: as for ProbeSet.start."""
    started: list[ProbeSet] = []
    try:
        for cfg, disc in found:
            ps = ProbeSet(cfg, disc, limits, env, tracer_factory, on_session, names, on_app_probe=on_app_probe,
                          workload_series=workload_series, counted=counted)
            ps.start(ready)
            started.append(ps)
    except BaseException:
        for ps in reversed(started):
            ps.close()
        raise
    return started


def hand_over(old_sets: Sequence[ProbeSet], new_sets: Sequence[ProbeSet]) -> None:
    """A reload's switch: from here on the new sets start the sessions and the old ones none (those in progress
    end there), so a call is neither lost nor counted twice; a set of the same name counts on from its
    predecessor."""
    for ps in old_sets:
        ps.set_ready(False)
    old = {ps.name: ps for ps in old_sets}
    for ps in new_sets:
        ps.set_ready(True)
        if ps.name in old:
            ps.carry_from(old[ps.name])


def tracer_factory(object_path: Path | None = None) -> TracerFactory:
    """kernel/tracer.py's Tracer, loading the package's BPF object or `object_path`: another build of
    retsnoop.bpf.c, which a bench passes through RuntimeDeps to measure it in the product's own start."""
    def make(funcs: Sequence[TracedFunc], cfg: CaptureConfig,
             btf_func_id: Callable[[str], int | None] | None) -> TracerLike:
        from retsnoop_otel.kernel.tracer import Tracer
        return Tracer(funcs, cfg, btf_func_id=btf_func_id, object_path=object_path)
    return make


real_tracer_factory = tracer_factory()

SetOrigins = list[tuple[FuncTable, list[OriginCount]]]  # each probe set's functions and its error origins


def stop_counts(sets: Sequence[ProbeSet], close: Callable[[], object]) -> tuple[CaptureStats, SetOrigins]:
    """At a stop: the kernel's loss counters, read before `close` detaches the sets, then each set's error origins,
    read after their probes went, so that every session that ended before then counts."""
    try:
        stats = CaptureStats.summed(ps.capture_stats() for ps in sets)
    finally:
        close()
    return stats, [(ps.funcs, ps.origin_counts()) for ps in sets]

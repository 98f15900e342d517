"""Capture runtime shared by long-running users: kernel facts, and one named probe set at a time.

A probe set is discovery + one BPF object (Tracer) + session assembly + the keep/drop decision
(error filter for failing sessions, sampling for successful ones). The kernel-facing pieces come in
through factories (KernelEnv loader, tracer factory) so the agent's lifecycle logic (reload,
shutdown) can be driven in unit tests without a kernel.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from retsnoop_otel.capture.model import (
    CaptureStats,
    FuncStats,
    ProgramStats,
    RetKind,
    Session,
    SessionStats,
    TracedFunc,
)
from retsnoop_otel.capture.records import Record
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.kernel.tracer import AttachReport, CaptureConfig
from retsnoop_otel.runtime.config import Limits, ProbeSetConfig, Sampling
from retsnoop_otel.symbols import discovery


class SetupError(Exception):
    """The kernel or host cannot run a probe set (missing feature, privileges, unreadable files)."""


class ProbeSetError(Exception):
    """One probe set cannot be resolved or attached; the message starts with its name."""


class TracerLike(Protocol):
    """What the pipeline needs from tracer.Tracer (fakes implement it in unit tests)."""

    def load(self) -> None: ...

    def attach(self, on_error: Callable[[TracedFunc, str], None] | None = None,
               strict: bool = False) -> AttachReport: ...

    def open_ring_buffer(self, on_record: Callable[[Record], None]) -> None: ...

    def poll(self, timeout_ms: int) -> int: ...

    def func_stats(self) -> list[FuncStats]: ...

    def session_stats(self) -> list[SessionStats]: ...

    def capture_stats(self) -> CaptureStats: ...

    def program_stats(self) -> list[ProgramStats]: ...

    def close(self) -> None: ...


TracerFactory = Callable[[Sequence[TracedFunc], CaptureConfig, Callable[[str], int | None] | None], TracerLike]


def _nothing() -> None:
    return None


@dataclass
class KernelEnv:
    """Facts about the running kernel that discovery and symbolization need, read once per (re)load."""

    ksyms: object  # kallsyms.Kallsyms
    available: Sequence[tuple[str, str | None]]
    ret_kind: Callable[[str], RetKind]
    btf_func_id: Callable[[str], int | None] | None
    auto_mode: str
    check_mode: Callable[[str], None]  # raises SetupError when the mode cannot trace here
    symbolizer: object  # symbolize.Symbolizer
    resolve_source_glob: Callable[[str], set[str]] | None = None
    close: Callable[[], None] = _nothing
    lbr_missing: str = ""  # why LBR capture cannot work here ("" = it can)


def load_kernel_env(vmlinux: str | None, root: str = "/") -> KernelEnv:
    """Features, kallsyms, available_filter_functions, BTF and (optionally) a DWARF vmlinux."""
    from retsnoop_otel.kernel import features
    from retsnoop_otel.kernel import libbpf as lb
    from retsnoop_otel.symbols import tracefs
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms, KallsymsError
    from retsnoop_otel.symbols.symbolize import DwarfSymbolizer, KallsymsSymbolizer

    feats = features.detect(root)

    def check_mode(mode: str) -> None:
        try:
            features.require_tracing(feats, mode)
        except features.FeatureError as exc:
            raise SetupError(str(exc)) from None

    check_mode("auto")
    try:
        ksyms = Kallsyms.load(root)
        available = tracefs.read_available_filter_functions(root)
        btf = lb.Btf.load_vmlinux()
    except (KallsymsError, tracefs.TracefsError, lb.LibbpfError, lb.LibbpfUnavailable) as exc:
        raise SetupError(str(exc)) from None
    ret_kinds = ReturnKinds(btf)
    symbolizer: object = KallsymsSymbolizer(ksyms)
    resolve = None
    close = _nothing
    if vmlinux is not None:
        from retsnoop_otel.symbols.dwarf import DwarfError, LlvmSymbolizer, SourceIndex, find_vmlinux, kaslr_offset
        try:
            path = find_vmlinux(None if vmlinux == "auto" else vmlinux, root)
        except DwarfError as exc:
            raise SetupError(f"vmlinux: {exc}") from None
        if path is not None:
            resolve = SourceIndex.load_or_build(path).match
            source = LlvmSymbolizer(path, kaslr_offset(path, ksyms.stext))  # type: ignore[arg-type]
            symbolizer = DwarfSymbolizer(ksyms, source)
            close = source.close
    from retsnoop_otel.render.lbr import lbr_missing
    return KernelEnv(ksyms=ksyms, available=available, ret_kind=ret_kinds, btf_func_id=ret_kinds.func_id,
                     auto_mode=features.choose_mode(feats), check_mode=check_mode, symbolizer=symbolizer,
                     resolve_source_glob=resolve, close=close,
                     lbr_missing=lbr_missing(feats.lbr, feats.branch_snapshot))


def cgroup2_mount(root: str = "/") -> str:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts."""
    try:
        with open(os.path.join(root, "proc/mounts")) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        pass
    return "/sys/fs/cgroup"


def cgroup_target(path: str, root: str = "/") -> tuple[int, int]:
    """(id, level) of a cgroup v2 directory: the id is its inode number, the level its depth below the
    root cgroup, so that the kernel side can match tasks in it and in every cgroup below it.

    `path` is absolute (under the cgroup2 mount) or relative to the root cgroup."""
    mount = cgroup2_mount(root)
    rel = path.removeprefix(mount) if path.startswith(mount + "/") or path == mount else path
    rel = rel.strip("/")
    full = os.path.join(root, mount.lstrip("/"), rel)
    try:
        st = os.stat(full)
    except OSError as exc:
        raise ValueError(f"cgroup {path}: {exc.strerror} ({full}); give a cgroup v2 path such as "
                         "/sys/fs/cgroup/system.slice/foo.service") from None
    if not os.path.isdir(full):
        raise ValueError(f"cgroup {path}: not a directory ({full}); give a cgroup v2 path such as "
                         "/sys/fs/cgroup/system.slice/foo.service")
    return st.st_ino, len([p for p in rel.split("/") if p])


def resolve(cfg: ProbeSetConfig, env: KernelEnv) -> discovery.Discovery:
    """The functions a probe set would attach, in the attach mode it would use (nothing attached)."""
    mode = env.auto_mode if cfg.attach_mode == "auto" else cfg.attach_mode
    try:
        env.check_mode(mode)
    except SetupError as exc:
        raise ProbeSetError(f"probe set '{cfg.name}' (attach_mode: {cfg.attach_mode}): {exc}") from None
    if cfg.lbr_branch_types and env.lbr_missing:
        raise ProbeSetError(f"probe set '{cfg.name}': 'lbr' needs last branch records, but {env.lbr_missing}: "
                            "remove 'lbr' from this probe set, or run on a CPU that exposes LBR")
    try:
        return discovery.discover(cfg.entry, cfg.allow, cfg.deny, env.ksyms, env.available,  # type: ignore[arg-type]
                                  env.ret_kind, mode, resolve_source_glob=env.resolve_source_glob)
    except discovery.DiscoveryError as exc:
        raise ProbeSetError(f"probe set '{cfg.name}': {exc}") from None


METRICS_ONLY_NS = (1 << 64) - 1  # a minimum session duration nothing reaches


def capture_config(cfg: ProbeSetConfig, mode: str, limits: Limits, cgroup_root: str = "/") -> CaptureConfig:
    try:
        cg, level = cgroup_target(cfg.cgroup, cgroup_root) if cfg.cgroup else (0, 0)
    except ValueError as exc:
        raise ProbeSetError(f"probe set '{cfg.name}': filters.{exc}") from None
    if cfg.mode == "metrics":
        # Counted in the kernel's per-CPU maps, never reported: no session reaches user space, so the
        # agent's CPU does not grow with the call rate, and a one-page ring buffer is enough.
        return CaptureConfig(mode=mode, emit_calls=False, capture_success=False, min_duration_ns=METRICS_ONLY_NS,
                             pids=cfg.pids, no_pids=cfg.no_pids, comms=cfg.comms, no_comms=cfg.no_comms,
                             cgroup_id=cg, cgroup_level=level, ringbuf_size=4096, max_sessions=limits.max_sessions)
    return CaptureConfig(mode=mode, emit_calls=cfg.mode == "calls", capture_success=cfg.sampling.captures_success,
                         min_duration_ns=int(cfg.min_duration_ms * 1_000_000), pids=cfg.pids, no_pids=cfg.no_pids,
                         comms=cfg.comms, no_comms=cfg.no_comms, cgroup_id=cg, cgroup_level=level,
                         ringbuf_size=limits.ringbuf_size, max_sessions=limits.max_sessions,
                         lbr_branch_types=cfg.lbr_branch_types)


class SuccessSampler:
    """Keeps successful sessions by probability, or up to a rate per entry function (token bucket)."""

    def __init__(self, sampling: Sampling, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sampling = sampling
        self._rng = rng or random.Random()
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # entry func id -> (tokens, last refill)

    def keep(self, entry_func_id: int | None) -> bool:
        rate = self.sampling.success_rate_per_s
        if not rate:
            p = self.sampling.success_probability
            return p >= 1.0 or (p > 0.0 and self._rng.random() < p)
        now = self._clock()
        burst = max(1.0, rate)
        key = -1 if entry_func_id is None else entry_func_id  # id 0 is a real entry function
        tokens, last = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - last) * rate)
        keep = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if keep else tokens, now)
        return keep


SessionCallback = Callable[["ProbeSet", Session], None]


class ProbeSet:
    """One named probe set at run time: its BPF object, session assembly and keep/drop decision."""

    def __init__(self, cfg: ProbeSetConfig, found: discovery.Discovery, limits: Limits, env: KernelEnv,
                 tracer_factory: TracerFactory, on_session: SessionCallback,
                 sampler: SuccessSampler | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.mode = found.mode
        self.discovery = found
        self.funcs = {f.id: f for f in found.funcs}
        self.symbolizer = env.symbolizer
        self._ksyms = env.ksyms
        self.tracer = tracer_factory(found.funcs, capture_config(cfg, found.mode, limits), env.btf_func_id)
        self.sampler = sampler or SuccessSampler(cfg.sampling)
        self._on_session = on_session
        # calls beyond the span limit would not be exported: do not keep them either
        self._assembler = SessionAssembler(max_open=limits.max_sessions, max_calls=limits.max_spans_per_trace)
        self.attached = 0
        self.attach_failures: list[tuple[str, str]] = []
        self.kept = 0
        self.sampled_out = 0
        self.filtered_out = 0
        self._started = False

    def start(self) -> AttachReport:
        """Load, attach (exits before entries), open the ring buffer; on any failure nothing stays attached."""
        try:
            self.tracer.load()
            report = self.tracer.attach(on_error=lambda f, e: self.attach_failures.append((f.name, e)))
            self.tracer.open_ring_buffer(self._on_record)
            if self.mode == "fentry" and hasattr(self._ksyms, "refresh_bpf_symbols"):
                self._ksyms.refresh_bpf_symbols()  # name the trampolines that fexit stacks run through
        except BaseException as exc:
            self.tracer.close()
            if isinstance(exc, Exception) and not isinstance(exc, ProbeSetError):
                raise ProbeSetError(f"probe set '{self.name}': {exc}") from exc
            raise
        self.attached = len(report.attached)
        self._started = True
        return report

    @property
    def evicted(self) -> int:
        """Open sessions the assembler had to drop (more threads in sessions than limits.max_sessions)."""
        return self._assembler.evicted

    def _on_record(self, rec: Record) -> None:
        session = self._assembler.feed(rec)
        if session is None:
            return
        if self.accepts(session):
            self.kept += 1
            self._on_session(self, session)

    def accepts(self, session: Session) -> bool:
        """Failing sessions pass the error filter; successful ones go through sampling."""
        if session.is_err:
            if self.cfg.errors.accepts(session, self.funcs):
                return True
            self.filtered_out += 1
            return False
        if self.sampler.keep(session.entry_func_id):
            return True
        self.sampled_out += 1
        return False

    def poll(self, timeout_ms: int) -> int:
        return self.tracer.poll(timeout_ms) if self._started else 0

    def close(self) -> None:
        self._started = False
        self.tracer.close()


def start_probe_sets(cfgs: Sequence[ProbeSetConfig], env: KernelEnv, limits: Limits, tracer_factory: TracerFactory,
                     on_session: SessionCallback) -> list[ProbeSet]:
    """Resolve and attach every set, or (on the first failure) detach the ones already attached and raise."""
    found = [(cfg, resolve(cfg, env)) for cfg in cfgs]  # all globs resolve before anything is attached
    started: list[ProbeSet] = []
    try:
        for cfg, disc in found:
            ps = ProbeSet(cfg, disc, limits, env, tracer_factory, on_session)
            ps.start()
            started.append(ps)
    except BaseException:
        for ps in reversed(started):
            ps.close()
        raise
    return started


def real_tracer_factory(funcs: Sequence[TracedFunc], cfg: CaptureConfig,
                        btf_func_id: Callable[[str], int | None] | None) -> TracerLike:
    from retsnoop_otel.kernel.tracer import Tracer
    return Tracer(funcs, cfg, btf_func_id=btf_func_id)

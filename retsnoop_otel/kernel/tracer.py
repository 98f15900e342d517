"""One tracing run in the kernel: load the BPF object (configured by kernel/capture_config.py), attach, poll, read
maps, detach.

Callers get plain data (capture.model and capture.records types), not libbpf handles, so the layers
above run on fake tracers in tests. Attach failures detach whatever was already attached before raising.
"""

from __future__ import annotations

import errno
import os
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import (
    CaptureStats,
    FuncStats,
    OriginCount,
    ProgramStats,
    SessionStats,
    TracedFunc,
    WorkloadCount,
)
from retsnoop_otel.kernel import (
    app_hooks,
    attach_modes,
    bpfsys,
    caps,
    capture_config,
    clones,
    inject_attach,
    libbpf_progs,
    libbpf_ringbuf,
    stats_maps,
    syscall_hooks,
    uprobes,
)
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.capture_config import MODE_PROGRAMS, CaptureConfig
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.modes.base import AttachReport, Job

__all__ = ["AttachReport", "Tracer", "bpf_object_path"]

PARALLEL_DETACH_MIN = 32
DETACH_THREADS = 32
# every name a program of ours has in the kernel: what a check for leftovers after detach looks for
PROGRAM_NAMES = frozenset({*(n for names in (*MODE_PROGRAMS.values(), *uprobes.PROGRAMS.values()) for n in names),
                           *clones.TEMPLATES, *app_hooks.PROGRAMS, *inject_attach.PROGRAMS.values(),
                           *syscall_hooks.PROGRAMS})


def bpf_object_path() -> Path:
    # next to the package's modules (importlib.resources would say the same, after a 0.3 s import under emulation)
    path = Path(__file__).resolve().parent.parent / "bpf" / "retsnoop.bpf.o"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: the package was installed without its BPF object; reinstall with "
            "`pip install .` on a machine with clang and libbpf-dev")
    return path


class Tracer:
    """One loaded BPF object with its attachments for one set of functions."""

    def __init__(self, funcs: Sequence[TracedFunc], config: CaptureConfig,
                 btf_func_id: Callable[[str], int | None] | None = None,
                 arg_specs: dict[int, list[int]] | None = None, object_path: Path | None = None) -> None:
        if config.mode not in attach_modes.BY_NAME and config.mode:
            raise ValueError(f"unknown attach mode '{config.mode}' (expected one of {', '.join(attach_modes.NAMES)})")
        if not funcs:
            raise ValueError("no functions to trace")
        self.funcs = list(funcs)
        self._mode = attach_modes.BY_NAME.get(config.mode)  # None: no kernel functions
        # the entries the syscall tracepoints start sessions for (kernel/syscall_hooks.py), and what the mode links
        self._sys_hooks = syscall_hooks.hooked(self.funcs, config.syscall_entries)
        self._sys_programs = syscall_hooks.for_mode(self._mode)
        self._kfuncs = capture_config.mode_funcs(self.funcs, self._sys_hooks)
        self._has_user = any(f.binary is not None for f in self.funcs)
        self.config = config
        self._object_path = object_path  # another build of retsnoop.bpf.c (benches compare builds); None: ours
        self._btf_func_id = btf_func_id
        self._arg_specs = arg_specs or config.arg_specs
        self._links: list[lb.Link] = []
        self._app_links: list[lb.Link] = []  # the watcher's hooks (app_context only), apart: _links holds pairs
        self._sys_links: list[lb.Link] = []  # the syscall tracepoints (exit, entry), detached before the rest
        self._inject_links: list[lb.Link] = []  # -J
        self._machine = os.uname().machine
        self._app_kprobes = app_hooks.by_kprobe(self._mode.feature if self._mode else "", self._machine)
        # the publish hooks as members of the mode's entry link, where they can be (else a link of their own)
        self._publish = app_hooks.folded(self._mode, config.publish_targets, self._kfuncs) \
            if config.app_context and self._app_kprobes else []
        # the per-function clones of the cloning modes (kernel/modes/cloned.py; unused in the others)
        self._fentry = clones.FentryPrograms(self._kfuncs, btf_func_id, self._mode.clone_sets if self._mode else {},
                                             config.mode)
        self._rb: libbpf_ringbuf.RingBuffer | None = None
        self._lbr_fds: list[int] = []
        self._obj: lb.BpfObject | None = None
        self._sessions = False  # whether sessions may run (set_ready, until a stop): then a stop first stops them
        self._ncpus = lb.num_possible_cpus()
        # whether the programs find the function id by address (map ip_ids) rather than by BPF cookie
        self._by_address = bool(self._mode and self._mode.uses_addresses())

    # ---- load ----------------------------------------------------------------------------

    def load(self) -> None:
        caps.raise_nofile_limit(4 * len(self.funcs) + 1024)
        try:
            self._load_object()
        except lb.LibbpfError:
            if not (self._mode and self._mode.clone_sets and self._fentry.targets):
                raise
            self._fentry.verify_against_harmless()  # a traced function the kernel refuses: it fails alone
            self._load_object()

    def _load_object(self) -> None:
        obj = lb.BpfObject.open_file(str(self._object_path or bpf_object_path()))
        self._obj = obj
        try:
            capture_config.configure(obj, self.config, self.funcs, self._fentry, self._by_address, self._ncpus,
                                     self._sys_hooks, self._app_kprobes, self._publish)
            obj.load()
            capture_config.fill_maps(obj, self.config, self.funcs, self._by_address, self._arg_specs, self._sys_hooks,
                                     self._publish)
        except BaseException:
            self.close()
            raise

    # ---- attach --------------------------------------------------------------------------

    def attach(self, on_error: Callable[[TracedFunc, str], None] | None = None,
               strict: bool = False, ready: bool = True) -> AttachReport:
        """Attach exit probes before entry probes so no session starts without its exit probe.

        A function that cannot be attached is reported and skipped, unless `strict`; if nothing
        could be attached at all, everything is detached and the error raised. Sessions start once every
        probe is attached, or (`ready` False) from set_ready(True) on.
        """
        assert self._obj is not None, "load() first"
        report = AttachReport()
        t0 = time.monotonic()
        try:
            self._open_lbr_events()
            if self._kfuncs:
                assert self._mode is not None
                self._mode.attach(Job(self._obj, self._kfuncs, self._links, self._fentry, self._btf_func_id,
                                      self._by_address, self.detach_links, self._publish), report, on_error, strict)
            if self._sys_hooks:  # after the mode's: the sessions they start find every inner probe attached
                syscall_hooks.attach(self._obj, self._sys_hooks, self._sys_links, self._sys_programs)
                report.attached.extend(f for f in self.funcs if f.id in self._sys_hooks)
                report.syscall_entries = len(self._sys_hooks)
            if user := [f for f in self.funcs if f.binary is not None]:
                uprobes.attach(self._obj.program, self.config.user_mode, user, self._links)
                report.attached.extend(user)
            if not report.attached:
                reason = report.failed[0][1] if report.failed else "no functions"
                raise lb.LibbpfError(f"could not attach any function ({reason.splitlines()[0]})",
                                     errno.EINVAL)
            if self.config.app_context:  # processes exec'd or publishing from now on are reported
                report.hooks_missing = app_hooks.attach(self._obj, self._app_links, self._app_kprobes,
                                                         self._machine, fold=bool(self._publish))
            self._inject_links = inject_attach.attach(self._obj, self.config.inject)
        except BaseException:
            self.detach()
            raise
        if ready:
            self.set_ready(True)
        report.attach_ms = (time.monotonic() - t0) * 1000
        return report

    def _open_lbr_events(self) -> None:
        """One branch-stack perf event per online CPU keeps its LBR recording while we are attached."""
        if not (self.config.lbr_branch_types and self.config.lbr_perf_events) or self._lbr_fds:
            return
        for cpu in bpfsys.online_cpus():
            try:
                self._lbr_fds.append(bpfsys.perf_lbr_open(cpu, self.config.lbr_branch_types))
            except OSError as exc:
                raise lb.LibbpfError(f"LBR capture: opening the branch-stack perf event of CPU {cpu} failed "
                                     "(this CPU or hypervisor exposes no last branch records: turn LBR "
                                     "capture off)", exc.errno or errno.EOPNOTSUPP) from None

    def set_ready(self, ready: bool) -> None:
        """The kernel side's `ready`: whether entry functions start sessions (calls in progress go on)."""
        self._set_run_state(ready=ready, stopping=False)

    def stop_sessions(self) -> None:
        """No session starts from here on, and none in progress is reported when it ends: detach()'s first step,
        which lets it remove every link at once (set_ready(True) starts them again)."""
        self._set_run_state(ready=False, stopping=True)

    def _set_run_state(self, ready: bool, stopping: bool) -> None:
        """.bss's two flags, written together (the section is one map value user space alone writes)."""
        assert self._obj is not None
        bss = self._obj.map(".bss")
        where = Btf.of_object(self._obj).datasec_vars(".bss")
        value = bytearray(bss.value_size)
        for name, on in (("ready", ready), ("stopping", stopping)):
            off, size = where[name]
            value[off:off + size] = b"\x01" if on else b"\x00"
        bss.update(struct.pack("<I", 0), bytes(value))
        self._sessions = ready or (self._sessions and not stopping)  # a handover's sessions in progress go on

    # ---- capture -------------------------------------------------------------------------

    def open_ring_buffer(self, on_record: Callable[[records.Record], None]) -> None:
        assert self._obj is not None

        def on_raw(data: bytes) -> None:
            on_record(records.decode(data))

        self._rb = libbpf_ringbuf.RingBuffer(self._obj.map("rb").fd, on_raw)

    def poll(self, timeout_ms: int, wake_fd: int | None = None) -> int:
        assert self._rb is not None
        return self._rb.poll(timeout_ms, wake_fd)

    # ---- application processes -------------------------------------------------------------

    def set_app_target(self, tgid: int, tp_offset: int = 0, offset: int = 0, modid: int = 0,
                       publishes: bool = True) -> None:
        """Where the process keeps otel_thread_ctx_v1, or (publishes=False) that it was checked and has none."""
        value = records.APP_TLS.pack(tp_offset, offset, modid, 0 if publishes else records.APP_TLS_NONE)
        self._map("app_targets").update(struct.pack("<I", tgid), value)

    def forget_app_target(self, tgid: int) -> None:
        """The process exited or must be checked again: its next session asks anew."""
        key = struct.pack("<I", tgid)
        self._map("app_targets").delete(key)
        self._map("app_asked").delete(key)

    def _map(self, name: str) -> lb.BpfMap:
        if self._obj is None:
            raise RuntimeError("the BPF object is not loaded")
        return self._obj.map(name)

    def func_stats(self) -> list[FuncStats]:
        """Aggregates summed over CPUs, read at call time (scrape time for Prometheus)."""
        if not self.config.func_counts:
            return []
        return stats_maps.func_stats(self._map("func_stats"), self._map("err_stats"), self.funcs, self._ncpus)

    def workload_counts(self) -> list[WorkloadCount]:
        """The per-cgroup counts (CaptureConfig.workload_stats), summed over CPUs, read at scrape time."""
        return stats_maps.workload_counts(self._map("wl_stats"), self.funcs, self._ncpus)

    def forget_cgroups(self, cgroup_ids: set[int]) -> None:
        """Drop the per-cgroup counts of these cgroups (gone: user space keeps their totals)."""
        stats_maps.forget_cgroups(self._map("wl_stats"), cgroup_ids)

    def session_stats(self) -> list[SessionStats]:
        """Sessions per entry function (outcome counts and duration histogram), summed over CPUs."""
        if not self.config.func_counts:
            return []
        return stats_maps.session_stats(self._map("entry_stats"), self.funcs, self._ncpus)

    def origin_counts(self) -> list[OriginCount]:
        """Failing sessions by entry function, error origin and error (every one, reported or not)."""
        return stats_maps.origin_counts(self._map("origin_stats"), self.funcs, self._ncpus)

    def capture_stats(self) -> CaptureStats:
        return stats_maps.capture_stats(self._map("cap_stats"), self._ncpus)

    def programs(self) -> list[tuple[str, int]]:
        """(name, fd) of the programs that run when a traced function is hit.

        The cloning modes run per-function clones (named after their template), and the templates themselves
        for the functions they were verified against; the other modes the object's programs. Single uprobes
        share kprobe mode's programs: listed once.
        """
        if self._obj is None:
            return []
        user = uprobes.PROGRAMS[self.config.user_mode] if self._has_user else ()
        kernel = self._mode.running(self._obj, self._fentry) if self._mode and self._kfuncs else []
        kernel += syscall_hooks.running(self._obj, self._sys_links, self._sys_programs)
        named = {name for name, _ in kernel}
        return kernel + [(name, self._obj.program(name).fd) for name in dict.fromkeys(user) if name not in named]

    def program_stats(self) -> list[ProgramStats]:
        """Run count and time of each program (clones summed) and the watcher's hooks; read at scrape time"""
        progs = self.programs()
        if self._obj is not None:
            progs += app_hooks.programs(self._obj, self._app_links)
        return stats_maps.sum_program_stats(progs, libbpf_progs.prog_info)

    # ---- teardown ------------------------------------------------------------------------

    def detach_links(self) -> None:
        """Every link, in any order: no session starts during an attach (`ready` is set after it), nor ends reported
        once detach() set `stopping`. Many links (fentry's, one per function) go from parallel threads: each detach
        waits for an RCU grace period in the kernel, and from several threads (ctypes drops the GIL) those waits
        overlap. A few kprobe.multi links go one after the other: on 6.12 their unregistrations wait for each other
        anyway, and started together took longer (bench/RESULTS.md, 86884f5)."""
        links = [*self._sys_links, *self._links]
        self._sys_links, self._links = [], []
        if len(links) < PARALLEL_DETACH_MIN:
            for link in links:
                link.destroy()
            return
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - only for many links
        with ThreadPoolExecutor(max_workers=DETACH_THREADS) as pool:
            list(pool.map(lambda link: link.destroy(), links))

    def detach(self) -> None:
        """Sessions stopped first (see detach_links), then every probe detached."""
        if self._sessions:
            self.stop_sessions()
        self._app_links = app_hooks.detach(self._app_links)
        self._inject_links = inject_attach.detach(self._inject_links)
        self.detach_links()
        self._fentry.close()
        lbr_fds, self._lbr_fds = self._lbr_fds, []
        for fd in lbr_fds:
            os.close(fd)

    def close(self) -> None:
        self.detach()
        if self._rb is not None:
            self._rb.free()
            self._rb = None
        if self._obj is not None:
            self._obj.close()
            self._obj = None


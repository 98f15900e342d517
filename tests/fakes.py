"""Fakes of what the product reads from the kernel and the host, and the sessions and records the tests feed it.

Shared by the tests (tests/unit/conftest.py makes fixtures of some): a probe set as the metric
collectors see it, a kernel world for the agent and `trace` (KernelEnv over a tiny kallsyms, tracers that deliver
scripted records, an in-memory OTLP sender), sessions with a known call tree, LBR records of a real kernel, a host's
/proc and cgroupfs, and the metrics port's web config.
"""

from __future__ import annotations

import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import bcrypt
from prometheus_client import CollectorRegistry

from retsnoop_otel.appctx.process_context import thread_attributes
from retsnoop_otel.appctx.process_readers import AppSources
from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import (
    AppContext,
    Branch,
    Call,
    CaptureStats,
    FuncStats,
    RetKind,
    Session,
    StackEntry,
    TracedFunc,
)
from retsnoop_otel.capture.records import FuncTraceRec, SessionEndRec, SessionStartRec
from retsnoop_otel.command.errors import SetupError
from retsnoop_otel.export.resource import Resource
from retsnoop_otel.export.sending import SendResult
from retsnoop_otel.kernel.tracer import AttachReport
from retsnoop_otel.metrics.kernel_families import KernelCollector
from retsnoop_otel.metrics.runtime_families import RunCounters, RuntimeCollector
from retsnoop_otel.runtime.config import ProbeSetConfig
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.runtime.startup import Phase
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import KallsymsSymbolizer
from retsnoop_otel.symbols.traceable import Traceable
from tests.oracle_spans import request_to_span_views

# ---- probe sets as the metric collectors see them ------------------------------------------------

VFS_FUNCS = {
    0: TracedFunc(0, "do_open", 0, RetKind.INT32, True),
    1: TracedFunc(1, "may_open", 0, RetKind.INT32, False),
    2: TracedFunc(2, "may_open", 0, RetKind.INT32, False, module="mod"),  # same name, another instance
}


def vfs_func_stats():
    """What the kernel's maps hold for VFS_FUNCS."""
    return [
        # durations: 1 call in [2,4) ns, 2 in [8,16) ns; the last (4th) bucket is open-ended
        FuncStats(0, 3, {"EINVAL": 1}, (0, 1, 0, 2), 1_500_000_000),
        FuncStats(1, 4, {"EPERM": 2, "ENOENT": 1}, (0, 0, 4, 0), 40),
        FuncStats(2, 1, {"EPERM": 1}, (1, 0, 0, 0), 1),
    ]


class Clock:
    """A monotonic clock the test moves by hand (clock.t += seconds)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeProbeSet:
    """A probe set as the collector sees it (runtime.probe_set.ProbeSet has the same face)."""

    name: str = "vfs"
    funcs: dict = field(default_factory=lambda: VFS_FUNCS)
    mode: str = "kprobe_multi"
    attached: int = 3
    sampled_out: int = 4
    filtered_out: int = 1
    evicted: int = 0
    stats: object = vfs_func_stats
    sessions: list = field(default_factory=list)
    capture: CaptureStats = field(default_factory=lambda: CaptureStats(
        dropped_sessions=2, incomplete_sessions=1, dropped_records=7, sessions_started=20, sessions_reported=18))
    workload_label: str | None = None
    workloads: list = field(default_factory=list)  # metrics.workload_series.WorkloadTotal
    origins: list = field(default_factory=list)  # capture.model.OriginCount

    def func_stats(self):
        return self.stats()

    def workload_totals(self):
        return self.workloads

    def session_stats(self):
        return self.sessions

    def capture_stats(self):
        return self.capture

    def origin_counts(self):
        return self.origins

    def program_stats(self):
        return []


def make_registry(*collectors):
    reg = CollectorRegistry(auto_describe=True)
    for c in collectors:
        reg.register(c)
    return reg


def metrics_registry(export=True, sets=None, limiter=None):
    """/metrics as the runtime composes it: the kernel families over `sets`, the runtime's over fixed counters."""
    sets = sets if sets is not None else [FakeProbeSet()]
    counters = RunCounters(100, {"queue_full": 5, "export_failed": 3}, 1) if export else RunCounters()
    return make_registry(KernelCollector(lambda: sets, stats_enabled=lambda: False, limiter=limiter),
                         RuntimeCollector(lambda: counters, stats_enabled=lambda: False))


# ---- the kernel's world for the agent and trace: environment, tracers, OTLP sender ---------------

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81001000 T __x64_sys_bpf
ffffffff81002000 T __sys_bpf
ffffffff81003000 T array_map_alloc_check
ffffffff81004000 t bpf_prog_load
ffffffff81005000 T bpf_check
ffffffff81006000 T bpf_prog_alloc
ffffffff81007000 T vfs_read
"""


_M = records.MAX_FSTACK_DEPTH


def make_env(fail: str | None = None) -> KernelEnv:
    """The kernel as the runtime sees it (KALLSYMS, every function int-returning), or `fail` as its setup error."""
    if fail:
        raise SetupError(fail)
    ksyms = Kallsyms.parse(KALLSYMS)
    names = [line.split()[2] for line in KALLSYMS.splitlines()[1:]]
    return KernelEnv(ksyms=ksyms, available=Traceable(names), ret_kind=lambda _n: RetKind.INT32,
                     btf_func_id=lambda _n: 1, auto_mode="kprobe", kernel_mode=lambda m: m,
                     symbolizer=KallsymsSymbolizer(ksyms), phases=[Phase("symbols", 0.25, "cached")])


class FakeTracer:
    """Delivers scripted records on poll, like a ring buffer would."""

    def __init__(self, funcs, cfg, btf_func_id, world) -> None:
        self.funcs = list(funcs)
        self.cfg = cfg
        self.world = world
        self.state = "new"
        self.pending: list = []
        self.on_record = None
        self.app_targets: dict[int, tuple] = {}
        self.ready = False  # the kernel side's flag: entry functions start sessions
        if world.fail_attach_for & {f.name for f in self.funcs}:
            self.fail = True
        else:
            self.fail = False

    def load(self) -> None:
        self.state = "loaded"

    def attach(self, on_error=None, strict=False, ready=True) -> AttachReport:
        if self.fail:
            raise OSError("attach failed: EBUSY")
        self.state = "attached"
        self.ready = ready
        return AttachReport(attached=list(self.funcs))

    def set_ready(self, ready: bool) -> None:
        assert self.state == "attached", f"set_ready when {self.state}"
        self.ready = ready

    def detach(self) -> None:
        if self.state == "attached":
            self.state = "detached"
        self.ready = False

    def open_ring_buffer(self, on_record) -> None:
        self.on_record = on_record

    def poll(self, timeout_ms: int, wake_fd: int | None = None) -> int:
        assert self.state in ("attached", "detached"), "poll after close"
        pending, self.pending = self.pending, []
        for rec in pending:
            self.on_record(rec)
        if not pending:
            time.sleep(min(timeout_ms, 5) / 1000)
        return len(pending)

    def func_stats(self):
        return [FuncStats(f.id, 3, {"EINVAL": 1}, (0, 1, 2), 300) for f in self.funcs]

    def session_stats(self):
        return []

    def capture_stats(self):
        return CaptureStats()

    def origin_counts(self):
        return []

    def program_stats(self):
        return []

    def set_app_target(self, tgid, tp_offset=0, offset=0, modid=0, publishes=True) -> None:
        self.app_targets[tgid] = (tp_offset, offset, modid, publishes)

    def forget_app_target(self, tgid) -> None:
        self.app_targets.pop(tgid, None)

    def close(self) -> None:
        self.state = "closed"

    def fid(self, name: str) -> int:
        return next(f.id for f in self.funcs if f.name == name)


class World:
    """The kernel-facing side of a runtime: `deps()` gives RuntimeDeps whose tracers are FakeTracers and whose
    OTLP sender keeps the spans (`exported`) and the request bytes (`requests`)."""

    def __init__(self) -> None:
        self.tracers: list[FakeTracer] = []
        self.fail_attach_for: set[str] = set()
        self.exported: list = []
        self.requests: list = []
        self.env_fail: str | None = None
        self.publishing: dict[int, object] = {}  # pid -> TlsLocation-like, for the application watcher
        self.kernel_state: str | None = None  # None: the kernel cannot say, every reload loads the env again
        self.env_loads = 0

    def factory(self, funcs, cfg, btf_func_id):
        t = FakeTracer(funcs, cfg, btf_func_id, self)
        self.tracers.append(t)
        return t

    def sender(self, settings):
        world = self

        class Mem:
            """Receives the request bytes an OTLP sender would send; keeps their spans."""

            def send(self, body, items):
                world.requests.append((settings, body))
                if settings.signal == "traces":
                    world.exported.extend(request_to_span_views(body))
                return SendResult(True)

            def shutdown(self):
                pass

        return Mem()

    def deps(self, console=None) -> RuntimeDeps:
        def load_env(_symbols, _vmlinux, _lbr):
            self.env_loads += 1
            return make_env(self.env_fail)

        return RuntimeDeps(load_env=load_env, kernel_state=lambda: self.kernel_state,
                           find_vmlinux=lambda _symbols, _name: None, check_privileges=lambda: None,
                           tracer_factory=self.factory, make_sender=self.sender,
                           boot_to_wall_offset=lambda: 1_000_000_000_000, make_resource=lambda environ: Resource({}),
                           console=console or io.StringIO(), environ={}, app_sources=self.app_sources)

    def app_sources(self, _proc_root, _user_stacks, _lines) -> AppSources:
        ctx = SimpleNamespace(attributes={"service.name": "shop"}, key_map=("http.route",))
        return AppSources(lambda pid, _deadline=None: self.publishing.get(pid),
                          lambda pid: ctx if pid in self.publishing else None, thread_attributes)

    def live(self) -> list[FakeTracer]:
        return [t for t in self.tracers if t.state == "attached"]


# two probe sets: bpf_errors (stack mode) and prog_load (calls mode, success sampling {prob})
AGENT_CONFIG = """\
probe_sets:
  - name: bpf_errors
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
  - name: prog_load
    entry: [bpf_prog_load]
    allow: [bpf_check, "bpf_prog_alloc*"]
    mode: calls
    sampling: {{success_probability: {prob}}}
exporter:
  otlp: {{endpoint: "http://127.0.0.1:4318"}}
metrics:
  listen: "127.0.0.1:0"
logging:
  format: json
"""


def error_session(t: FakeTracer, tid: int = 7) -> list:
    """__x64_sys_bpf -> array_map_alloc_check failing with -EINVAL (stack mode: end record only)."""
    ids = [t.fid("__x64_sys_bpf"), t.fid("array_map_alloc_check")]
    res = [(1 << 64) - 22] * 2
    lat = [5000, 1000]
    pad = [0] * (_M - 2)
    return [SessionStartRec(tid, tid, 0, 100, "python", "python"),
            SessionEndRec(tid, tid, 0, 100, 5100, 0, 0, 0, True, 2, 0, 0, "python", "python",
                          tuple(ids + pad), tuple(res + pad), tuple(lat + pad), ())]


def success_calls_session(t: FakeTracer, tid: int = 8) -> list:
    """bpf_prog_load -> bpf_prog_alloc, bpf_check (calls mode), returning 5 (a new fd); kept by the kernel
    side's sampler as the real one keeps successes at probability 1 (dropped when successes are not wanted)."""
    kept = records.SAMPLED_PROBABILITY if t.cfg.capture_success and not t.cfg.success_threshold else 0
    load, alloc, chk = t.fid("bpf_prog_load"), t.fid("bpf_prog_alloc"), t.fid("bpf_check")
    pad = [0] * (_M - 1)
    return [SessionStartRec(tid, tid, 0, 1000, "python", "python"),
            FuncTraceRec(False, tid, 1000, 0, 0, load, 0, 0),
            FuncTraceRec(False, tid, 1100, 1, 1, alloc, 0, 0),
            FuncTraceRec(True, tid, 1200, 2, 1, alloc, 100, 0xffff888000001000),
            FuncTraceRec(False, tid, 1300, 3, 1, chk, 0, 0),
            FuncTraceRec(True, tid, 1900, 4, 1, chk, 600, 0),
            FuncTraceRec(True, tid, 2000, 5, 0, load, 1000, 5),
            SessionEndRec(tid, tid, 0, 1000, 2000, 0, 6, 0, False, 1, 0, 0, "python", "python",
                          tuple([load] + pad), tuple([5] + pad), tuple([1000] + pad), (), kept, 0x123456 * kept)]


def by_set(world: World, name: str) -> FakeTracer:
    """The live tracer that traces `name`."""
    return next(t for t in world.live() if name in {f.name for f in t.funcs})


def log_events(buf: io.StringIO) -> list[dict]:
    """The JSON log lines written to `buf`."""
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def wait_exported(world: World, n: int, timeout: float = 5.0) -> list:
    """The spans exported so far, once there are `n` (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while len(world.exported) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return world.exported


def probe_set_config(**kw) -> ProbeSetConfig:
    """A probe set named x with entry f, and `kw`."""
    return ProbeSetConfig(name="x", entry=("f",), **kw)


# ---- sessions with a known call tree -------------------------------------------------------------

OFFSET = 1_700_000_000_000_000_000
EINVAL = (1 << 64) - 22
KPTR = 0xFFFF888812345678
TREE_FUNCS = {
    0: TracedFunc(0, "__x64_sys_bpf", 0xFFFFFFFF81000000, RetKind.SIGNED, True),
    1: TracedFunc(1, "map_create", 0xFFFFFFFF81000100, RetKind.INT32, False),
    2: TracedFunc(2, "kmalloc_trace", 0xFFFFFFFF81000200, RetKind.POINTER, False),
    3: TracedFunc(3, "security_bpf", 0xFFFFFFFF81000300, RetKind.INT32, False),
    4: TracedFunc(4, "bpf_map_free", 0xFFFFFFFF81000400, RetKind.VOID, False),
    5: TracedFunc(5, "capable", 0xFFFFFFFF81000500, RetKind.BOOL, False),
}


def tree_session(**kw):
    """sys_bpf -> [security_bpf=0, map_create=-EINVAL -> [kmalloc_trace=ptr, capable=true, bpf_map_free (no exit)]]"""
    free = Call(4, 2, 4_000, None, None)
    create = Call(1, 1, 2_000, 8_000, EINVAL, children=[
        Call(2, 2, 2_100, 2_300, KPTR), Call(5, 2, 2_400, 2_500, 1, missing_before=2), free])
    root = Call(0, 0, 1_000, 9_000, EINVAL, children=[Call(3, 1, 1_100, 1_200, 0), create])
    defaults = dict(tid=42, pid=40, comm="worker", proc_comm="bpftool", start_ns=1_000, end_ns=9_000, is_err=True,
                    chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 6_000)],
                    kstack=[0xFFFFFFFF81000105, 0xFFFFFFFF81000010], calls=[root])
    defaults.update(kw)
    return Session(**defaults)


def dwarf_locate(addr):
    """DWARF stand-in: map_create is defined in kernel/bpf/syscall.c; the others have no location."""
    return ("kernel/bpf/syscall.c", 1105) if addr == TREE_FUNCS[1].addr else None


def symbolize(addr):
    """A kernel symbolizer stand-in: every address a symbol of its own."""
    return f"sym_{addr & 0xFFF:x}+0x5"


APP_TRACE, APP_SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7


def app_session(**app):
    """tree_session() run under an application's span (its thread context: `app` over a sampled, valid one)."""
    ctx = AppContext(**{"status": "ok", "trace_id": APP_TRACE, "span_id": APP_SPAN, "trace_flags": 1, **app})
    return tree_session(app=ctx)


# ---- last branch records of Debian's 6.1.192 kernel (tests/fixtures/lbr_61) ----------------------

LBR_ROOT = Path(__file__).resolve().parent / "fixtures" / "lbr_61"
AMAC = 0xffffffff812363b0  # array_map_alloc_check in Debian's 6.1.192 (System.map)
AMAC_SIZE = 0xffffffff81236470 - AMAC
_SYS_BPF = 0xffffffff8120ec70
_TRAMP = 0xffffffff80f00000  # below _stext, no symbol: printed as an address


# newest first, as bpf_get_branch_snapshot returns them
LBR_RECORDS = [
    Branch(0xffffffff811f2e80 + 0x20, 0xffffffff811f5930 + 0x59),  # trace_call_bpf -> kprobe_perf_func: wasted
    Branch(0xffffffff811f5930 + 0x67, 0xffffffff811f2e80),  # kprobe_perf_func -> trace_call_bpf: wasted
    Branch(AMAC + 0x74, _TRAMP),  # return from the deepest traced function: the cut
    Branch(AMAC + 0x1d, AMAC + 0x6f),  # the jump to `return -EINVAL`
    Branch(0xffffffff8144d5a0 + 0x3e, _SYS_BPF + 0xe5),  # security_bpf returns
    Branch(0xffffffff8153daa0 + 0x2f, _SYS_BPF + 0xcc),  # _copy_from_user returns
]


# ---- a host: cgroupfs and /proc of containers and processes --------------------------------------

CID = "3a8f1c4b2d9e7f6051a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8"
CID2 = "e4b0f6b9d3c1a2f8e7d6c5b4a3928170f6e5d4c3b2a19080f7e6d5c4b3a29180"
UID = "6f1b6c5e-2a4d-4a8e-9c3b-0f2e1d4c5b6a"
POD = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
APP = f"{POD}/cri-containerd-{CID}.scope"
PODMAN = f"machine.slice/libpod-{CID2}.scope/container"
V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def fake_host(tmp_path: Path, mountinfo: str = V2_MOUNTINFO, mount: str = "sys/fs/cgroup") -> Path:
    """A root with a cgroup2 mount (mountinfo) holding the APP and PODMAN containers and a system service."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    for rel in (APP, PODMAN, "system.slice/sshd.service"):
        (tmp_path / mount / rel).mkdir(parents=True)
    return tmp_path


def cgroup_id(root: Path, rel: str, mount: str = "sys/fs/cgroup") -> int:
    """The cgroup's id, as cgroup v2 numbers them: its directory's inode number."""
    return os.stat(root / mount / rel).st_ino


def fake_process(root: Path, pid: int, cgroup: str, exe: str | None, start: int = 4242, comm: str = "app") -> None:
    """/proc/PID of a process in `cgroup` (/proc/PID/cgroup's text) running `exe` (None: exe unreadable)."""
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(f"{pid} ({comm} (x) y) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 1 2\n")
    if (d / "exe").is_symlink():
        (d / "exe").unlink()
    if exe is not None:
        (d / "exe").symlink_to(exe)


# ---- the metrics port's web config (with tests/tls_certs.py's certificates) ----------------------

BCRYPT_COST = 4  # the cheapest bcrypt cost: the tests check behaviour, not bcrypt's speed
PASSWORD_HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(BCRYPT_COST)).decode()
WEB_TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
WEB_USERS = f"basic_auth_users:\n  alice: '{PASSWORD_HASH}'\n"

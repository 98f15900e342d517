"""Typed records passed between capture, assembly and the sinks (text, OTLP, Prometheus).

Everything here is plain data: the kernel-facing code produces it, pure functions consume it,
and unit tests build it by hand from recorded values. Immutable records are NamedTuples; the two that
are built up while a session is decoded (Call, Session) are plain slotted classes. Nothing on the start
path uses dataclasses: its import (with inspect, ast, dis and tokenize) was 0.5 s of an emulated start.
"""

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from retsnoop_otel.capture.errnos import MAX_ERRNO, errno_name

if TYPE_CHECKING:
    from retsnoop_otel.capture.inject import ProbeHit


class RetKind(enum.Enum):
    """How a function's return value is read, derived from its BTF return type."""

    VOID = "void"
    BOOL = "bool"
    UNSIGNED = "unsigned"  # unsigned or narrower than 32 bits: never an error
    INT32 = "int32"  # 32-bit signed: sign-extend before checking the errno range
    SIGNED = "signed"  # 64-bit signed (long, ssize_t, ...)
    POINTER = "pointer"  # NULL and ERR_PTR values are errors
    UNKNOWN = "unknown"  # no BTF: treated like INT32, as retsnoop does
    # user-space functions: the error rule their user gave (ints read from the low 32 bits)
    NEG = "neg"  # any negative int fails
    ZERO = "zero"  # int 0 fails
    NULL = "null"  # a NULL pointer fails


# Numeric codes shared with bpf/retsnoop.h (func_info.ret_kind); keep in sync.
RET_KIND_CODES: dict[RetKind, int] = {
    RetKind.VOID: 0,
    RetKind.BOOL: 1,
    RetKind.UNSIGNED: 2,
    RetKind.INT32: 3,
    RetKind.SIGNED: 4,
    RetKind.POINTER: 5,
    RetKind.UNKNOWN: 6,
    RetKind.NEG: 7,
    RetKind.ZERO: 8,
    RetKind.NULL: 9,
}
_LOW32 = (RetKind.INT32, RetKind.UNKNOWN, RetKind.NEG, RetKind.ZERO)


def signed_value(raw: int, kind: RetKind) -> int:
    """Interpret a raw 64-bit register value as the function's return type would."""
    raw &= (1 << 64) - 1
    if kind in _LOW32:
        low = raw & 0xFFFFFFFF
        return low - (1 << 32) if low & 0x80000000 else low
    if kind is RetKind.BOOL:
        return raw & 0xFF
    if kind in (RetKind.POINTER, RetKind.UNSIGNED, RetKind.NULL):
        return raw
    return raw - (1 << 64) if raw & (1 << 63) else raw


def is_failure(raw: int, kind: RetKind) -> bool:
    """retsnoop's error rule: NULL/ERR_PTR pointers and -MAX_ERRNO..-1 for signed ints."""
    if kind in (RetKind.VOID, RetKind.BOOL, RetKind.UNSIGNED):
        return False
    value = signed_value(raw, kind)
    if kind is RetKind.POINTER:
        return value == 0 or value >= (1 << 64) - MAX_ERRNO
    if kind is RetKind.NEG:
        return value < 0
    if kind in (RetKind.ZERO, RetKind.NULL):
        return value == 0
    return -MAX_ERRNO <= value <= -1


def error_type(raw: int, kind: RetKind) -> str | None:
    """OTel error.type for a failing return ('EINVAL', 'NULL', 'E1234'), else None."""
    if not is_failure(raw, kind):
        return None
    value = signed_value(raw, kind)
    if kind is RetKind.NULL or (kind is RetKind.POINTER and value == 0):
        return "NULL"
    if kind is RetKind.ZERO:
        return "0"
    if kind is RetKind.POINTER:
        value -= 1 << 64
    if kind is RetKind.NEG and value < -MAX_ERRNO:
        return str(value)
    return errno_name(-value) or f"E{-value}"


def format_result(raw: int | None, kind: RetKind) -> str:
    """The bracketed result column of retsnoop's output, without the brackets."""
    if raw is None:
        return "..."
    if kind is RetKind.VOID:
        return "void"
    if kind is RetKind.BOOL:
        return "true" if raw & 0xFF else "false"
    value = signed_value(raw, kind)
    if kind is RetKind.NULL:
        return "NULL" if value == 0 else f"0x{value:x}"
    if kind is RetKind.POINTER:
        if value == 0:
            return "NULL"
        if value >= (1 << 64) - MAX_ERRNO:
            num = (1 << 64) - value
            name = errno_name(num)
            return f"-{name}" if name else f"-{num}"
        return f"0x{value:x}"
    if -MAX_ERRNO <= value <= -1 and kind is not RetKind.UNSIGNED:
        name = errno_name(-value)
        return f"-{name}" if name else str(value)
    if -(1 << 30) <= value <= (1 << 20):
        return str(value)
    return f"0x{value & ((1 << 64) - 1):x}"


class TracedFunc(NamedTuple):
    """One attached function instance; `id` is what the kernel records carry.

    A user-space function (`binary` set) has its ELF virtual address in `addr`, the file offset its uprobe
    is attached at in `offset`, and "file:line" from DWARF in `source` when the binary has it."""

    id: int
    name: str
    addr: int
    ret: RetKind
    is_entry: bool
    module: str | None = None
    size: int = 0
    binary: str | None = None
    offset: int = 0
    source: str | None = None

    @property
    def label(self) -> str:
        """The name people read: a user-space function's says its binary ('handle_request [app]')."""
        return self.name if self.binary is None else f"{self.name} [{self.binary.rsplit('/', 1)[-1]}]"


FuncTable = Mapping[int, TracedFunc] | Sequence[TracedFunc]


def lookup_func(funcs: FuncTable, func_id: int) -> TracedFunc:
    """The traced function of an id, or a placeholder named after the id (a record of another table)."""
    try:
        return funcs[func_id]
    except (KeyError, IndexError):
        return TracedFunc(func_id, f"func#{func_id}", 0, RetKind.UNKNOWN, False)


class ArgValue(NamedTuple):
    """One captured argument: the register value and, for pointers and strings, the bytes behind it."""

    raw: int
    data: bytes | None = None


class Call:
    """One traced call inside a session, from the per-call (-T) records.

    Times are boot-clock nanoseconds as the kernel recorded them; `end_ns` and `result` are None
    when the exit record was lost or the session ended first.
    """

    __slots__ = ("func_id", "depth", "start_ns", "end_ns", "result", "seq", "children", "missing_before", "args",
                 "probes")

    def __init__(self, func_id: int, depth: int, start_ns: int, end_ns: int | None = None,
                 result: int | None = None, seq: int = 0, children: list["Call"] | None = None,
                 missing_before: int = 0, args: tuple[ArgValue, ...] | None = None) -> None:
        self.func_id = func_id
        self.depth = depth
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.result = result
        self.seq = seq
        self.children: list[Call] = [] if children is None else children
        self.missing_before = missing_before  # records lost right before this call (sequence gap)
        self.args = args  # -A: captured at entry
        self.probes: list[ProbeHit] = []  # injected probes (-J) that fired with this call innermost

    @property
    def duration_ns(self) -> int | None:
        return None if self.end_ns is None else self.end_ns - self.start_ns


class Branch(NamedTuple):
    """One last-branch record: a taken branch from `src` to `dst` (kernel addresses)."""

    src: int
    dst: int


class LbrCapture(NamedTuple):
    """The CPU's last-branch stack, snapshotted at the exit of the function where the session's
    deepest chain starts (the deepest failing return, or with -S the deepest return)."""

    func_id: int
    depth: int  # call depth of that function in the session (0 = the entry function)
    exit_ns: int  # boot clock: when that function returned
    branches: tuple[Branch, ...]  # newest first, as captured
    error: int = 0  # positive errno when the snapshot failed (ENOENT: no LBR on this CPU)


APP_STATUSES = ("ok", "no_record", "invalid", "fault")


class AppContext(NamedTuple):
    """The application's OpenTelemetry context on the thread when the session started (OTEP 4947 record).

    `status`: ok (a valid record), no_record (the thread had none), invalid (its valid byte was not 1)
    or fault (the read of user memory failed, `error` says why).
    """

    status: str
    trace_id: int = 0
    span_id: int = 0
    trace_flags: int = 0
    attrs: bytes = b""  # attrs-data as read; decoded with the process context's key map
    attrs_cut: bool = False  # the record held more attribute bytes than the kernel side keeps
    error: int = 0
    # filled in user space from the process context (OTEP 4719), while the process is known:
    attributes: tuple[tuple[str, str], ...] = ()  # the record's attributes, keys named by the key map
    service_name: str = ""  # the application's service.name
    service_namespace: str = ""  # its service.namespace, when its process context has one
    service_instance_id: str = ""  # its service.instance.id, when its process context has one

    @property
    def sampled(self) -> bool:
        return bool(self.trace_flags & 0x01)

    @property
    def usable(self) -> bool:
        """A valid record naming a span: something the kernel spans can join or link to."""
        return self.status == "ok" and bool(self.trace_id) and bool(self.span_id)


class UserFrame(NamedTuple):
    """One symbolized user-space frame; inlined frames come before the frame of their caller."""

    addr: int
    function: str | None  # None when no symbol covers the address
    offset: int  # from the function's start
    module: str | None  # path of the ELF mapping it, as the process sees it; None when unmapped
    file: str | None = None  # DWARF source file, when the ELF (or its debug file) has DWARF
    line: int | None = None
    inlined: bool = False


class StackEntry(NamedTuple):
    """One level of the deepest (error) call chain kept by the kernel, outermost first."""

    func_id: int
    result: int
    latency_ns: int | None  # None: the function had not returned when the chain was taken


class Workload(NamedTuple):
    """Which container (and Kubernetes pod) a session's thread ran in; "" = not known.

    Plain data so that export and metrics use it without the workload package (which resolves it).
    """

    container_id: str = ""  # 64 hex digits, as the runtime names the container
    container_runtime: str = ""  # container.runtime.name: containerd, cri-o, docker, podman
    pod_uid: str = ""
    pod_name: str = ""
    namespace: str = ""
    container_name: str = ""
    # what the pod says of itself (workload/pod_fields.py), for the resource and the session's service.name
    annotated_service: str = ""  # pod annotation resource.opentelemetry.io/service.name
    app_name: str = ""  # pod label app.kubernetes.io/name (read only with kubernetes.well_known_labels)
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) from the pod's controller up: replicaset, deployment
    image_name: str = ""  # container.image.name: the reference without tag and digest
    image_tags: tuple[str, ...] = ()  # container.image.tags
    app_instance: str = ""  # pod label app.kubernetes.io/instance (read only with kubernetes.well_known_labels)
    annotated_namespace: str = ""  # pod annotation resource.opentelemetry.io/service.namespace
    annotated_instance: str = ""  # pod annotation resource.opentelemetry.io/service.instance.id

    def __bool__(self) -> bool:
        return bool(self.container_id or self.pod_uid)


NO_WORKLOAD = Workload()


class Session:
    """One entry-function invocation on one thread, as captured in the kernel."""

    __slots__ = ("tid", "pid", "comm", "proc_comm", "start_ns", "end_ns", "is_err", "chain", "kstack", "calls",
                 "dropped_records", "cpu", "cgroup_id", "calls_cut", "lbr", "app", "ustack", "ustack_error",
                 "user_frames", "ustack_unsymbolized", "sampling_threshold", "trace_randomness", "kernel_sampling",
                 "workload", "exe_name", "probes")

    def __init__(self, tid: int, pid: int, comm: str, proc_comm: str, start_ns: int, end_ns: int, is_err: bool,
                 chain: list[StackEntry], kstack: list[int], calls: list[Call] | None = None,
                 dropped_records: int = 0, cpu: int = 0, cgroup_id: int = 0, calls_cut: int = 0,
                 lbr: LbrCapture | None = None, app: AppContext | None = None, ustack: tuple[int, ...] | None = None,
                 ustack_error: int = 0, user_frames: tuple[UserFrame, ...] = (),
                 sampling_threshold: int | None = None, trace_randomness: int | None = None,
                 kernel_sampling: int = 0, workload: Workload | None = None, exe_name: str = "",
                 ustack_unsymbolized: str = "") -> None:
        self.tid = tid
        self.pid = pid
        self.comm = comm
        self.proc_comm = proc_comm
        self.start_ns = start_ns  # boot clock
        self.end_ns = end_ns  # boot clock
        self.is_err = is_err
        self.chain = chain
        self.kstack = kstack  # raw kernel addresses, innermost first, as bpf_get_stack returns them
        self.calls: list[Call] = [] if calls is None else calls  # top-level calls; empty unless recorded
        self.dropped_records = dropped_records
        self.cpu = cpu
        self.cgroup_id = cgroup_id
        self.calls_cut = calls_cut  # calls left out of `calls` by the per-session cap
        self.lbr = lbr  # --lbr
        self.app = app  # the application's OTel thread context, when its process publishes one
        self.ustack = ustack  # user stack at the session start (innermost first), when taken
        self.ustack_error = ustack_error  # positive errno when the user stack could not be taken
        self.user_frames = user_frames  # `ustack` symbolized in user space while the process lived
        # why `user_frames` hold only addresses (appctx/stacks.py): timeout, queue_full or error; "": symbolized
        self.ustack_unsymbolized = ustack_unsymbolized
        # how the session was kept (capture/sampling.py): the OTel rejection threshold (0: always kept; None:
        # no known probability) and the 56-bit randomness a probability decision compared with it
        self.sampling_threshold = sampling_threshold
        self.trace_randomness = trace_randomness
        # how the kernel side kept it (records.SAMPLED_*; 0: an error session, not sampled)
        self.kernel_sampling = kernel_sampling
        # filled in user space while the process lived (workload/resolver.py): its container and pod, and the
        # the executable's file name: read by the kernel as the session ended (REC_SESSION_END.exe), else the
        # basename of /proc/PID/exe ("": kernel thread or not readable; `proc_comm` is the 15-character fallback)
        self.workload = workload
        self.exe_name = exe_name
        self.probes: list = []  # capture.inject.ProbeHit: every injected probe (-J) that fired, in order

    @property
    def entry_func_id(self) -> int | None:
        if self.chain:
            return self.chain[0].func_id
        return self.calls[0].func_id if self.calls else None


class FuncStats(NamedTuple):
    """In-kernel aggregates for one traced function, summed over CPUs at read time."""

    func_id: int
    calls: int
    errors: dict[str, int]  # error.type -> count
    duration_buckets: tuple[int, ...]  # counts per log2(ns) bucket; bucket i holds [2^i, 2^(i+1)) ns
    duration_sum_ns: int


class SessionStats(NamedTuple):
    """In-kernel aggregates of whole sessions per entry function (every session, reported or not)."""

    entry_func_id: int
    sessions: int
    error_sessions: int
    duration_buckets: tuple[int, ...]  # log2(ns) buckets like FuncStats
    duration_sum_ns: int


class CaptureStats(NamedTuple):
    """Loss counters kept by the kernel side."""

    dropped_sessions: int = 0
    incomplete_sessions: int = 0
    dropped_records: int = 0
    sessions_started: int = 0
    sessions_reported: int = 0
    workload_dropped: int = 0  # counts not kept per workload (the kernel's per-cgroup map was full)
    sampled_out: int = 0  # successful sessions the sampler dropped in the kernel
    origins_dropped: int = 0  # failing sessions left out of the origin counts (the kernel's map was full)
    errors_sampled_out: int = 0  # failing sessions the error sampler dropped in the kernel (counted by origin)

    @classmethod
    def summed(cls, stats: Iterable["CaptureStats"]) -> "CaptureStats":
        """Several probe sets' counters as the run's."""
        return cls(*(sum(column) for column in zip(cls(), *stats, strict=True)))


class OriginCount(NamedTuple):
    """Failing sessions of one entry function whose error started in `origin_func_id` with `error`, counted in
    the kernel (every failing session, reported or not), summed over CPUs."""

    entry_func_id: int
    origin_func_id: int
    error: str  # error.type of what the origin returned ('EINVAL', 'NULL')
    count: int


class ProgramStats(NamedTuple):
    """Kernel-side cost of one of our BPF programs (per-function clones summed), from bpf_prog_info.

    The kernel only advances these while BPF statistics are enabled (kernel.bpf_stats_enabled).
    """

    name: str
    run_cnt: int
    run_time_ns: int


class WorkloadCount(NamedTuple):
    """One in-kernel count per workload (metrics workload label), summed over CPUs: the calls of a function
    (or the sessions of an entry function) with one outcome, by threads of one cgroup v2."""

    cgroup_id: int
    func_id: int
    session: bool  # whole sessions of the entry function `func_id`, not its calls
    error: str | None  # None: succeeded; else the error type ('EINVAL', 'NULL'; sessions: 'error')
    count: int

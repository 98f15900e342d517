"""Decoding of the ring-buffer records and map values defined in bpf/retsnoop.h.

The struct formats below mirror that header field by field. Tests compare their sizes with the
`_Static_assert`s of bpf/retsnoop.bpf.c, which the compiler checks against the header, and the
constants with the header's (tests/unit/test_records.py, test_lbr_capture.py), so that a change on
one side cannot go unnoticed.
"""

import struct
from typing import NamedTuple

from retsnoop_otel.capture.model import CaptureStats

MAX_FSTACK_DEPTH = 64
MAX_KSTACK_DEPTH = 64
DUR_BUCKETS = 40

REC_SESSION_START = 1
REC_FUNC_ENTRY = 2
REC_FUNC_EXIT = 3
REC_SESSION_END = 4
REC_FUNC_ARGS = 5
REC_SESSION_LBR = 6
REC_SESSION_APP = 7
REC_SESSION_USTACK = 8
REC_APP_PROBE = 9
REC_FUNC_BATCH = 10
REC_APP_EXEC = 11
REC_INJECT_PROBE = 12
REC_APP_PUBLISH = 13
MAX_INJECT_DATA = 256
CALL_BUF_RECS = 64
SAMPLED_PROBABILITY = 0x1
SAMPLED_RATE = 0x2
MAX_LBR_ENTRIES = 32
MAX_FUNC_ARGS = 6
MAX_ARG_DATA = 256
ARG_KIND_SHIFT = 12
ARG_RAW, ARG_PTR, ARG_STR = 1, 2, 3

APP_CTX_HEAD = 28
MAX_APP_ATTRS = 612
MAX_USTACK_DEPTH = 64
APP_TLS_NONE = 0x1
APP_OK, APP_NO_RECORD, APP_INVALID, APP_FAULT = 0, 1, 2, 3

FUNC_IS_ENTRY = 0x1
FUNC_IS_USER = 0x2  # a user-space function: no kernel stack at its error
FUNC_RET_KIND_SHIFT = 8

SESSION_START = struct.Struct("<IIIIQ16s16s")
FUNC_TRACE = struct.Struct("<IIQIHHQq")
SESSION_END = struct.Struct(f"<IIIIQQQQIIBB2xiii16s16s64s{MAX_FSTACK_DEPTH}H{MAX_FSTACK_DEPTH}q"
                            f"{MAX_FSTACK_DEPTH}Q{MAX_KSTACK_DEPTH}Q")
FUNC_INFO = struct.Struct("<QII")
FUNC_STATS = struct.Struct(f"<QQQ{DUR_BUCKETS}Q")
ERR_KEY = struct.Struct("<II")
CAPTURE_STATS = struct.Struct("<QQQQQQQQQ")
ORIGIN_KEY = struct.Struct("<III4x")  # entry_id, origin_id, err (map origin_stats)
FUNC_BATCH_HEAD = struct.Struct("<IIQI4x")  # type, tid, start_ts, cnt; cnt FUNC_TRACE records follow
FUNC_BATCH_SIZE = FUNC_BATCH_HEAD.size + CALL_BUF_RECS * FUNC_TRACE.size
WL_KEY = struct.Struct("<QII")  # cgroup_id, func_id (| WL_SESSION), outcome (map wl_stats)
WL_SESSION = 0x80000000
FUNC_ARGS_HEAD = struct.Struct(f"<IIIHH{MAX_FUNC_ARGS}Q{MAX_FUNC_ARGS}h2x2x")
FUNC_ARGS_SIZE = FUNC_ARGS_HEAD.size + MAX_FUNC_ARGS * MAX_ARG_DATA
ARG_SPEC = struct.Struct(f"<{MAX_FUNC_ARGS}H2x2x")
LBR_ENTRY = struct.Struct("<QQQ")  # from, to, flags (struct perf_branch_entry)
LBR_CAPTURE_HEAD = struct.Struct("<QiHH")  # ts, sz, func_id, depth; MAX_LBR_ENTRIES entries follow
LBR_CAPTURE_SIZE = LBR_CAPTURE_HEAD.size + MAX_LBR_ENTRIES * LBR_ENTRY.size
SESSION_LBR_HEAD = struct.Struct("<IIQ")  # type, tid, start_ts; an lbr_capture follows
SESSION_LBR_SIZE = SESSION_LBR_HEAD.size + LBR_CAPTURE_SIZE
APP_TLS = struct.Struct("<qQII")  # tp_offset, offset, modid, flags (map app_targets)
SESSION_APP_HEAD = struct.Struct("<IIQii16s8sBBH")  # type, tid, start_ts, status, err, then the record's head
SESSION_APP_SIZE = SESSION_APP_HEAD.size + MAX_APP_ATTRS
SESSION_USTACK = struct.Struct(f"<IIQi4x{MAX_USTACK_DEPTH}Q")
APP_PROBE = struct.Struct("<II")  # also REC_APP_EXEC's and REC_APP_PUBLISH's
INJECT_PROBE = struct.Struct(f"<IIQIHHQi4x{MAX_INJECT_DATA}s")  # struct rec_inject_probe


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


class ArgSizes(NamedTuple):
    """-A: bytes of argument data to capture (retsnoop's args.max-*-size keys). The kernel side copies at most
    MAX_ARG_DATA bytes per argument: larger values are accepted and capped there."""

    total: int = 3072  # per call, over all arguments (the first arguments are served first)
    sized: int = 256  # behind a pointer to a struct or union
    string: int = 256  # of a char string


DEFAULT_ARG_SIZES = ArgSizes()


class SessionStartRec(NamedTuple):
    tid: int
    tgid: int
    cpu: int
    start_ts: int
    comm: str
    proc_comm: str


class FuncTraceRec(NamedTuple):
    is_exit: bool
    tid: int
    ts: int
    seq: int
    depth: int
    func_id: int
    lat: int
    res: int


class SessionEndRec(NamedTuple):
    tid: int
    tgid: int
    cpu: int
    start_ts: int
    end_ts: int
    cgroup_id: int
    last_seq: int
    dropped_records: int
    is_err: bool
    chain_depth: int
    chain_top: int
    kstack_sz: int
    comm: str
    proc_comm: str
    chain_ids: tuple[int, ...]
    chain_res: tuple[int, ...]
    chain_lat: tuple[int, ...]
    kstack: tuple[int, ...]
    sampling: int = 0  # how the kernel kept it: SAMPLED_PROBABILITY or SAMPLED_RATE (0: an error, not sampled)
    randomness: int = 0  # SAMPLED_PROBABILITY: the 56-bit value compared with the threshold
    exe: str = ""  # the executable's file name, read by the kernel as the session ended


class FuncBatchRec(NamedTuple):
    """The per-call records a reported session held in the kernel until its end, in order."""

    tid: int
    start_ts: int
    recs: tuple[FuncTraceRec, ...]


class FuncArgsRec(NamedTuple):
    tid: int
    seq: int
    func_id: int
    depth: int
    args: tuple[int, ...]
    data: tuple[bytes | None, ...]  # pointed-to bytes / string per argument, None when not captured


class SessionLbrRec(NamedTuple):
    """Branch records a session kept (--lbr): sent right before its SessionEndRec."""

    tid: int
    start_ts: int
    ts: int  # exit time of the function whose exit took the snapshot
    func_id: int
    depth: int
    error: int  # 0, or the positive errno bpf_get_branch_snapshot failed with (ENOENT: no LBR)
    branches: tuple[tuple[int, int], ...]  # (from, to), newest first, as the CPU keeps them


class SessionAppRec(NamedTuple):
    """The application's OTel thread context read when the session started: sent before its SessionEndRec."""

    tid: int
    start_ts: int
    status: int  # APP_OK, APP_NO_RECORD, APP_INVALID or APP_FAULT
    error: int  # APP_FAULT: the positive errno of the failed read of user memory
    trace_id: bytes
    span_id: bytes
    valid: int
    trace_flags: int
    attrs_size: int  # as the record says (more than MAX_APP_ATTRS: cut)
    attrs: bytes


class SessionUstackRec(NamedTuple):
    """The user stack taken when the session started: sent before its SessionEndRec."""

    tid: int
    start_ts: int
    error: int  # positive errno when bpf_get_stack failed
    ips: tuple[int, ...]  # return addresses, innermost first


class AppProbeRec(NamedTuple):
    """A session started in a process whose thread context user space has not looked for yet."""

    tgid: int


class AppExecRec(NamedTuple):
    """A process exec'd (a new image, its libraries not loaded yet), where thread context is read."""

    tgid: int


class AppPublishRec(NamedTuple):
    """A process created its OTEL_CTX process context: its thread-context publisher is loaded."""

    tgid: int


APP_RECORDS = (AppProbeRec, AppExecRec, AppPublishRec)  # for the process watcher (appctx/watch.py), not sessions
AppRecord = AppProbeRec | AppExecRec | AppPublishRec


class InjectProbeRec(NamedTuple):
    """An injected probe (-J) fired inside the thread's session: in the per-call stream, with its own seq."""

    tid: int
    ts: int
    seq: int
    depth: int  # the level a call made there would have
    probe_id: int
    value: int  # kprobe: the instruction pointer; kretprobe: the return value
    data: bytes  # the payload copied (a tracepoint's raw entry, a raw tracepoint's args); b"" when none or failed


Record = (SessionStartRec | FuncTraceRec | SessionEndRec | FuncArgsRec | SessionLbrRec | SessionAppRec
          | SessionUstackRec | AppProbeRec | AppExecRec | AppPublishRec | FuncBatchRec | InjectProbeRec)


def decode_lbr_capture(data: bytes, offset: int = 0) -> tuple[int, int, int, int, tuple[tuple[int, int], ...]]:
    """(ts, func_id, depth, error, branches) of a struct lbr_capture."""
    ts, sz, func_id, depth = LBR_CAPTURE_HEAD.unpack_from(data, offset)
    if sz < 0:
        return ts, func_id, depth, -sz, ()
    n = min(sz // LBR_ENTRY.size, MAX_LBR_ENTRIES)
    base = offset + LBR_CAPTURE_HEAD.size
    branches = tuple(LBR_ENTRY.unpack_from(data, base + i * LBR_ENTRY.size)[:2] for i in range(n))
    return ts, func_id, depth, 0, branches


def decode(data: bytes) -> Record:
    """Decode one ring-buffer record; ValueError on an unknown type or a short LBR or application record."""
    rtype = int.from_bytes(data[:4], "little")
    if rtype in (REC_FUNC_ENTRY, REC_FUNC_EXIT):
        _, tid, ts, seq, depth, fid, lat, res = FUNC_TRACE.unpack_from(data)
        return FuncTraceRec(rtype == REC_FUNC_EXIT, tid, ts, seq, depth, fid, lat, res)
    if rtype == REC_FUNC_ARGS:
        v = FUNC_ARGS_HEAD.unpack_from(data)
        n = MAX_FUNC_ARGS
        lens = v[5 + n:5 + 2 * n]
        base = FUNC_ARGS_HEAD.size
        blobs = tuple(data[base + i * MAX_ARG_DATA:base + i * MAX_ARG_DATA + ln] if ln > 0 else None
                      for i, ln in enumerate(lens))
        return FuncArgsRec(v[1], v[2], v[3], v[4], tuple(v[5:5 + n]), blobs)
    if rtype == REC_SESSION_LBR:
        if len(data) < SESSION_LBR_SIZE:
            raise ValueError(f"short LBR record ({len(data)} bytes)")
        _, tid, start_ts = SESSION_LBR_HEAD.unpack_from(data)
        ts, func_id, depth, error, branches = decode_lbr_capture(data, SESSION_LBR_HEAD.size)
        return SessionLbrRec(tid, start_ts, ts, func_id, depth, error, branches)
    if rtype == REC_SESSION_APP:
        if len(data) < SESSION_APP_SIZE:
            raise ValueError(f"short application context record ({len(data)} bytes)")
        _, tid, start_ts, status, err, trace_id, span_id, valid, flags, size = SESSION_APP_HEAD.unpack_from(data)
        attrs = data[SESSION_APP_HEAD.size:SESSION_APP_HEAD.size + min(size, MAX_APP_ATTRS)] if status == APP_OK \
            else b""
        return SessionAppRec(tid, start_ts, status, -err if err < 0 else 0, trace_id, span_id, valid, flags, size,
                             attrs)
    if rtype == REC_SESSION_USTACK:
        v = SESSION_USTACK.unpack_from(data)
        sz = v[3]
        return SessionUstackRec(v[1], v[2], -sz if sz < 0 else 0, tuple(v[4:4 + max(0, sz) // 8]))
    if rtype == REC_APP_PROBE:
        return AppProbeRec(APP_PROBE.unpack_from(data)[1])
    if rtype == REC_APP_EXEC:
        return AppExecRec(APP_PROBE.unpack_from(data)[1])
    if rtype == REC_APP_PUBLISH:
        return AppPublishRec(APP_PROBE.unpack_from(data)[1])
    if rtype == REC_INJECT_PROBE:
        _, tid, ts, seq, depth, probe_id, value, data_len, data = INJECT_PROBE.unpack_from(data)
        return InjectProbeRec(tid, ts, seq, depth, probe_id, value, data[:max(0, min(data_len, MAX_INJECT_DATA))])
    if rtype == REC_SESSION_START:
        _, tid, tgid, cpu, ts, comm, pcomm = SESSION_START.unpack_from(data)
        return SessionStartRec(tid, tgid, cpu, ts, _comm(comm), _comm(pcomm))
    if rtype == REC_FUNC_BATCH:
        _, tid, start_ts, cnt = FUNC_BATCH_HEAD.unpack_from(data)
        cnt = min(cnt, CALL_BUF_RECS, (len(data) - FUNC_BATCH_HEAD.size) // FUNC_TRACE.size)
        recs = [FUNC_TRACE.unpack_from(data, FUNC_BATCH_HEAD.size + i * FUNC_TRACE.size) for i in range(cnt)]
        return FuncBatchRec(tid, start_ts, tuple(FuncTraceRec(t == REC_FUNC_EXIT, *rest) for t, *rest in recs))
    if rtype == REC_SESSION_END:
        v = SESSION_END.unpack_from(data)
        m = MAX_FSTACK_DEPTH
        base = 18  # first array element, after the 18 scalar fields
        kstack_sz = v[14]
        kstack = v[base + 3 * m:base + 3 * m + max(0, kstack_sz) // 8]
        return SessionEndRec(
            tid=v[1], tgid=v[2], cpu=v[3], start_ts=v[4], end_ts=v[5], cgroup_id=v[6], randomness=v[7],
            last_seq=v[8], dropped_records=v[9], is_err=bool(v[10]), sampling=v[11], chain_depth=v[12],
            chain_top=v[13], kstack_sz=kstack_sz, comm=_comm(v[15]), proc_comm=_comm(v[16]),
            exe=_comm(v[17]),
            chain_ids=v[base:base + m], chain_res=v[base + m:base + 2 * m], chain_lat=v[base + 2 * m:base + 3 * m],
            kstack=kstack)
    raise ValueError(f"unknown record type {rtype} ({len(data)} bytes)")


def decode_func_stats(raw: bytes, ncpus: int) -> tuple[int, int, int, list[int]]:
    """Sum a per-CPU func_stats value: (calls, errors, dur_sum_ns, buckets)."""
    calls = errors = dur = 0
    buckets = [0] * DUR_BUCKETS
    size = FUNC_STATS.size
    for cpu in range(ncpus):
        v = FUNC_STATS.unpack_from(raw, cpu * size)
        calls += v[0]
        errors += v[1]
        dur += v[2]
        for i, n in enumerate(v[3:]):
            buckets[i] += n
    return calls, errors, dur, buckets


def decode_capture_stats(raw: bytes, ncpus: int) -> CaptureStats:
    tot = [0] * len(CAPTURE_STATS.format.strip("<"))
    for cpu in range(ncpus):
        for i, n in enumerate(CAPTURE_STATS.unpack_from(raw, cpu * CAPTURE_STATS.size)):
            tot[i] += n
    return CaptureStats(*tot)

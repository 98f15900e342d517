"""Assembly of decoded records into Session objects (pure logic, driven by recorded data in tests)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from retsnoop_otel.capture.inject import ProbeHit, ProbeInfo, decode_payload
from retsnoop_otel.capture.model import (
    APP_STATUSES,
    AppContext,
    ArgValue,
    Branch,
    Call,
    LbrCapture,
    Session,
    StackEntry,
)
from retsnoop_otel.capture.records import (
    APP_RECORDS,
    MAX_APP_ATTRS,
    SAMPLED_PROBABILITY,
    FuncArgsRec,
    FuncBatchRec,
    FuncTraceRec,
    InjectProbeRec,
    Record,
    SessionAppRec,
    SessionEndRec,
    SessionLbrRec,
    SessionStartRec,
    SessionUstackRec,
)

_SideRec = SessionLbrRec | SessionAppRec | SessionUstackRec

# Calls kept per session: a verifier run can make hundreds of thousands of traced calls, and each
# kept Call costs memory until the session is printed or exported. The rest are counted (calls_cut).
DEFAULT_MAX_CALLS = 20_000


class _CallTree:
    """Per-thread builder of the call tree from entry/exit records, with gap detection."""

    __slots__ = ("start", "max_calls", "roots", "stack", "next_seq", "missing", "pending_gap", "calls", "cut",
                 "probes")

    def __init__(self, start: SessionStartRec, max_calls: int = 0) -> None:
        self.start = start
        self.max_calls = max_calls  # 0: unbounded
        self.roots: list[Call] = []
        self.stack: list[Call] = []
        self.next_seq = 0
        self.missing = 0
        self.pending_gap = 0
        self.calls = 0
        self.cut = 0  # calls left out once max_calls were kept
        self.probes: list[ProbeHit] = []

    def _step(self, seq: int) -> None:
        if seq != self.next_seq:
            gap = seq - self.next_seq
            self.missing += gap
            self.pending_gap += gap
        self.next_seq = seq + 1

    def feed_probe(self, hit: ProbeHit) -> None:
        """An injected probe goes with the innermost call open at its depth (the call it fired in)."""
        self._step(hit.seq)
        hit.missing_before, self.pending_gap = self.pending_gap, 0
        self.probes.append(hit)
        del self.stack[hit.depth:]
        if self.stack:
            self.stack[-1].probes.append(hit)
            hit.in_call = True

    def feed(self, rec: FuncTraceRec) -> None:
        self._step(rec.seq)
        if self.max_calls and self.calls >= self.max_calls:
            self._feed_over_cap(rec)
            return
        if not rec.is_exit:
            self.calls += 1
            call = Call(rec.func_id, rec.depth, rec.ts, seq=rec.seq, missing_before=self.pending_gap)
            self.pending_gap = 0
            # Lost records may leave stale frames: the record's depth says where this call really sits.
            del self.stack[rec.depth:]
            (self.stack[-1].children if self.stack else self.roots).append(call)
            self.stack.append(call)
            return
        del self.stack[rec.depth + 1:]
        if self.stack and len(self.stack) == rec.depth + 1 and self.stack[-1].func_id == rec.func_id:
            call = self.stack.pop()
        else:  # the entry record was lost: rebuild the call from the exit's latency
            call = Call(rec.func_id, rec.depth, rec.ts - rec.lat, seq=rec.seq,
                        missing_before=self.pending_gap)
            del self.stack[rec.depth:]
            (self.stack[-1].children if self.stack else self.roots).append(call)
        self.pending_gap = 0
        call.end_ns = rec.ts
        call.result = rec.res & 0xFFFFFFFFFFFFFFFF

    def _feed_over_cap(self, rec: FuncTraceRec) -> None:
        """Past the cap only the exits of calls already kept are applied; new calls are just counted."""
        if not rec.is_exit:
            self.cut += 1
            return
        if len(self.stack) > rec.depth and self.stack[rec.depth].func_id == rec.func_id:
            del self.stack[rec.depth + 1:]
            call = self.stack.pop()
            call.end_ns = rec.ts
            call.result = rec.res & 0xFFFFFFFFFFFFFFFF


class SessionAssembler:
    """Turns the record stream into complete Sessions; memory is bounded by `max_open` threads."""

    def __init__(self, max_open: int = 4096, max_calls: int = DEFAULT_MAX_CALLS,
                 probes: Mapping[int, ProbeInfo] | None = None) -> None:
        self._probes = probes or {}  # injected probes (-J) by id: how to decode their records
        self._open: OrderedDict[int, _CallTree] = OrderedDict()
        self._max_open = max_open
        self._max_calls = max_calls
        self.evicted = 0
        # LBR, application context and user stack records, by (type, tid), until their session's end
        self._side: OrderedDict[tuple[type, int], _SideRec] = OrderedDict()

    def feed(self, rec: Record) -> Session | None:
        if isinstance(rec, SessionLbrRec | SessionAppRec | SessionUstackRec):
            key = (type(rec), rec.tid)
            self._side.pop(key, None)
            self._side[key] = rec
            while len(self._side) > 3 * self._max_open:
                self._side.popitem(last=False)
            return None
        if isinstance(rec, APP_RECORDS):
            return None  # for the process watcher, not for sessions
        if isinstance(rec, FuncArgsRec):
            tree = self._open.get(rec.tid)
            if tree is not None and tree.stack and tree.stack[-1].seq == rec.seq:
                tree.stack[-1].args = tuple(ArgValue(a, d) for a, d in zip(rec.args, rec.data, strict=True))
            return None
        if isinstance(rec, FuncTraceRec):
            tree = self._open.get(rec.tid)
            if tree is not None:
                tree.feed(rec)
            return None
        if isinstance(rec, InjectProbeRec):
            tree = self._open.get(rec.tid)
            if tree is not None:
                tree.feed_probe(self._hit(rec))
            return None
        if isinstance(rec, FuncBatchRec):
            tree = self._open.get(rec.tid)
            if tree is not None and tree.start.start_ts == rec.start_ts:
                for one in rec.recs:
                    tree.feed(one)
            return None
        if isinstance(rec, SessionStartRec):
            # a session that was not reported leaves its tree behind: a new start replaces it
            self._open.pop(rec.tid, None)
            self._open[rec.tid] = _CallTree(rec, self._max_calls)
            while len(self._open) > self._max_open:
                self._open.popitem(last=False)
                self.evicted += 1
            return None
        return self._finish(rec)

    def _hit(self, rec: InjectProbeRec) -> ProbeHit:
        info = self._probes.get(rec.probe_id)
        if info is None:
            return ProbeHit(rec.probe_id, f"probe#{rec.probe_id}", "", rec.depth, rec.ts, rec.seq)
        return ProbeHit(rec.probe_id, info.spec.text, info.spec.kind, rec.depth, rec.ts, rec.seq,
                        decode_payload(info, rec.value, rec.data))

    def _finish(self, rec: SessionEndRec) -> Session:
        tree = self._open.pop(rec.tid, None)
        calls: list[Call] = []
        probes: list[ProbeHit] = []
        missing = cut = 0
        if tree is not None and tree.start.start_ts == rec.start_ts:
            calls, probes = tree.roots, tree.probes
            missing = tree.missing + max(0, rec.last_seq - tree.next_seq)
            cut = tree.cut
        lbr = app = ustack = None
        ustack_error = 0
        lrec = self._side_of(SessionLbrRec, rec)
        if isinstance(lrec, SessionLbrRec):
            lbr = LbrCapture(lrec.func_id, lrec.depth, lrec.ts, tuple(Branch(a, b) for a, b in lrec.branches),
                             lrec.error)
        arec = self._side_of(SessionAppRec, rec)
        if isinstance(arec, SessionAppRec):
            app = app_context(arec)
        urec = self._side_of(SessionUstackRec, rec)
        if isinstance(urec, SessionUstackRec):
            ustack, ustack_error = (None, urec.error) if urec.error else (urec.ips, 0)
        chain = []
        for level in range(rec.chain_depth):
            known = level >= rec.chain_top
            res = rec.chain_res[level] & 0xFFFFFFFFFFFFFFFF if known else 0
            chain.append(StackEntry(rec.chain_ids[level], res, rec.chain_lat[level] if known else None))
        session = Session(
            tid=rec.tid, pid=rec.tgid, comm=rec.comm, proc_comm=rec.proc_comm, exe_name=rec.exe, start_ns=rec.start_ts,
            end_ns=rec.end_ts, is_err=rec.is_err, chain=chain, kstack=list(rec.kstack), calls=calls,
            dropped_records=max(rec.dropped_records, missing), cpu=rec.cpu, cgroup_id=rec.cgroup_id,
            calls_cut=cut, lbr=lbr, app=app, ustack=ustack, ustack_error=ustack_error, kernel_sampling=rec.sampling,
            trace_randomness=rec.randomness if rec.sampling & SAMPLED_PROBABILITY else None)
        session.probes = probes
        return session

    def _side_of(self, kind: type, end: SessionEndRec) -> _SideRec | None:
        rec = self._side.pop((kind, end.tid), None)
        return rec if rec is not None and rec.start_ts == end.start_ts else None


def app_context(rec: SessionAppRec) -> AppContext:
    """The record as read by the kernel side; ids are big-endian bytes as W3C trace context writes them."""
    status = APP_STATUSES[rec.status] if 0 <= rec.status < len(APP_STATUSES) else "fault"
    if status != "ok":
        return AppContext(status, error=rec.error)
    return AppContext(status, int.from_bytes(rec.trace_id, "big"), int.from_bytes(rec.span_id, "big"),
                      rec.trace_flags, rec.attrs, rec.attrs_size > MAX_APP_ATTRS)

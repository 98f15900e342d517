"""Sessions as OpenTelemetry spans, and a non-blocking OTLP exporter for them.

Spans are built as SDK ReadableSpan objects directly: going through a Tracer costs tens of
microseconds per span, too much for sessions carrying thousands of calls. The SDK's OTLP exporters
(and their OTEL_EXPORTER_OTLP_* handling) still do the encoding and transport. otlp_fast goes
further and writes the same spans as protobuf bytes; OtlpTraceSink takes either form.

Timing of spans rebuilt from the error chain only (no per-call records): the kernel keeps each
level's latency but not its start time. An error travels upward as functions return, so each level
returns shortly before its caller does; such spans are therefore right-aligned with their parent's
end (start = parent end - latency, clamped to the parent's start) and marked
retsnoop.start_estimated=true. Durations are exact unless clamped.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from retsnoop_otel import __version__
from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.capture.model import Call, RetKind, Session, TracedFunc, error_type, format_result, signed_value
from retsnoop_otel.render.lbr import export_lbr

if TYPE_CHECKING:  # otlp_fast imports this module
    from retsnoop_otel.export.otlp_fast import EncodedTrace

log = logging.getLogger(__name__)

SCOPE = InstrumentationScope("retsnoop_otel", __version__)
DEFAULT_MAX_SPANS = 4096  # per trace; a session's deeper calls beyond this are counted, not sent
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)

FuncTable = Mapping[int, TracedFunc] | Sequence[TracedFunc]
Attrs = dict[str, Any]


def lookup_func(funcs: FuncTable, func_id: int) -> TracedFunc:
    try:
        return funcs[func_id]
    except (KeyError, IndexError):
        return TracedFunc(func_id, f"func#{func_id}", 0, RetKind.UNKNOWN, False)


def _int64(value: int) -> int:
    """OTLP integer attributes are int64: wrap unsigned 64-bit values the way C would."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value & (1 << 63) else value


Locate = Callable[[int], "tuple[str, int] | None"]  # function address -> (file, line) of its definition


def func_attrs(func: TracedFunc, locate: Locate | None = None) -> Attrs:
    """The attributes every span of `func` carries, whatever it returned (source location with DWARF)."""
    attrs: Attrs = {"code.function.name": func.name, "retsnoop.return_kind": func.ret.value}
    if locate is not None and func.addr:
        where = locate(func.addr)
        if where is not None:
            attrs["code.file.path"], attrs["code.line.number"] = where
    if func.module:
        attrs["retsnoop.module"] = func.module
    return attrs


def return_attrs(kind: RetKind, raw: int | None, export_addresses: bool) -> tuple[Attrs, Status]:
    """Attributes + status for a return of `raw` (None: the exit was not seen) from a `kind` function."""
    if raw is None:
        return {"retsnoop.incomplete": True}, _UNSET
    err = error_type(raw, kind)
    text = format_result(raw, kind)
    if kind is RetKind.POINTER and err is None and not export_addresses:
        # a valid kernel pointer reveals the KASLR offset: say only that it is valid
        return {"retsnoop.result": "non-NULL"}, _UNSET
    attrs: Attrs = {"retsnoop.result": text}
    if kind is not RetKind.VOID:
        attrs["retsnoop.return_value"] = _int64(signed_value(raw, kind))
    if err is None:
        return attrs, _UNSET
    attrs["error.type"] = err
    return attrs, Status(StatusCode.ERROR, text)


def result_attrs(func: TracedFunc, raw: int | None, export_addresses: bool,
                 locate: Locate | None = None) -> tuple[Attrs, Status]:
    """Attributes + status of one call of `func` that returned `raw` (None: the exit was not seen)."""
    attrs, status = return_attrs(func.ret, raw, export_addresses)
    return {**func_attrs(func, locate), **attrs}, status


class _ResultAttrs:
    """`result_attrs` per (function, raw result), cached: hot functions repeat the same results."""

    def __init__(self, funcs: FuncTable, export_addresses: bool, locate: Locate | None = None) -> None:
        self._funcs = funcs
        self._export_addresses = export_addresses
        self._locate = locate
        self._cache: dict[tuple[int, int | None], tuple[Attrs, Status]] = {}

    def get(self, func_id: int, raw: int | None) -> tuple[Attrs, Status]:
        key = (func_id, raw)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = result_attrs(lookup_func(self._funcs, func_id), raw, self._export_addresses,
                                                  self._locate)
        return hit


class _Builder:
    """Accumulates the spans of one trace, enforcing the per-trace span limit."""

    def __init__(self, rng: random.Random, resource: Resource, offset_ns: int, max_spans: int) -> None:
        self.rng = rng
        self.offset_ns = offset_ns
        self.resource = resource
        self.max_spans = max_spans
        self.trace_id = self._nonzero(128)
        self.spans: list[ReadableSpan] = []
        self.dropped = 0

    def _nonzero(self, bits: int) -> int:
        while True:
            value = self.rng.getrandbits(bits)
            if value:
                return value

    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self._nonzero(64), is_remote=False, trace_flags=_SAMPLED)

    def add(self, name: str, ctx: SpanContext, parent: SpanContext | None, start: int, end: int, attrs: Attrs,
            status: Status) -> None:
        self.spans.append(ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self.resource, attributes=attrs,
            kind=SpanKind.INTERNAL, status=status, start_time=start, end_time=end,
            instrumentation_scope=SCOPE))


def session_to_spans(session: Session, funcs: FuncTable, offset_ns: int, resource: Resource | None,
                     symbolize: Callable[[int], str] | None = None, export_addresses: bool = False,
                     max_spans: int = DEFAULT_MAX_SPANS, rng: random.Random | None = None,
                     locate: Locate | None = None) -> list[ReadableSpan]:
    """One trace per session: the root span is the entry function, children mirror the call tree.

    Returns the root span first, then the others in depth-first order (parents before children).
    """
    b = _Builder(rng or random.Random(), resource if resource is not None else Resource.get_empty(), offset_ns,
                 max(1, max_spans))
    results = _ResultAttrs(funcs, export_addresses, locate)
    entry_id = session.entry_func_id
    root_start, root_end = session.start_ns + offset_ns, session.end_ns + offset_ns

    top, root_raw = split_root(session)
    if entry_id is None:
        attrs: Attrs = {"retsnoop.incomplete": True}
        status, name = _UNSET, "unknown"
    else:
        base, status = results.get(entry_id, root_raw)
        attrs, name = dict(base), lookup_func(funcs, entry_id).name
    attrs.update(session_attrs(session, symbolize, export_addresses))
    lbr = lbr_attrs(session, funcs, symbolize, export_addresses)
    lbr_at = lbr_call(session) if session.calls else None
    if lbr and session.lbr is not None and session.lbr.depth == 0:
        attrs.update(lbr)  # the entry function's own exit took it: the root span stands for that call
        lbr = {}
    root_ctx = b.context()
    b.add(name, root_ctx, None, root_start, root_end, attrs, status)

    if session.calls:
        _add_calls(b, results, funcs, top, root_ctx, root_end, lbr_at, lbr)
    else:
        _add_chain(b, results, funcs, session, root_ctx, root_start, root_end, lbr)
    if b.dropped:
        attrs["retsnoop.spans_dropped"] = b.dropped  # the root span holds this very dict
    return b.spans


def split_root(session: Session) -> tuple[list[Call], int | None]:
    """The calls shown under the root span, and the entry function's result (None: not known).

    The root span stands for the entry call itself, so when the call records start with it, its
    children become the root's children; the error chain supplies the result when no exit was seen.
    """
    top, entry_id = session.calls, session.entry_func_id
    raw: int | None = None
    known = False
    if len(top) == 1 and top[0].func_id == entry_id:
        raw, known = top[0].result, top[0].end_ns is not None
        top = top[0].children
    if not known and session.chain and session.chain[0].latency_ns is not None:
        raw, known = session.chain[0].result, True
    return top, raw if known else None


def session_attrs(session: Session, symbolize: Callable[[int], str] | None, export_addresses: bool) -> Attrs:
    """Root-span attributes describing the thread, process and kernel stack of the session."""
    attrs: Attrs = {
        "thread.id": session.tid,
        "thread.name": session.comm,
        "process.pid": session.pid,
        "process.executable.name": session.proc_comm,
        "retsnoop.cpu": session.cpu,
    }
    if session.dropped_records > 0:
        attrs["retsnoop.dropped_records"] = session.dropped_records
    if session.calls_cut > 0:
        attrs["retsnoop.calls_cut"] = session.calls_cut
    if session.kstack and (symbolize is not None or export_addresses):
        if symbolize is None:
            frames = [f"0x{addr:016x}" for addr in session.kstack]
        elif export_addresses:
            frames = [f"0x{addr:016x} {symbolize(addr)}" for addr in session.kstack]
        else:
            frames = [_no_address(symbolize(addr), addr) for addr in session.kstack]
        attrs["code.stacktrace"] = "\n".join(frames)
    return attrs


def lbr_attrs(session: Session, funcs: FuncTable, symbolize: Callable[[int], str] | None,
              export_addresses: bool) -> Attrs:
    """--lbr: the branch records as `retsnoop.lbr` (relevant ones, oldest first), or why there are none."""
    cap = session.lbr
    if cap is None:
        return {}
    if cap.error:
        return {"retsnoop.lbr_error": errno_name(cap.error) or f"E{cap.error}"}
    entries = export_lbr(cap, lookup_func(funcs, cap.func_id), symbolize, export_addresses)
    return {"retsnoop.lbr": entries} if entries else {}


def lbr_call(session: Session) -> Call | None:
    """The call whose exit took the session's LBR snapshot, found by depth and exit time."""
    cap = session.lbr
    if cap is None:
        return None
    level = session.calls
    for depth in range(cap.depth + 1):
        here = [c for c in level if c.depth == depth and c.start_ns <= cap.exit_ns
                and (c.end_ns is None or c.end_ns >= cap.exit_ns)]
        if not here:
            return None
        call = here[-1]
        if depth == cap.depth:
            return call if call.func_id == cap.func_id and call.end_ns == cap.exit_ns else None
        level = call.children
    return None


def _no_address(frame: str, addr: int) -> str:
    """Symbolizers print the bare address when no symbol covers it; that would leak the KASLR offset."""
    return "[unknown]" if f"{addr:x}" in frame.lower() else frame


def _add_calls(b: _Builder, results: _ResultAttrs, funcs: FuncTable, top: list[Call], root_ctx: SpanContext,
               root_end: int, lbr_at: Call | None = None, lbr: Attrs | None = None) -> None:
    # Iterative pre-order walk: kernel call trees can be deep, and parents must precede children.
    stack: list[tuple[Call, SpanContext, int]] = [(c, root_ctx, root_end) for c in reversed(top)]
    while stack:
        call, parent_ctx, parent_end = stack.pop()
        if len(b.spans) >= b.max_spans:
            b.dropped += 1 + count_calls(call.children)
            continue
        attrs, status = results.get(call.func_id, call.result if call.end_ns is not None else None)
        if call.missing_before:
            attrs = {**attrs, "retsnoop.records_lost_before": call.missing_before}
        if lbr and call is lbr_at:
            attrs = {**attrs, **lbr}
        start = call.start_ns + b.offset_ns
        end = call.end_ns + b.offset_ns if call.end_ns is not None else max(parent_end, start)
        ctx = b.context()
        b.add(lookup_func(funcs, call.func_id).name, ctx, parent_ctx, start, end, attrs, status)
        stack.extend((c, ctx, end) for c in reversed(call.children))


def count_calls(calls: list[Call]) -> int:
    total, stack = 0, list(calls)
    while stack:
        call = stack.pop()
        total += 1
        stack.extend(call.children)
    return total


def _add_chain(b: _Builder, results: _ResultAttrs, funcs: FuncTable, session: Session, root_ctx: SpanContext,
               root_start: int, root_end: int, lbr: Attrs | None = None) -> None:
    parent_ctx, parent_start, parent_end = root_ctx, root_start, root_end
    lbr_depth = session.lbr.depth if session.lbr is not None and lbr else -1
    for depth, level in enumerate(session.chain[1:], start=1):
        if len(b.spans) >= b.max_spans:
            b.dropped += 1
            continue
        if level.latency_ns is None:
            start, end = parent_start, parent_end
            attrs, status = results.get(level.func_id, None)
        else:
            start = max(parent_start, parent_end - level.latency_ns)
            end = parent_end
            attrs, status = results.get(level.func_id, level.result)
        attrs = {**attrs, "retsnoop.start_estimated": True, **(lbr if depth == lbr_depth and lbr else {})}
        ctx = b.context()
        b.add(lookup_func(funcs, level.func_id).name, ctx, parent_ctx, start, end, attrs, status)
        parent_ctx, parent_start, parent_end = ctx, start, end


# ---- export --------------------------------------------------------------------------------------

PROTOCOLS = ("grpc", "http/protobuf")


class SpanExporterLike(Protocol):
    """An SDK span exporter. One that also has `export_encoded(body: bytes, spans: int)` (see
    otlp_fast) receives the sink's pre-encoded traces as serialized requests."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ExportStats:
    """Counters of the OTLP sink, read by the metrics collector at scrape time."""

    spans_exported: int = 0
    spans_dropped: dict[str, int] = field(default_factory=dict)  # cause -> spans
    export_errors: int = 0


def resolve_protocol(protocol: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """Explicit value, else OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc."""
    chosen = (protocol or environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
              or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
    if chosen not in PROTOCOLS:
        raise ValueError(f"unsupported OTLP protocol '{chosen}' (supported: {', '.join(PROTOCOLS)})")
    return chosen


def make_exporter(endpoint: str | None, protocol: str, timeout: float | None = None) -> SpanExporterLike:
    """The SDK's OTLP span exporter (able to send pre-encoded requests too); with endpoint None it
    follows the OTEL_EXPORTER_OTLP_* variables.

    An explicit endpoint needs a scheme: http:// means plaintext, https:// means TLS. For
    http/protobuf a bare base URL (no path) gets the standard /v1/traces path appended.
    """
    if endpoint is not None:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"OTLP endpoint '{endpoint}' must look like http://HOST:PORT or https://HOST:PORT")
    from retsnoop_otel.export.otlp_fast import EncodedGrpcSpanExporter, EncodedHttpSpanExporter

    if protocol == "grpc":
        insecure = None if endpoint is None else urlparse(endpoint).scheme == "http"
        return EncodedGrpcSpanExporter(endpoint=endpoint, insecure=insecure, timeout=timeout)
    if endpoint is not None and urlparse(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return EncodedHttpSpanExporter(endpoint=endpoint, timeout=timeout)


class OtlpTraceSink:
    """Sends span batches from a worker thread; `submit` never blocks and drops when the queue is full.

    The queue is bounded in spans, not sessions, because one session may carry thousands of spans.
    A session's spans are accepted or dropped together so that no trace arrives half-built.
    Sessions come either as SDK spans (session_to_spans) or, the fast way, as an
    otlp_fast.EncodedTrace; the worker joins consecutive traces into requests of up to
    `max_batch_spans` spans. Encoded traces go out as bytes when the exporter has `export_encoded`,
    else as spans decoded from those bytes.
    """

    def __init__(self, endpoint: str | None = None, protocol: str | None = None, *, max_queue_spans: int = 65536,
                 max_batch_spans: int = 512, timeout: float | None = None,
                 exporter: SpanExporterLike | None = None) -> None:
        self.protocol = resolve_protocol(protocol)
        self._exporter = exporter if exporter is not None else make_exporter(endpoint, self.protocol, timeout)
        self._max_queue = max_queue_spans
        self._max_batch = max(1, max_batch_spans)
        self._queue: collections.deque[list[ReadableSpan] | EncodedTrace] = collections.deque()
        self._queued = 0  # spans in _queue
        self._in_flight = 0  # spans taken by the worker and not yet accounted
        self._cond = threading.Condition()
        self._closing = False
        self._exported = 0
        self._errors = 0
        self._dropped: dict[str, int] = {}
        self._worker = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._worker.start()

    def submit(self, spans: list[ReadableSpan] | EncodedTrace) -> bool:
        """Queue one session's spans; False (and counted) if they were dropped."""
        if not spans:
            return True
        with self._cond:
            if self._closing:
                self._drop("shutdown", len(spans))
                return False
            if self._queued + len(spans) > self._max_queue:
                self._drop("queue_full", len(spans))
                return False
            self._queue.append(spans)
            self._queued += len(spans)
            self._cond.notify()
        return True

    def stats(self) -> ExportStats:
        with self._cond:
            return ExportStats(self._exported, dict(self._dropped), self._errors)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far has been exported or dropped; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queued and not self._in_flight, timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Export what is queued within `timeout`, then stop; spans still queued count as 'shutdown'."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._drop("shutdown", self._queued)
            self._queue.clear()
            self._queued = 0
            self._cond.notify_all()
        try:  # also aborts a retry loop in progress (the gRPC exporter waits on a shutdown event)
            self._exporter.shutdown()
        except Exception:  # noqa: BLE001 - a failing transport must not break the caller's exit path
            log.debug("OTLP exporter shutdown failed", exc_info=True)
        self._worker.join(timeout=max(0.0, min(timeout, 5.0)))

    def _drop(self, cause: str, count: int) -> None:
        if count:
            self._dropped[cause] = self._dropped.get(cause, 0) + count

    def _take_batch(self) -> list[list[ReadableSpan]] | list[EncodedTrace] | None:
        """Queued sessions of one kind (SDK spans or encoded) adding up to at most max_batch spans."""
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._closing)
            if not self._queue:
                return None
            first = self._queue.popleft()
            if len(first) > self._max_batch:  # split a big session; the rest stays at the head
                if isinstance(first, list):
                    first, rest = first[:self._max_batch], first[self._max_batch:]
                else:
                    first, rest = first.split(self._max_batch)
                self._queue.appendleft(rest)
            batch, count, kind = [first], len(first), isinstance(first, list)
            while (self._queue and isinstance(self._queue[0], list) is kind
                   and count + len(self._queue[0]) <= self._max_batch):
                batch.append(self._queue.popleft())
                count += len(batch[-1])
            self._queued -= count
            self._in_flight = count
            return batch

    def _export(self, batch: list[list[ReadableSpan]] | list[EncodedTrace]) -> bool:
        if isinstance(batch[0], list):
            return self._exporter.export([s for spans in batch for s in spans]) is SpanExportResult.SUCCESS
        from retsnoop_otel.export.otlp_fast import build_request, request_to_spans

        body = build_request(batch)  # type: ignore[arg-type]
        send = getattr(self._exporter, "export_encoded", None)
        if send is not None:
            return send(body, sum(len(t) for t in batch)) is SpanExportResult.SUCCESS
        return self._exporter.export(request_to_spans(body)) is SpanExportResult.SUCCESS

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            count = sum(len(item) for item in batch)
            try:
                ok = self._export(batch)
            except Exception:  # noqa: BLE001 - keep the worker alive whatever the transport does
                log.debug("OTLP export raised", exc_info=True)
                ok = False
            with self._cond:
                if ok:
                    self._exported += count
                else:
                    self._errors += 1
                    self._drop("export_failed", count)
                self._in_flight = 0
                self._cond.notify_all()

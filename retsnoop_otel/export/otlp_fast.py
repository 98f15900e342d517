"""Sessions straight to OTLP protobuf bytes, and SDK exporters that send such bytes as they are.

Building one SDK span object per kernel call and then one protobuf object per span costs about
100 microseconds of CPU per span (bench/span_throughput.py); a busy host produces more calls than
that allows. Here the wire format
of opentelemetry.proto.trace.v1 is written by hand: everything that repeats (resource, scope, and per
(function, raw result) the name, kind, attributes, status and flags of a span) is encoded once and
cached as bytes, so a span costs a tree step, two ids, two timestamps and a join.

The spans carry exactly what `otlp.session_to_spans` builds (same attributes, order, statuses and
times); only the random ids differ. Sending goes through subclasses of the SDK's OTLP exporters so
that the OTEL_EXPORTER_OTLP_* settings, headers, TLS, compression and retries keep working.
"""

from __future__ import annotations

import functools
import logging
import random
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError, _is_request_too_large
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from retsnoop_otel.capture.errnos import MAX_ERRNO
from retsnoop_otel.capture.model import Call, RetKind, Session
from retsnoop_otel.export.otlp import (
    DEFAULT_MAX_SPANS,
    SCOPE,
    Attrs,
    FuncTable,
    Locate,
    count_calls,
    func_attrs,
    lbr_attrs,
    lbr_call,
    lookup_func,
    return_attrs,
    session_attrs,
    split_root,
)

log = logging.getLogger(__name__)

# ---- protobuf wire primitives ----------------------------------------------------------------------
# Field numbers are those of opentelemetry-proto (tests compare with the generated classes).

_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5
# Entries kept per encoder cache; results like byte counts vary a lot, so the caches are bounded.
_CACHE_LIMIT = 4096  # about 2.5 MB per encoder when all caches are full


_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
    """Base-128 varint; negative numbers as their 64-bit two's complement, as int64 fields want."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _len_field(field: int, payload: bytes) -> bytes:
    return _tag(field, _LEN) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue message body, with the SDK encoder's type rules (bool before int, str before sequence)."""
    if isinstance(value, str):
        raw = value.encode()
        return b"\x0a" + _varint(len(raw)) + raw
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if value is None:
        return b""
    if isinstance(value, float):
        return _tag(4, _I64) + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _len_field(7, value)
    if isinstance(value, Sequence):
        return _len_field(5, b"".join(_len_field(1, _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _len_field(6, _key_values(1, value))
    raise TypeError(f"cannot encode attribute value of type {type(value).__name__}")


def _key_values(field: int, attrs: Mapping[str, Any]) -> bytes:
    """Repeated KeyValue `field` entries, in the mapping's order."""
    tag = _tag(field, _LEN)
    out = []
    for key, value in attrs.items():
        key_bytes = str(key).encode()
        val = _any_value(value)
        body = b"\x0a" + _varint(len(key_bytes)) + key_bytes + b"\x12" + _varint(len(val)) + val
        out.append(tag + _varint(len(body)) + body)
    return b"".join(out)


def _status(status: Status) -> bytes:
    body = b""
    if status.description:
        body += _len_field(2, status.description.encode())
    if status.status_code.value:
        body += _tag(3, _VARINT) + _varint(status.status_code.value)
    return _len_field(15, body)  # the SDK always sets Status, even UNSET (an empty message)


_SPAN_STATIC = _tag(6, _VARINT) + _varint(1)  # kind = SPAN_KIND_INTERNAL
# SDK spans carry SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK (our parents are never remote)
_SPAN_FLAGS = _tag(16, _I32) + struct.pack("<I", 0x100)
# span_id, parent_span_id, start and end time: fixed-size fields packed in one call. Protobuf
# fields may come in any order on the wire, so the layout puts all fixed-size parts together.
_IDS_TIMES = struct.Struct("<HQHQBQBQ")
_ROOT_IDS_TIMES = struct.Struct("<HQBQBQ")
_SPAN_ID_TAG = int.from_bytes(_tag(2, _LEN) + b"\x08", "little")
_PARENT_TAG = int.from_bytes(_tag(4, _LEN) + b"\x08", "little")
_START_TAG, _END_TAG = _tag(7, _I64)[0], _tag(8, _I64)[0]
_SPANS_TAG = _tag(2, _LEN)  # ScopeSpans.spans
_TRACE_FIELD_SIZE = 2 + 16  # Span.trace_id: tag, length, 16 bytes
_RECORDS_LOST = "retsnoop.records_lost_before"
_ESTIMATED = _key_values(9, {"retsnoop.start_estimated": True})


def _span_constant(name: str, attrs: Attrs, status: Status) -> bytes:
    """Every part of a Span that does not depend on ids and times."""
    return _len_field(5, name.encode()) + _SPAN_STATIC + _key_values(9, attrs) + _status(status) + _SPAN_FLAGS


def _valid_pointer(raw: int) -> bool:
    """A non-NULL, non-ERR_PTR pointer: `is_failure` for POINTER, inlined for the cache-miss path."""
    raw &= (1 << 64) - 1
    return 0 < raw < (1 << 64) - MAX_ERRNO


# ---- sessions to bytes -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Envelope:
    """The encoded resource and scope that the spans of a request are grouped under."""

    resource: bytes  # Resource message body
    resource_schema_url: str
    scope: bytes  # InstrumentationScope message body
    scope_schema_url: str


@dataclass(frozen=True, slots=True)
class EncodedTrace:
    """One session's spans, each a complete ScopeSpans.spans field; the root span comes first."""

    envelope: Envelope
    spans: list[bytes]
    spans_dropped: int = 0  # calls left out by the per-trace span limit
    trace_id: int = 0  # the spans' trace id (128 bits), for metric exemplars

    def __len__(self) -> int:
        return len(self.spans)

    def split(self, count: int) -> tuple[EncodedTrace, EncodedTrace]:
        """The first `count` spans and the rest; an export request must not exceed the batch size."""
        return (EncodedTrace(self.envelope, self.spans[:count], self.spans_dropped, self.trace_id),
                EncodedTrace(self.envelope, self.spans[count:], 0, self.trace_id))


def make_envelope(resource: Resource | None, scope: InstrumentationScope = SCOPE) -> Envelope:
    """Encoded once per encoder: every request repeats the same resource and scope."""
    resource = resource if resource is not None else Resource.get_empty()
    scope_body = _len_field(1, scope.name.encode())
    if scope.version:
        scope_body += _len_field(2, scope.version.encode())
    if scope.attributes:
        scope_body += _key_values(3, scope.attributes)
    return Envelope(_key_values(1, resource.attributes), resource.schema_url or "", scope_body,
                    scope.schema_url or "")


class SpanEncoder:
    """Encodes sessions of one probe set as OTLP spans, caching encoded parts in bounded caches.

    The function table must not change under an encoder (build a new one on reload). Not
    thread-safe: use one per capture thread.
    """

    def __init__(self, funcs: FuncTable, resource: Resource | None, *,
                 symbolize: Callable[[int], str] | None = None, export_addresses: bool = False,
                 max_spans: int = DEFAULT_MAX_SPANS, rng: random.Random | None = None,
                 format_args: Callable[[int, Any], list[str]] | None = None,
                 locate: Locate | None = None) -> None:
        self.funcs = funcs
        self.locate = locate  # DWARF: code.file.path / code.line.number, looked up once per function
        self.format_args = format_args  # -A: `name=value` strings, exported as retsnoop.args
        self.envelope = make_envelope(resource)
        self.symbolize = symbolize
        self.export_addresses = export_addresses
        self.max_spans = max(1, max_spans)
        self._rng = rng or random.Random()
        self._random64 = functools.partial(self._rng.getrandbits, 64)
        # (function, raw result) -> (ScopeSpans.spans tag + Span length, constant part, Span length)
        self._cache: dict[tuple[int, int | None], tuple[bytes, bytes, int]] = {}
        self._func_parts: dict[int, tuple[bytes, RetKind]] = {}  # name, kind and function attributes
        self._results: dict[tuple[RetKind, int | None], bytes] = {}  # result attributes, status, flags

    def _constant(self, func_id: int, raw: int | None) -> tuple[bytes, bytes, int]:
        """Encoded constant part of a span, the Span length it leads to without extra attributes, and the
        field header (tag + length) for that length.

        Cached per (function, raw result); the parts are cached per function and per (return kind,
        result) so that a new result of a known function costs little.
        """
        part = self._func_parts.get(func_id)
        if part is None:
            if len(self._func_parts) >= _CACHE_LIMIT:
                self._func_parts.clear()
            part = self._func_parts[func_id] = self._func_part(func_id)
        name_attrs, kind = part
        key = (kind, 1 if kind is RetKind.POINTER and raw is not None and not self.export_addresses
               and _valid_pointer(raw) else raw)  # any valid pointer is just "non-NULL"
        result = self._results.get(key)
        if result is None:
            if len(self._results) >= _CACHE_LIMIT:
                self._results.clear()
            attrs, status = return_attrs(kind, key[1], self.export_addresses)
            result = self._results[key] = _key_values(9, attrs) + _status(status) + _SPAN_FLAGS
        const = name_attrs + result
        size = _TRACE_FIELD_SIZE + _IDS_TIMES.size + len(const)
        hit = (_SPANS_TAG + _varint(size), const, size)
        if key[1] == raw:  # distinct pointers would only churn the cache
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # bounded memory for a months-long run; refills from hot results
            self._cache[(func_id, raw)] = hit
        return hit

    def _func_part(self, func_id: int) -> tuple[bytes, RetKind]:
        func = lookup_func(self.funcs, func_id)
        attrs = _key_values(9, func_attrs(func, self.locate))
        return _len_field(5, func.name.encode()) + _SPAN_STATIC + attrs, func.ret

    def _span_id(self) -> int:
        sid = self._rng.getrandbits(64)
        while not sid:
            sid = self._rng.getrandbits(64)
        return sid

    def encode(self, session: Session, offset_ns: int) -> EncodedTrace:
        """Spans of one session in session_to_spans order: root first, then depth-first, parents first."""
        trace_id = self._rng.getrandbits(128)
        while not trace_id:
            trace_id = self._rng.getrandbits(128)
        trace_field = _len_field(1, trace_id.to_bytes(16, "big"))
        spans: list[bytes] = [b""]  # the root goes in last: its attributes count what the limit cut
        root_id = self._span_id()
        root_start, root_end = session.start_ns + offset_ns, session.end_ns + offset_ns
        top, root_raw = split_root(session)
        lbr = lbr_attrs(session, self.funcs, self.symbolize, self.export_addresses) if session.lbr else {}
        lbr_root = bool(lbr) and session.lbr is not None and session.lbr.depth == 0
        if session.calls:
            dropped = self._calls(spans, trace_field, top, root_id, root_end, offset_ns,
                                  lbr_call(session) if lbr and not lbr_root else None, lbr)
        else:
            dropped = self._chain(spans, trace_field, session, root_id, root_start, root_end,
                                  {} if lbr_root else lbr)

        entry_id = session.entry_func_id
        if entry_id is None:
            const = _span_constant("unknown", {"retsnoop.incomplete": True}, Status(StatusCode.UNSET))
        else:
            const = self._constant(entry_id, root_raw)[1]
        extra: Attrs = session_attrs(session, self.symbolize, self.export_addresses)
        if lbr_root:
            extra.update(lbr)
        if dropped:
            extra["retsnoop.spans_dropped"] = dropped
        body = (trace_field + _ROOT_IDS_TIMES.pack(_SPAN_ID_TAG, root_id, _START_TAG, root_start, _END_TAG, root_end)
                + const + _key_values(9, extra))
        spans[0] = _SPANS_TAG + _varint(len(body)) + body
        return EncodedTrace(self.envelope, spans, dropped, trace_id)

    def _calls(self, spans: list[bytes], trace_field: bytes, top: list[Call], root_id: int, root_end: int,
               offset: int, lbr_at: Call | None = None, lbr: Attrs | None = None) -> int:
        """Appends the call tree below the root; returns how many calls the span limit left out."""
        # Iterative pre-order walk: kernel call trees can be deep, and parents must precede children.
        stack: list[tuple[Call, int, int]] = [(c, root_id, root_end) for c in reversed(top)]
        pop, push, append = stack.pop, stack.append, spans.append
        pack, constant, new_id, random64 = _IDS_TIMES.pack, self._constant, self._span_id, self._random64
        cache, limit, dropped = self._cache, self.max_spans, 0
        while stack:
            call, parent, parent_end = pop()
            if len(spans) >= limit:
                dropped += 1 + count_calls(call.children)
                continue
            end = call.end_ns
            key = (call.func_id, call.result if end is not None else None)
            head, const, size = cache.get(key) or constant(*key)
            start = call.start_ns + offset
            end = end + offset if end is not None else max(parent_end, start)
            sid = random64() or new_id()
            ids_times = pack(_SPAN_ID_TAG, sid, _PARENT_TAG, parent, _START_TAG, start, _END_TAG, end)
            if call.missing_before or (call.args and self.format_args is not None) or call is lbr_at:
                attrs: Attrs = {_RECORDS_LOST: call.missing_before} if call.missing_before else {}
                if call.args and self.format_args is not None:
                    attrs["retsnoop.args"] = self.format_args(call.func_id, call.args)
                if call is lbr_at and lbr:
                    attrs.update(lbr)
                extra = _key_values(9, attrs)
                append(b"".join((_SPANS_TAG, _varint(size + len(extra)), trace_field, ids_times, const, extra)))
            else:
                append(b"".join((head, trace_field, ids_times, const)))
            if call.children:
                for child in reversed(call.children):
                    push((child, sid, end))
        return dropped

    def _chain(self, spans: list[bytes], trace_field: bytes, session: Session, root_id: int, root_start: int,
               root_end: int, lbr: Attrs | None = None) -> int:
        """The error chain as nested spans right-aligned in their parents (see otlp's module doc)."""
        parent, parent_start, parent_end = root_id, root_start, root_end
        dropped = 0
        lbr_depth = session.lbr.depth if lbr and session.lbr is not None else -1
        for depth, level in enumerate(session.chain[1:], start=1):
            if len(spans) >= self.max_spans:
                dropped += 1
                continue
            if level.latency_ns is None:
                start, end = parent_start, parent_end
                const = self._constant(level.func_id, None)[1]
            else:
                start, end = max(parent_start, parent_end - level.latency_ns), parent_end
                const = self._constant(level.func_id, level.result)[1]
            sid = self._span_id()
            body = (trace_field + _IDS_TIMES.pack(_SPAN_ID_TAG, sid, _PARENT_TAG, parent, _START_TAG, start,
                                                  _END_TAG, end) + const + _ESTIMATED
                    + (_key_values(9, lbr) if depth == lbr_depth and lbr else b""))
            spans.append(_SPANS_TAG + _varint(len(body)) + body)
            parent, parent_start, parent_end = sid, start, end
        return dropped


def build_request(traces: Iterable[EncodedTrace]) -> bytes:
    """One ExportTraceServiceRequest holding all spans, one ResourceSpans per distinct envelope."""
    groups: dict[Envelope, list[bytes]] = {}
    for trace in traces:
        groups.setdefault(trace.envelope, []).extend(trace.spans)
    out = []
    for env, spans in groups.items():
        scope_spans = _len_field(1, env.scope) + b"".join(spans)
        if env.scope_schema_url:
            scope_spans += _len_field(3, env.scope_schema_url.encode())
        resource_spans = _len_field(1, env.resource) + _len_field(2, scope_spans)
        if env.resource_schema_url:
            resource_spans += _len_field(3, env.resource_schema_url.encode())
        out.append(_len_field(1, resource_spans))
    return b"".join(out)


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


# ---- sending ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Encoded:
    """A serialized request passed through the gRPC exporter's export/retry loop."""

    body: bytes
    spans: int


class EncodedGrpcSpanExporter(GrpcSpanExporter):
    """The SDK's OTLP/gRPC span exporter, also able to send a request serialized by `build_request`."""

    def export_encoded(self, body: bytes, spans: int) -> SpanExportResult:
        return self._export(_Encoded(body, spans))  # type: ignore[arg-type]

    def _translate_data(self, data: Any) -> ExportTraceServiceRequest:
        if isinstance(data, _Encoded):
            # the stub wants a message: parsing is done in C (upb) and costs little next to encoding
            return ExportTraceServiceRequest.FromString(data.body)
        return super()._translate_data(data)

    def _count_data(self, data: Any) -> int:
        return data.spans if isinstance(data, _Encoded) else super()._count_data(data)


class EncodedHttpSpanExporter(HttpSpanExporter):
    """The SDK's OTLP/HTTP span exporter, also able to post a request serialized by `build_request`.

    Mirrors the SDK's `export` minus the encoding step; the SDK client adds headers, compression
    and retries.
    """

    def export_encoded(self, body: bytes, spans: int) -> SpanExportResult:
        if self._shutdown:
            log.warning("OTLP/HTTP exporter already shut down, dropping %d spans", spans)
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(spans) as result:
            if _is_request_too_large(body, self._max_request_size):
                log.warning("dropping %d spans: request of %d bytes exceeds max_request_size %d bytes", spans,
                            len(body), self._max_request_size)
                result.error = RequestPayloadTooLargeError(f"request of {len(body)} bytes is too large")
                return SpanExportResult.FAILURE
            sent = self._client.export(body)
            if not sent.success:
                result.error = sent.error
                if sent.status_code is not None:
                    result.error_attrs = {HTTP_RESPONSE_STATUS_CODE: sent.status_code}
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


def request_to_spans(body: bytes) -> list[ReadableSpan]:
    """SDK spans back from a serialized request, for exporters that only take spans (files, tests)."""
    request = ExportTraceServiceRequest.FromString(body)
    spans: list[ReadableSpan] = []
    for rs in request.resource_spans:
        resource = Resource(_attrs(rs.resource.attributes), rs.schema_url or None)
        for ss in rs.scope_spans:
            scope = InstrumentationScope(ss.scope.name, ss.scope.version or None, ss.schema_url or None,
                                         _attrs(ss.scope.attributes) or None)
            for s in ss.spans:
                ctx = SpanContext(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"),
                                  is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
                parent = None if not s.parent_span_id else SpanContext(
                    ctx.trace_id, int.from_bytes(s.parent_span_id, "big"), is_remote=False,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED))
                spans.append(ReadableSpan(
                    name=s.name, context=ctx, parent=parent, resource=resource, attributes=_attrs(s.attributes),
                    kind=SpanKind(max(0, s.kind - 1)), start_time=s.start_time_unix_nano,
                    end_time=s.end_time_unix_nano, instrumentation_scope=scope,
                    status=Status(StatusCode(s.status.code), s.status.message or None)))
    return spans


def _attrs(kvs: Iterable[Any]) -> Attrs:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return None if kind is None else getattr(v, kind)

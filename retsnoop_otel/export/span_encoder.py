"""Sessions straight to OTLP protobuf bytes: the production span encoder.

Building one SDK span object per kernel call and then one protobuf object per span costs about
100 microseconds of CPU per span (bench/span_throughput.py); a busy host produces more calls than
that allows. Here the wire format of opentelemetry.proto.trace.v1 is written by hand: everything
that repeats (resource, scope, and per (function, raw result) the name, kind, attributes, status and
flags of a span) is encoded once and cached as bytes, so a span costs a tree step, two ids, two
timestamps and a join. What the spans say is decided in span_attributes.
"""

import functools
import random
import struct
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from retsnoop_otel.capture.errnos import MAX_ERRNO
from retsnoop_otel.capture.model import Call, FuncTable, RetKind, Session, Workload, lookup_func
from retsnoop_otel.export.probe_events import probe_events
from retsnoop_otel.export.protowire import I32, I64, LEN, VARINT, key_values, len_field, tag, varint
from retsnoop_otel.export.resource import with_workload
from retsnoop_otel.export.service_name import Identity, session_identity
from retsnoop_otel.export.span_attributes import (
    DEFAULT_MAX_SPANS,
    SCOPE_NAME,
    SCOPE_SCHEMA_URL,
    SCOPE_VERSION,
    START_ESTIMATED,
    AppContext,
    Attrs,
    FormatArgs,
    Locate,
    SpanStatus,
    app_parent,
    call_attrs,
    chain_span_times,
    count_calls,
    func_attrs,
    lbr_attrs,
    lbr_call,
    limit_lengths,
    origin_attrs,
    return_attrs,
    sampling_state,
    session_attrs,
    split_root,
    unknown_root,
)
from retsnoop_otel.export.span_caps import cap_span

# Entries kept per encoder cache; results like byte counts vary a lot, so the caches are bounded.
_CACHE_LIMIT = 4096  # about 2.5 MB per encoder when all caches are full


def _status(status: SpanStatus) -> bytes:
    body = b""
    if status.message:
        body += len_field(2, status.message.encode())
    if status.code:
        body += tag(3, VARINT) + varint(status.code)
    return len_field(15, body)  # always present, even UNSET (an empty message), as the SDK writes it


_SPAN_STATIC = tag(6, VARINT) + varint(1)  # kind = SPAN_KIND_INTERNAL
# SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: our parents are never remote...
_SPAN_FLAGS = tag(16, I32) + struct.pack("<I", 0x100)
# ...except the application's span a root joins or links to (| SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
_REMOTE_FLAGS = tag(16, I32) + struct.pack("<I", 0x300)
_LINK_FLAGS = tag(6, I32) + struct.pack("<I", 0x300)
# span_id, parent_span_id, start and end time: fixed-size fields packed in one call. Protobuf
# fields may come in any order on the wire, so the layout puts all fixed-size parts together.
_IDS_TIMES = struct.Struct("<HQHQBQBQ")
_ROOT_IDS_TIMES = struct.Struct("<HQBQBQ")
_SPAN_ID_TAG = int.from_bytes(tag(2, LEN) + b"\x08", "little")
_PARENT_TAG = int.from_bytes(tag(4, LEN) + b"\x08", "little")
_START_TAG, _END_TAG = tag(7, I64)[0], tag(8, I64)[0]
_SPANS_TAG = tag(2, LEN)  # ScopeSpans.spans
_TRACE_FIELD_SIZE = 2 + 16  # Span.trace_id: tag, length, 16 bytes
_LOW_RANDOM = (1 << 56) - 1  # the trace id's bits consistent samplers read as its randomness
_ESTIMATED = key_values(9, {START_ESTIMATED: True})


def _span_constant(name: str, attrs: Attrs, status: SpanStatus) -> bytes:
    """Every part of a Span that does not depend on ids and times."""
    return len_field(5, name.encode()) + _SPAN_STATIC + key_values(9, attrs) + _status(status) + _SPAN_FLAGS


def _valid_pointer(raw: int) -> bool:
    """A non-NULL, non-ERR_PTR pointer: `is_failure` for POINTER, inlined for the cache-miss path."""
    raw &= (1 << 64) - 1
    return 0 < raw < (1 << 64) - MAX_ERRNO


class Envelope(NamedTuple):
    """The encoded resource and scope that the spans of a request are grouped under."""

    resource: bytes  # Resource message body
    resource_schema_url: str
    scope: bytes  # InstrumentationScope message body
    scope_schema_url: str


class EncodedTrace:
    """One session's spans, each a complete ScopeSpans.spans field; the root span comes first. A slotted class, not
    a dataclass (dataclasses imports inspect, ast and dis at start), nor a NamedTuple (its length is the spans')."""

    __slots__ = ("envelope", "spans", "spans_dropped", "trace_id")

    def __init__(self, envelope: Envelope, spans: list[bytes], spans_dropped: int = 0, trace_id: int = 0) -> None:
        self.envelope = envelope
        self.spans = spans
        self.spans_dropped = spans_dropped  # calls left out by the per-trace span limit
        self.trace_id = trace_id  # the spans' trace id (128 bits), for metric exemplars

    def _fields(self) -> tuple[Envelope, list[bytes], int, int]:
        return self.envelope, self.spans, self.spans_dropped, self.trace_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EncodedTrace) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable spans: as the frozen dataclass with a list was

    def __repr__(self) -> str:
        return (f"EncodedTrace(envelope={self.envelope!r}, spans={self.spans!r}, spans_dropped={self.spans_dropped!r}, "
                f"trace_id={self.trace_id!r})")

    def __len__(self) -> int:
        return len(self.spans)

    def split(self, count: int) -> tuple["EncodedTrace", "EncodedTrace"]:
        """The first `count` spans and the rest; an export request must not exceed the batch size."""
        return (EncodedTrace(self.envelope, self.spans[:count], self.spans_dropped, self.trace_id),
                EncodedTrace(self.envelope, self.spans[count:], 0, self.trace_id))


def make_envelope(resource: Mapping[str, Any], resource_schema_url: str = "", scope_name: str = SCOPE_NAME,
                  scope_version: str = SCOPE_VERSION, scope_schema_url: str = SCOPE_SCHEMA_URL) -> Envelope:
    """Encoded once per encoder: every request repeats the same resource and scope."""
    scope_body = len_field(1, scope_name.encode())
    if scope_version:
        scope_body += len_field(2, scope_version.encode())
    return Envelope(key_values(1, resource), resource_schema_url, scope_body, scope_schema_url)


class WorkloadEnvelopes:
    """One envelope per workload (the agent's resource plus the container's and pod's attributes), so that
    build_request gives each workload its own ResourceSpans. Bounded: emptied when `max_entries` are held
    (a node runs far fewer containers at once), then refilled by the workloads still seen."""

    def __init__(self, resource: Mapping[str, Any], resource_schema_url: str = "", max_entries: int = 1024) -> None:
        self.resource = dict(resource)
        self.schema_url = resource_schema_url
        self.base = make_envelope(self.resource, resource_schema_url)
        self.max_entries = max(1, max_entries)
        self._cache: dict[tuple[Workload | None, Identity | None], Envelope] = {}
        self._by_session: dict[tuple, Envelope] = {}  # of_session's: what decides a session's identity -> envelope

    def of(self, workload: Workload | None, identity: Identity | None = None) -> Envelope:
        """The envelope of a workload's spans; with `identity` (service_name.session_identity), under that
        service: its service.name, service.namespace and service.instance.id replace the tracer's (the tracer's
        service.version and service.namespace go; its service.instance.id stays when the identity has none)."""
        if not workload and identity is None:
            return self.base
        key = (workload or None, identity)
        env = self._cache.get(key)
        if env is None:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            attrs = with_workload(self.resource, workload)
            if identity is not None:
                attrs.pop("service.version", None)
                attrs.pop("service.namespace", None)
                attrs.update(identity)
            env = self._cache[key] = make_envelope(attrs, self.schema_url)
        return env

    def of_session(self, session: Session) -> Envelope:
        """The envelope under the session's own service (service_name.session_identity), cached by what decides
        that identity (its workload, its application's published one, its executable), so that a session costs a
        look-up rather than the derivation."""
        app = session.app
        key = (session.workload or None, session.exe_name or session.proc_comm, app.service_name,
               app.service_namespace, app.service_instance_id) if app is not None else \
            (session.workload or None, session.exe_name or session.proc_comm)
        env = self._by_session.get(key)
        if env is None:
            if len(self._by_session) >= self.max_entries:
                self._by_session.clear()
            env = self._by_session[key] = self.of(session.workload, session_identity(session))
        return env


@functools.lru_cache(maxsize=64)
def _trace_state_field(state: str) -> bytes:
    """Span.trace_state; a trace has one, so it travels with the trace id field."""
    return len_field(3, state.encode()) if state else b""


class SpanEncoder:
    """Encodes sessions of one probe set as OTLP spans, caching encoded parts in bounded caches.

    The function table must not change under an encoder (build a new one on reload). Not
    thread-safe: use one per capture thread.
    """

    def __init__(self, funcs: FuncTable, envelope: Envelope, *,
                 symbolize: Any = None, export_addresses: bool = False,
                 max_spans: int = DEFAULT_MAX_SPANS, rng: random.Random | None = None,
                 format_args: FormatArgs | None = None, locate: Locate | None = None,
                 workloads: WorkloadEnvelopes | None = None, value_limit: int | None = None,
                 count_limit: int | None = None, service_per_session: bool = False, event_limit: int | None = None,
                 event_attribute_limit: int | None = None) -> None:
        self.funcs = funcs
        self.service_per_session = service_per_session  # the session's own service identity (service_name.py)
        self.value_limit = value_limit  # OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT: on stacks, LBR, arguments
        self.count_limit = count_limit  # OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT, when set (span_caps.py)
        self.event_limit = event_limit  # OTEL_SPAN_EVENT_COUNT_LIMIT, when set (span_caps.py)
        self.event_attribute_limit = event_attribute_limit  # OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT (probe_events.py)
        self.workloads = workloads  # a resource per workload; None: every session under `envelope`
        self.locate = locate  # DWARF: code.file.path / code.line.number, looked up once per function
        self.format_args = format_args  # -A: `name=value` strings, exported as retsnoop.args
        self.envelope = envelope
        self.symbolize = symbolize  # address -> 'name+0xoff' for code.stacktrace and retsnoop.lbr
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
            result = self._results[key] = key_values(9, attrs) + _status(status) + _SPAN_FLAGS
        const = name_attrs + result
        size = _TRACE_FIELD_SIZE + _IDS_TIMES.size + len(const)
        hit = (_SPANS_TAG + varint(size), const, size)
        if key[1] == raw:  # distinct pointers would only churn the cache
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # bounded memory for a months-long run; refills from hot results
            self._cache[(func_id, raw)] = hit
        return hit

    def _func_part(self, func_id: int) -> tuple[bytes, RetKind]:
        func = lookup_func(self.funcs, func_id)
        attrs = key_values(9, func_attrs(func, self.locate))
        return len_field(5, func.name.encode()) + _SPAN_STATIC + attrs, func.ret

    def _span_id(self) -> int:
        sid = self._rng.getrandbits(64)
        while not sid:
            sid = self._rng.getrandbits(64)
        return sid

    def _trace_id(self, randomness: int | None) -> int:
        """A random non-zero trace id; its low 56 bits are `randomness` when the sampling decision used it."""
        while True:
            trace_id = self._rng.getrandbits(128)
            if randomness is not None:
                trace_id = trace_id & ~_LOW_RANDOM | randomness
            if trace_id:
                return trace_id

    def encode(self, session: Session, offset_ns: int) -> EncodedTrace:
        """Spans of one session: root first, then depth-first, parents before children.

        In the application's trace when its thread held a sampled context; in a trace of its own otherwise.
        """
        app, joined = app_parent(session)
        state, randomness = sampling_state(session, joined)
        trace_id = app.trace_id if app is not None and joined else self._trace_id(randomness)
        trace_field = len_field(1, trace_id.to_bytes(16, "big")) + _trace_state_field(state)
        spans: list[bytes] = [b""]  # the root goes in last: its attributes count what the limit cut
        root_id = self._span_id()
        root_start, root_end = session.start_ns + offset_ns, session.end_ns + offset_ns
        top, root_raw = split_root(session)
        lbr = limit_lengths(lbr_attrs(session, self.funcs, self.symbolize, self.export_addresses),
                            self.value_limit) if session.lbr else {}
        lbr_root = bool(lbr) and session.lbr is not None and session.lbr.depth == 0
        if session.calls:
            dropped = self._calls(spans, trace_field, top, root_id, root_end, offset_ns,
                                  lbr_call(session) if lbr and not lbr_root else None, lbr)
        else:
            dropped = self._chain(spans, trace_field, session, root_id, root_start, root_end,
                                  {} if lbr_root else lbr)

        entry_id = session.entry_func_id
        if entry_id is None:
            const = _span_constant(*unknown_root())
        else:
            const = self._constant(entry_id, root_raw)[1]
        extra: Attrs = session_attrs(session, self.symbolize, self.export_addresses)
        extra.update(origin_attrs(session, self.funcs))
        if lbr_root:
            extra.update(lbr)
        if dropped:
            extra["retsnoop.spans_dropped"] = dropped
        limit_lengths(extra, self.value_limit)
        if app is not None and joined:
            parent = int.from_bytes(app.span_id.to_bytes(8, "big"), "little")  # packed "<Q": wire order kept
            ids_times = _IDS_TIMES.pack(_SPAN_ID_TAG, root_id, _PARENT_TAG, parent, _START_TAG, root_start,
                                        _END_TAG, root_end)
            const = const[:-len(_SPAN_FLAGS)] + _REMOTE_FLAGS
        else:
            ids_times = _ROOT_IDS_TIMES.pack(_SPAN_ID_TAG, root_id, _START_TAG, root_start, _END_TAG, root_end)
        body = trace_field + ids_times + const + key_values(9, extra) + (_link(app) if app and not joined else b"")
        if session.probes:  # -J: those of the entry call itself and any outside a recorded call
            root_call = session.calls[0] if session.calls and top is not session.calls else None
            body += probe_events([h for h in session.probes if not h.in_call or (root_call is not None
                                  and any(h is p for p in root_call.probes))], offset_ns, self.export_addresses,
                                 self.event_attribute_limit)
        spans[0] = _SPANS_TAG + varint(len(body)) + body
        if self.count_limit is not None or self.event_limit is not None:
            spans = [cap_span(span, self.count_limit, self.event_limit) for span in spans]
        if self.workloads is None:
            envelope = self.envelope
        elif self.service_per_session:
            envelope = self.workloads.of_session(session)
        else:
            envelope = self.workloads.of(session.workload)
        return EncodedTrace(envelope, spans, dropped, trace_id)

    def _calls(self, spans: list[bytes], trace_field: bytes, top: list[Call], root_id: int, root_end: int,
               offset: int, lbr_at: Call | None, lbr: Attrs) -> int:
        """Appends the call tree below the root; returns how many calls the span limit left out."""
        # Iterative pre-order walk: kernel call trees can be deep, and parents must precede children.
        stack: list[tuple[Call, int, int]] = [(c, root_id, root_end) for c in reversed(top)]
        pop, push, append = stack.pop, stack.append, spans.append
        pack, constant, new_id, random64 = _IDS_TIMES.pack, self._constant, self._span_id, self._random64
        cache, limit, dropped, format_args = self._cache, self.max_spans, 0, self.format_args
        grow = len(trace_field) - _TRACE_FIELD_SIZE  # the trace's tracestate, when it has one
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
            if call.missing_before or (call.args and format_args is not None) or call is lbr_at or call.probes:
                extra = key_values(9, limit_lengths(call_attrs(call, format_args, lbr_at, lbr), self.value_limit))
                if call.probes:  # -J: the probes that fired with this call innermost
                    extra += probe_events(call.probes, offset, self.export_addresses, self.event_attribute_limit)
                append(b"".join((_SPANS_TAG, varint(size + grow + len(extra)), trace_field, ids_times, const, extra)))
            elif grow:
                append(b"".join((_SPANS_TAG, varint(size + grow), trace_field, ids_times, const)))
            else:
                append(b"".join((head, trace_field, ids_times, const)))
            if call.children:
                for child in reversed(call.children):
                    push((child, sid, end))
        return dropped

    def _chain(self, spans: list[bytes], trace_field: bytes, session: Session, root_id: int, root_start: int,
               root_end: int, lbr: Attrs) -> int:
        """The error chain as nested spans right-aligned in their parents (see span_attributes)."""
        parent, parent_start, parent_end = root_id, root_start, root_end
        dropped = 0
        lbr_depth = session.lbr.depth if lbr and session.lbr is not None else -1
        for depth, level in enumerate(session.chain[1:], start=1):
            if len(spans) >= self.max_spans:
                dropped += 1
                continue
            start, end = chain_span_times(parent_start, parent_end, level.latency_ns)
            const = self._constant(level.func_id, None if level.latency_ns is None else level.result)[1]
            sid = self._span_id()
            body = (trace_field + _IDS_TIMES.pack(_SPAN_ID_TAG, sid, _PARENT_TAG, parent, _START_TAG, start,
                                                  _END_TAG, end) + const + _ESTIMATED
                    + (key_values(9, lbr) if depth == lbr_depth and lbr else b""))
            spans.append(_SPANS_TAG + varint(len(body)) + body)
            parent, parent_start, parent_end = sid, start, end
        return dropped


def _link(app: AppContext) -> bytes:
    """Span.links: the application's span, for a session that stays in a trace of its own."""
    return len_field(13, len_field(1, app.trace_id.to_bytes(16, "big")) + len_field(2, app.span_id.to_bytes(8, "big"))
                     + _LINK_FLAGS)


def build_request(traces: Iterable[EncodedTrace]) -> bytes:
    """One ExportTraceServiceRequest holding all spans, one ResourceSpans per distinct envelope."""
    groups: dict[Envelope, list[bytes]] = {}
    for trace in traces:
        groups.setdefault(trace.envelope, []).extend(trace.spans)
    out = []
    for env, spans in groups.items():
        scope_spans = len_field(1, env.scope) + b"".join(spans)
        if env.scope_schema_url:
            scope_spans += len_field(3, env.scope_schema_url.encode())
        resource_spans = len_field(1, env.resource) + len_field(2, scope_spans)
        if env.resource_schema_url:
            resource_spans += len_field(3, env.resource_schema_url.encode())
        out.append(len_field(1, resource_spans))
    return b"".join(out)

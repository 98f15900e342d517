"""Test oracle: the spans of a session built as OpenTelemetry SDK objects, encoded by the SDK.

The production path (retsnoop_otel.export.span_encoder) writes OTLP bytes by hand for speed; this
builds the same spans the slow, obvious way (ReadableSpan objects from span_attributes, then the
SDK's own encoder) so tests can compare the two request by request. Only the random ids differ.
bench/span_throughput.py measures it too (its `readable` path): it imports nothing of tests/ or bench/, so
the bench may import it without tying itself to the tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from retsnoop_otel.capture.model import Call, FuncTable, Session, TracedFunc, lookup_func
from retsnoop_otel.export.resource import Resource, with_workload
from retsnoop_otel.export.span_attributes import (
    DEFAULT_MAX_SPANS,
    SCOPE_NAME,
    SCOPE_SCHEMA_URL,
    SCOPE_VERSION,
    START_ESTIMATED,
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
    origin_attrs,
    return_attrs,
    sampling_state,
    session_attrs,
    split_root,
    unknown_root,
)

SCOPE = InstrumentationScope(SCOPE_NAME, SCOPE_VERSION, SCOPE_SCHEMA_URL)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def result_attrs(func: TracedFunc, raw: int | None, export_addresses: bool,
                 locate: Locate | None = None) -> tuple[Attrs, SpanStatus]:
    """Attributes + status of one call of `func` that returned `raw` (None: the exit was not seen)."""
    attrs, status = return_attrs(func.ret, raw, export_addresses)
    return {**func_attrs(func, locate), **attrs}, status


def sdk_status(status: SpanStatus) -> Status:
    return Status(StatusCode(int(status.code)), status.message or None)


def sdk_resource(resource: Resource | None, session: Session | None = None) -> SdkResource:
    """The agent's resource, plus the session's workload (container, pod) when it has one."""
    if resource is None:
        return SdkResource({})
    workload = session.workload if session is not None else None
    return SdkResource(with_workload(resource.attributes, workload), resource.schema_url or None)


class _Builder:
    """Accumulates the spans of one trace, enforcing the per-trace span limit."""

    def __init__(self, rng: random.Random, resource: SdkResource, offset_ns: int, max_spans: int,
                 trace_id: int = 0, trace_state: str = "", randomness: int | None = None) -> None:
        self.rng, self.resource, self.offset_ns, self.max_spans = rng, resource, offset_ns, max_spans
        self.trace_id = trace_id or self._nonzero(128)
        if randomness is not None:  # the sampling decision's randomness: the trace id's low 56 bits
            self.trace_id = (self.trace_id >> 56 << 56 | randomness) or 1 << 56
        self.trace_state = TraceState([tuple(trace_state.split("=", 1))]) if trace_state else None
        self.spans: list[ReadableSpan] = []
        self.dropped = 0

    def _nonzero(self, bits: int) -> int:
        while True:
            if value := self.rng.getrandbits(bits):
                return value

    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self._nonzero(64), is_remote=False, trace_flags=_SAMPLED,
                           trace_state=self.trace_state)

    def add(self, name: str, ctx: SpanContext, parent: SpanContext | None, start: int, end: int, attrs: Attrs,
            status: SpanStatus, links: Sequence[Link] = ()) -> None:
        self.spans.append(ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self.resource, attributes=attrs, links=links,
            kind=SpanKind.INTERNAL, status=sdk_status(status), start_time=start, end_time=end,
            instrumentation_scope=SCOPE))


def session_to_spans(session: Session, funcs: FuncTable, offset_ns: int, resource: Resource | None = None,
                     symbolize: Callable[[int], str] | None = None, export_addresses: bool = False,
                     max_spans: int = DEFAULT_MAX_SPANS, rng: random.Random | None = None,
                     locate: Locate | None = None, format_args: FormatArgs | None = None) -> list[ReadableSpan]:
    """Root span first (the entry function), then the others depth-first, parents before children."""
    app, joined = app_parent(session)
    state, randomness = sampling_state(session, joined)
    b = _Builder(rng or random.Random(), sdk_resource(resource, session), offset_ns, max(1, max_spans),
                 app.trace_id if app is not None and joined else 0, state, randomness)
    app_ctx = None if app is None else SpanContext(app.trace_id, app.span_id, is_remote=True,
                                                   trace_flags=TraceFlags(app.trace_flags))

    def result(func_id: int, raw: int | None) -> tuple[Attrs, SpanStatus]:
        return result_attrs(lookup_func(funcs, func_id), raw, export_addresses, locate)

    root_start, root_end = session.start_ns + offset_ns, session.end_ns + offset_ns
    top, root_raw = split_root(session)
    if session.entry_func_id is None:
        name, attrs, status = unknown_root()
    else:
        attrs, status = result(session.entry_func_id, root_raw)
        name = lookup_func(funcs, session.entry_func_id).name
    attrs = {**attrs, **session_attrs(session, symbolize, export_addresses), **origin_attrs(session, funcs)}
    lbr = lbr_attrs(session, funcs, symbolize, export_addresses)
    lbr_at = lbr_call(session) if session.calls else None
    if lbr and session.lbr is not None and session.lbr.depth == 0:
        attrs.update(lbr)  # the entry function's own exit took it: the root span stands for that call
        lbr = {}
    root_ctx = b.context()
    b.spans.append(None)  # type: ignore[arg-type]  # the root goes in last: it counts what the limit cut
    if session.calls:
        stack: list[tuple[Call, SpanContext, int]] = [(c, root_ctx, root_end) for c in reversed(top)]
        while stack:
            call, parent_ctx, parent_end = stack.pop()
            if len(b.spans) >= b.max_spans:
                b.dropped += 1 + count_calls(call.children)
                continue
            base, st = result(call.func_id, call.result if call.end_ns is not None else None)
            start = call.start_ns + offset_ns
            end = call.end_ns + offset_ns if call.end_ns is not None else max(parent_end, start)
            ctx = b.context()
            b.add(lookup_func(funcs, call.func_id).name, ctx, parent_ctx, start, end,
                  {**base, **call_attrs(call, format_args, lbr_at, lbr)}, st)
            stack.extend((c, ctx, end) for c in reversed(call.children))
    else:
        parent_ctx, parent_start, parent_end = root_ctx, root_start, root_end
        lbr_depth = session.lbr.depth if session.lbr is not None and lbr else -1
        for depth, level in enumerate(session.chain[1:], start=1):
            if len(b.spans) >= b.max_spans:
                b.dropped += 1
                continue
            start, end = chain_span_times(parent_start, parent_end, level.latency_ns)
            base, st = result(level.func_id, None if level.latency_ns is None else level.result)
            ctx = b.context()
            b.add(lookup_func(funcs, level.func_id).name, ctx, parent_ctx, start, end,
                  {**base, START_ESTIMATED: True, **(lbr if depth == lbr_depth and lbr else {})}, st)
            parent_ctx, parent_start, parent_end = ctx, start, end
    if b.dropped:
        attrs["retsnoop.spans_dropped"] = b.dropped
    children, b.spans = b.spans[1:], []
    b.add(name, root_ctx, app_ctx if joined else None, root_start, root_end, attrs, status,
          [Link(app_ctx)] if app_ctx is not None and not joined else ())
    return b.spans + children


def sdk_request(spans: Iterable[ReadableSpan]) -> ExportTraceServiceRequest:
    """The SDK's own encoding of spans, to compare with what the production encoder writes.

    The oldest SDKs pyproject allows do not write the scope's schema URL into ScopeSpans: it is put
    where newer ones put it, so that one oracle serves every supported version.
    """
    spans = list(spans)
    request = encode_spans(spans)
    urls = {getattr(s.instrumentation_scope, "schema_url", None) for s in spans} - {None, ""}
    if len(urls) == 1:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                ss.schema_url = ss.schema_url or next(iter(urls))
    return request


def request_to_spans(body: bytes) -> list[dict[str, Any]]:
    """Spans of a serialized request as plain dicts (name, ids, parent, times, attributes, status)."""
    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({"name": s.name, "trace_id": int.from_bytes(s.trace_id, "big"),
                            "span_id": int.from_bytes(s.span_id, "big"),
                            "parent_id": int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else None,
                            "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                            "attributes": attributes(s.attributes), "status": s.status.code,
                            "status_message": s.status.message, "resource": resource, "scope": ss.scope.name,
                            "trace_state": s.trace_state, "schema_url": rs.schema_url,
                            "scope_schema_url": ss.schema_url})
    return out


def attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    return None if kind is None else getattr(v, kind)


def request_to_span_views(body: bytes) -> list[Any]:
    """Spans of a serialized request with the SDK's attribute paths (name, context, parent, status...),
    so that tests read what went over the wire the way they would read SDK spans."""
    from types import SimpleNamespace
    out = []
    for d in request_to_spans(body):
        out.append(SimpleNamespace(
            name=d["name"], attributes=d["attributes"], start_time=d["start"], end_time=d["end"],
            context=SimpleNamespace(trace_id=d["trace_id"], span_id=d["span_id"]),
            parent=None if d["parent_id"] is None else SimpleNamespace(span_id=d["parent_id"]),
            status=SimpleNamespace(status_code=StatusCode(d["status"]), description=d["status_message"] or None),
            resource=d["resource"]))
    return out

"""The span count limits on spans the encoder has already written: attributes (OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT)
and events (OTEL_SPAN_EVENT_COUNT_LIMIT).

The encoder joins cached byte parts, so a span's attributes are never one list it could cut. The limits are
applied afterwards, and only when a variable sets one: the specification's default of 128 is far above what
any span here holds (a few dozen attributes at most; events are the injected probes that fired in one call). A
span over a limit keeps its first attributes and events, as SDKs keep the ones added first (the function's and
the result's attributes come before the session's, events in the order they fired), and says how many it lost
in dropped_attributes_count and dropped_events_count.
"""

from __future__ import annotations

from retsnoop_otel.export.protowire import I32, I64, LEN, VARINT, tag, varint

# opentelemetry.proto.trace.v1.Span: attributes and dropped_attributes_count, events and dropped_events_count
_ATTRIBUTES, _DROPPED_ATTRIBUTES = 9, 10
_EVENTS, _DROPPED_EVENTS = 11, 12


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def _field_end(body: bytes, i: int, wire_type: int) -> int:
    if wire_type == VARINT:
        return _read_varint(body, i)[1]
    if wire_type == LEN:
        size, i = _read_varint(body, i)
        return i + size
    if wire_type == I64:
        return i + 8
    if wire_type == I32:
        return i + 4
    raise ValueError(f"wire type {wire_type} in an encoded span")


def cap_span(span: bytes, attributes: int | None = None, events: int | None = None) -> bytes:
    """One ScopeSpans.spans field (tag, length, Span) with at most `attributes` attributes and `events` events
    (None: no limit)."""
    limits = {_ATTRIBUTES: attributes, _EVENTS: events}
    _, head = _read_varint(span, 0)
    size, start = _read_varint(span, head)
    body = span[start:start + size]
    out = bytearray()
    kept = {_ATTRIBUTES: 0, _EVENTS: 0}
    dropped = {_ATTRIBUTES: 0, _EVENTS: 0}
    i = 0
    while i < len(body):
        first = i
        key, i = _read_varint(body, i)
        i = _field_end(body, i, key & 7)
        field = key >> 3
        limit = limits.get(field)
        if limit is not None:
            if kept[field] >= limit:
                dropped[field] += 1
                continue
            kept[field] += 1
        out += body[first:i]
    if not any(dropped.values()):
        return span
    for field, count_field in ((_ATTRIBUTES, _DROPPED_ATTRIBUTES), (_EVENTS, _DROPPED_EVENTS)):
        if dropped[field]:
            out += tag(count_field, VARINT) + varint(dropped[field])
    return span[:head] + varint(len(out)) + bytes(out)


def cap_attributes(span: bytes, limit: int) -> bytes:
    """One ScopeSpans.spans field with at most `limit` attributes."""
    return cap_span(span, attributes=limit)

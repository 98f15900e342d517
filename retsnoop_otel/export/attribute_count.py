"""OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT on spans the encoder has already written.

The encoder joins cached byte parts, so a span's attributes are never one list it could cut. The limit is
applied afterwards, and only when the variable is set: the specification's default of 128 is far above what
any span here holds (a few dozen at most). A span over the limit keeps its first attributes, as SDKs keep the
ones set first (the function's and the result's come before the session's), and says how many it lost in
dropped_attributes_count.
"""

from __future__ import annotations

from retsnoop_otel.export.protowire import I32, I64, LEN, VARINT, tag, varint

_ATTRIBUTES, _DROPPED = 9, 10  # opentelemetry.proto.trace.v1.Span: attributes, dropped_attributes_count


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


def cap_attributes(span: bytes, limit: int) -> bytes:
    """One ScopeSpans.spans field (tag, length, Span) with at most `limit` attributes."""
    _, head = _read_varint(span, 0)
    size, start = _read_varint(span, head)
    body = span[start:start + size]
    out = bytearray()
    kept = dropped = 0
    i = 0
    while i < len(body):
        first = i
        key, i = _read_varint(body, i)
        i = _field_end(body, i, key & 7)
        if key >> 3 == _ATTRIBUTES:
            if kept >= limit:
                dropped += 1
                continue
            kept += 1
        out += body[first:i]
    if not dropped:
        return span
    out += tag(_DROPPED, VARINT) + varint(dropped)
    return span[:head] + varint(len(out)) + bytes(out)

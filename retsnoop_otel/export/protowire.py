"""Protobuf wire format primitives for writing OTLP messages by hand.

Field numbers used with these are those of opentelemetry-proto; tests compare what we write with
the generated classes' parse of it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

VARINT, I64, LEN, I32 = 0, 1, 2, 5

_SMALL = [bytes((i,)) for i in range(0x80)]


def varint(value: int) -> bytes:
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


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def len_field(field: int, payload: bytes) -> bytes:
    return tag(field, LEN) + varint(len(payload)) + payload


def any_value(value: Any) -> bytes:
    """An AnyValue message body, with the SDK encoder's type rules (bool before int, str before sequence)."""
    if isinstance(value, str):
        raw = value.encode()
        return b"\x0a" + varint(len(raw)) + raw
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if value is None:
        return b""
    if isinstance(value, float):
        return tag(4, I64) + struct.pack("<d", value)
    if isinstance(value, bytes):
        return len_field(7, value)
    if isinstance(value, Sequence):
        return len_field(5, b"".join(len_field(1, any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return len_field(6, key_values(1, value))
    raise TypeError(f"cannot encode attribute value of type {type(value).__name__}")


def key_values(field: int, attrs: Mapping[str, Any]) -> bytes:
    """Repeated KeyValue `field` entries, in the mapping's order."""
    head = tag(field, LEN)
    out = []
    for key, value in attrs.items():
        key_bytes = str(key).encode()
        val = any_value(value)
        body = b"\x0a" + varint(len(key_bytes)) + key_bytes + b"\x12" + varint(len(val)) + val
        out.append(head + varint(len(body)) + body)
    return b"".join(out)

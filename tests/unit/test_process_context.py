"""OTEP 4947 attrs-data parsing and the OTEP 4719 payload decoding, on bytes built here (no process needed)."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from retsnoop_otel.appctx.process_context import decode_payload, thread_attributes

KEYS = ("http.route", "user")


def entry(index: int, value: bytes) -> bytes:
    return bytes([index, len(value)]) + value


def test_entries_map_through_the_key_map() -> None:
    data = entry(0, b"/api/v1/cart") + entry(1, b"alice")
    assert thread_attributes(data, KEYS) == {"http.route": "/api/v1/cart", "user": "alice"}
    assert thread_attributes(b"", KEYS) == {}
    assert thread_attributes(entry(0, b""), KEYS) == {"http.route": ""}


def test_last_occurrence_of_a_key_wins() -> None:
    data = entry(0, b"/old") + entry(1, b"bob") + entry(0, b"/new")
    assert thread_attributes(data, KEYS) == {"http.route": "/new", "user": "bob"}


def test_parsing_stops_at_an_incomplete_entry() -> None:
    whole = entry(1, b"carol")
    assert thread_attributes(whole + b"\x00", KEYS) == {"user": "carol"}  # a lone key byte
    assert thread_attributes(whole + b"\x00\x05abc", KEYS) == {"user": "carol"}  # value cut short
    # an incomplete entry also ends the walk: a valid-looking tail after it is not read as an entry
    assert thread_attributes(b"\x00\xff" + entry(1, b"dave"), KEYS) == {}


def test_indexes_outside_the_key_map_are_skipped_not_fatal() -> None:
    data = entry(7, b"ignored") + entry(255, b"x" * 255) + entry(1, b"erin")
    assert thread_attributes(data, KEYS) == {"user": "erin"}
    assert thread_attributes(entry(0, b"/x"), ()) == {}


def test_invalid_utf8_is_replaced() -> None:
    assert thread_attributes(entry(1, b"fr\xe9d\xff"), KEYS) == {"user": "fr\ufffdd\ufffd"}
    assert thread_attributes(entry(1, "zoë".encode()), KEYS) == {"user": "zoë"}


def _kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def test_resource_attributes_as_python_values() -> None:
    keys = ArrayValue(values=[AnyValue(string_value=k) for k in KEYS] + [AnyValue(int_value=3)])
    payload = Resource(attributes=[
        _kv("service.name", string_value="checkout"),
        _kv("threadlocal.schema_version", string_value="tls_v1"),
        _kv("threadlocal.attribute_key_map", array_value=keys),
        _kv("count", int_value=-5), _kv("on", bool_value=False), _kv("ratio", double_value=1.5),
        _kv("blob", bytes_value=b"\x00\x01"),
        _kv("nested", kvlist_value=KeyValueList(values=[_kv("a", string_value="b")])),
        KeyValue(key="unset"),
    ]).SerializeToString()
    ctx = decode_payload(payload, 42)
    assert ctx is not None
    assert ctx.attributes == {
        "service.name": "checkout", "threadlocal.schema_version": "tls_v1",
        "threadlocal.attribute_key_map": ("http.route", "user", 3), "count": -5, "on": False, "ratio": 1.5,
        "blob": b"\x00\x01", "nested": {"a": "b"}, "unset": None,
    }
    assert ctx.schema_version == "tls_v1" and ctx.published_at_ns == 42
    assert ctx.key_map == ("http.route", "user", "")  # a non-string entry keeps its index, names nothing


def test_missing_or_mistyped_threadlocal_keys() -> None:
    ctx = decode_payload(Resource(attributes=[_kv("threadlocal.schema_version", int_value=1),
                                              _kv("threadlocal.attribute_key_map", string_value="user")])
                         .SerializeToString(), 1)
    assert ctx is not None and ctx.schema_version is None and ctx.key_map == ()
    empty = decode_payload(b"", 1)
    assert empty is not None and (empty.attributes, empty.schema_version, empty.key_map) == ({}, None, ())


def test_payload_that_does_not_decode_is_none() -> None:
    assert decode_payload(b"\x0a\xff\xff\xff\x0f", 1) is None  # a length beyond the data
    bad_utf8 = Resource(attributes=[_kv("k", string_value="v")]).SerializeToString().replace(b"v", b"\xff")
    assert decode_payload(bad_utf8, 1) is None


def test_importing_the_modules_stays_cheap() -> None:
    code = ("import sys, retsnoop_otel.appctx.process_context, retsnoop_otel.appctx.thread_ctx; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('google', 'opentelemetry', 'elftools')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"

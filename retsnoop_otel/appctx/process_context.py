"""OTEP 4719 process context (resource attributes a process publishes in a named mapping) and the OTEP 4947
thread-record attributes that index into its `threadlocal.attribute_key_map`.

The process memory is read through /proc/PID/mem, so the reader needs ptrace-read access to the process (root
or the same user with a permissive yama.ptrace_scope), as OTEP 4719 says. The header is read in the host's
(64-bit little-endian: x86-64 and arm64 alike) layout.
"""

import os
import struct
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

SIGNATURE = b"OTEL_CTX"
VERSIONS = (2, 1)  # 2 is current, 1 is allowed for development
# The OTEP's names; "[anon:OTEL_CTX]" is what a private anonymous fallback mapping is called once named, and the
# signature check keeps any other mapping out.
_MAPPING_NAMES = ("[anon_shmem:OTEL_CTX]", "/memfd:OTEL_CTX", "[anon:OTEL_CTX]")
_HEADER = struct.Struct("<8sIIQQ")  # signature, version, payload_size, published_at_ns, payload pointer
_MAX_PAYLOAD = 16 << 20  # a resource is a few KiB; a bigger size is a torn or hostile header
_ATTEMPTS = 5
_RETRY_PAUSE_S = 0.001
_SCHEMA_KEY = "threadlocal.schema_version"
_KEY_MAP_KEY = "threadlocal.attribute_key_map"


class ProcessContext(NamedTuple):
    """What one process published: read once per process, it names the thread-record attribute keys. Not a
    dataclass (thread_ctx.TlsLocation says why)."""

    attributes: dict[str, Any]  # the Resource's attributes (string, int, bool, double, arrays as tuples)
    schema_version: str | None  # threadlocal.schema_version
    key_map: tuple[str, ...]  # threadlocal.attribute_key_map (index -> attribute name)
    published_at_ns: int


def _mappings(pid: int, proc_root: str) -> list[int]:
    """Start addresses of the mappings that may hold the header, in address order."""
    with open(f"{proc_root}/{pid}/maps") as f:
        lines = f.read().splitlines()
    starts = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith(_MAPPING_NAMES):
            starts.append(int(parts[0].partition("-")[0], 16))
    return starts


def _read(fd: int, addr: int, size: int) -> bytes | None:
    try:
        data = os.pread(fd, size, addr)
    except (OSError, OverflowError):
        return None
    return data if len(data) == size else None


def _read_at(fd: int, start: int) -> ProcessContext | None:
    """OTEP 4719 reading protocol for one mapping: signature and version, published_at_ns != 0, payload,
    header again; a header that changed (or is being updated) is retried a few times."""
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(_RETRY_PAUSE_S)
        raw = _read(fd, start, _HEADER.size)
        if raw is None:
            return None
        signature, version, size, published, payload_at = header = _HEADER.unpack(raw)
        if signature != SIGNATURE or version not in VERSIONS:
            return None  # not (or no longer) a process context: skip this mapping
        if published == 0:
            continue  # the writer is updating it
        if size > _MAX_PAYLOAD or not payload_at:
            continue  # a header copied while the writer changed it: the next look settles it
        payload = _read(fd, payload_at, size) if size else b""
        if payload is None:
            continue  # a payload freed under an update shows up as a changed header below, or not at all
        again = _read(fd, start, _HEADER.size)
        if again is None:
            return None
        if _HEADER.unpack(again) != header:
            continue
        return decode_payload(payload, published)
    return None


def read_process_context(pid: int, proc_root: str = "/proc") -> ProcessContext | None:
    """The process context of `pid`, or None when there is none, it is invalid, it kept changing while being
    read, the payload does not decode (readers SHOULD then fall back to their own resource detection), or the
    process cannot be read."""
    try:
        starts = _mappings(pid, proc_root)
        if not starts:
            return None
        fd = os.open(f"{proc_root}/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        for start in starts:
            ctx = _read_at(fd, start)
            if ctx is not None:
                return ctx
        return None
    finally:
        os.close(fd)


def _value(any_value: Any) -> Any:
    """An AnyValue as a plain Python value: arrays as tuples, key-value lists as dicts, unset as None."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def decode_payload(payload: bytes, published_at_ns: int) -> ProcessContext | None:
    """A serialized opentelemetry.proto.resource.v1.Resource as a ProcessContext; None if it does not decode."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    try:
        resource = Resource.FromString(payload)
    except (DecodeError, ValueError):  # ValueError: e.g. invalid UTF-8 in a string field (upb)
        return None
    attributes = {kv.key: _value(kv.value) for kv in resource.attributes}
    schema = attributes.get(_SCHEMA_KEY)
    names = attributes.get(_KEY_MAP_KEY)
    # A non-string entry keeps its index (the map is positional) but names nothing.
    key_map = tuple(n if isinstance(n, str) else "" for n in names) if isinstance(names, tuple) else ()
    return ProcessContext(attributes, schema if isinstance(schema, str) else None, key_map, published_at_ns)


def thread_attributes(attrs_data: bytes, key_map: Sequence[str]) -> dict[str, str]:
    """OTEP 4947 attrs-data: entries of key index u8, length u8, value bytes (utf-8), packed with no padding.

    The last occurrence of a key wins (writers may append an update), parsing stops where the remaining bytes
    cannot hold a complete entry, indexes outside key_map are ignored, and invalid utf-8 is replaced.
    """
    out: dict[str, str] = {}
    pos, end = 0, len(attrs_data)
    while end - pos >= 2:
        index, length = attrs_data[pos], attrs_data[pos + 1]
        if end - pos - 2 < length:
            break
        value = attrs_data[pos + 2:pos + 2 + length].decode("utf-8", "replace")
        pos += 2 + length
        if index < len(key_map) and key_map[index]:
            out[key_map[index]] = value
    return out

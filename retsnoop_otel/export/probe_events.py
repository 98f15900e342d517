"""Injected probes (-J) as OTLP span events: each on the span of the innermost call open when it fired.

Event name: the probe's spec as written (`tp:syscalls:sys_exit_bpf`); attributes: `retsnoop.probe.kind` and the
probe's fields by name (a tracepoint's from its format file, `ret` of a kretprobe). Fields that hold kernel
addresses (pointers, a kprobe's instruction pointer) reveal the KASLR offset: only with export_addresses.
With OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT (or OTEL_ATTRIBUTE_COUNT_LIMIT) set, an event keeps its first attributes (the
kind, then the fields in order) and counts the rest in its dropped_attributes_count; how many events a span keeps
(OTEL_SPAN_EVENT_COUNT_LIMIT) is span_caps.py's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from retsnoop_otel.capture.inject import ProbeHit
from retsnoop_otel.export.protowire import I64, VARINT, key_values, len_field, tag, varint

PROBE_KIND = "retsnoop.probe.kind"
_EVENTS = 11  # opentelemetry.proto.trace.v1.Span.events
_TIME = tag(1, I64)  # Span.Event.time_unix_nano (fixed64)
_DROPPED = tag(4, VARINT)  # Span.Event.dropped_attributes_count


def event_attrs(hit: ProbeHit, export_addresses: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {PROBE_KIND: hit.kind}
    attrs.update((f.name, f.value) for f in hit.fields if export_addresses or not f.address)
    return attrs


def _event_attrs(hit: ProbeHit, export_addresses: bool, limit: int | None) -> bytes:
    attrs = event_attrs(hit, export_addresses)
    if limit is None or len(attrs) <= limit:
        return key_values(3, attrs)
    kept = dict(list(attrs.items())[:limit])
    return key_values(3, kept) + _DROPPED + varint(len(attrs) - limit)


def probe_events(hits: Iterable[ProbeHit], offset_ns: int, export_addresses: bool,
                 attribute_limit: int | None = None) -> bytes:
    """Span.events fields, one per hit, in the order they fired; at most `attribute_limit` attributes each."""
    return b"".join(len_field(_EVENTS, _TIME + struct.pack("<Q", hit.ts + offset_ns) + len_field(2, hit.spec.encode())
                              + _event_attrs(hit, export_addresses, attribute_limit)) for hit in hits)

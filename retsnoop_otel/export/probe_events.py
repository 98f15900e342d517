"""Injected probes (-J) as OTLP span events: each on the span of the innermost call open when it fired.

Event name: the probe's spec as written (`tp:syscalls:sys_exit_bpf`); attributes: `retsnoop.probe.kind` and the
probe's fields by name (a tracepoint's from its format file, `ret` of a kretprobe). Fields that hold kernel
addresses (pointers, a kprobe's instruction pointer) reveal the KASLR offset: only with export_addresses.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from retsnoop_otel.capture.inject import ProbeHit
from retsnoop_otel.export.protowire import I64, key_values, len_field, tag

PROBE_KIND = "retsnoop.probe.kind"
_EVENTS = 11  # opentelemetry.proto.trace.v1.Span.events
_TIME = tag(1, I64)  # Span.Event.time_unix_nano (fixed64)


def event_attrs(hit: ProbeHit, export_addresses: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {PROBE_KIND: hit.kind}
    attrs.update((f.name, f.value) for f in hit.fields if export_addresses or not f.address)
    return attrs


def probe_events(hits: Iterable[ProbeHit], offset_ns: int, export_addresses: bool) -> bytes:
    """Span.events fields, one per hit, in the order they fired."""
    return b"".join(len_field(_EVENTS, _TIME + struct.pack("<Q", hit.ts + offset_ns) + len_field(2, hit.spec.encode())
                              + key_values(3, event_attrs(hit, export_addresses))) for hit in hits)

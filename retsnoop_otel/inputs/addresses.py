"""Listen addresses as Prometheus exporters take them (exporter-toolkit's `--web.listen-address`): one parser for
the agent's `metrics.listen` and the trace command's flag."""

from __future__ import annotations

import re

from retsnoop_otel.inputs.files import shown
from retsnoop_otel.inputs.numbers import IntRange, NumberError, parse_int

MAX_HOST_CHARS = 253  # a DNS name's limit (RFC 1035)


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' (every address) or '[V6]:PORT' -> (host, port); raises ValueError with the expected form."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\s\[\]]*):(\d+)", text.strip())
    if not m:
        raise ValueError(f"{shown(text)} is not HOST:PORT (for example 0.0.0.0:9464 or [::]:9464)")
    host = m.group(1) if m.group(1) is not None else (m.group(3) or "0.0.0.0")
    if len(host) > MAX_HOST_CHARS:
        raise ValueError(f"{shown(text)}: the host has {len(host)} characters, more than a host name can have "
                         f"({MAX_HOST_CHARS})")
    try:
        port = parse_int(m.group(2) or m.group(4), IntRange(0, 65535, "a TCP port"))
    except NumberError as exc:
        raise ValueError(f"the port {str(exc).replace('must be an integer', 'must be', 1)}") from None
    return host, port

"""What the test receiver stored (protobuf's JSON mapping of OTLP requests) as plain span dicts, for the VM
tests and scenarios: each span with its attributes, its resource's and hex ids."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# process.executable.name of the test's Python processes: /proc/PID/exe of .venv/bin/python (python3.11),
# not the kernel's comm (python)
PYTHON_EXE = os.path.basename(os.path.realpath(sys.executable))


def wait_requests(path: Path, timeout: float) -> list[dict]:
    """The requests the receiver wrote to `path` (one JSON line each), once there is at least one; [] on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (lines := [json.loads(x) for x in path.read_text().splitlines() if x.strip()]):
            return lines
        time.sleep(0.5)
    return []


def value(v: dict) -> Any:
    """An AnyValue: ints as ints (the JSON mapping writes int64 as strings), arrays as lists, the rest as given."""
    (kind, val), = v.items() if v else (("stringValue", ""),)
    if kind == "arrayValue":
        return [value(x) for x in val.get("values", [])]
    return int(val) if kind == "intValue" else val


def attributes(items: list[dict]) -> dict[str, Any]:
    return {a["key"]: value(a["value"]) for a in items}


def _hex(b64: str) -> str:
    return base64.b64decode(b64).hex()


def spans(requests: list[dict]) -> list[dict]:
    """Every span of every request: its JSON fields plus `attrs`, `resource`, `scope` (its name), and
    `trace`/`id`/`parent` in hex."""
    out = []
    for req in requests:
        for rs in req.get("resourceSpans", []):
            res = attributes(rs.get("resource", {}).get("attributes", []))
            for ss in rs.get("scopeSpans", []):
                scope = ss.get("scope", {}).get("name", "")
                for s in ss.get("spans", []):
                    out.append({**s, "trace": _hex(s["traceId"]), "id": _hex(s["spanId"]),
                                "parent": _hex(s["parentSpanId"]) if s.get("parentSpanId") else None,
                                "attrs": attributes(s.get("attributes", [])), "resource": res, "scope": scope})
    return out


def root_span(trace: list[dict]) -> dict:
    """The one root span of a trace (its spans as `spans` gives them)."""
    roots = [s for s in trace if not s.get("parentSpanId")]
    assert len(roots) == 1, "one root span per trace"
    return roots[0]


def assert_nested(trace: list[dict]) -> None:
    """Every span of a trace lies within its parent's time, and its parent is in the same trace."""
    by_id = {s["spanId"]: s for s in trace}
    for s in trace:
        if s.get("parentSpanId"):
            parent = by_id[s["parentSpanId"]]  # every parent is in the same trace
            assert int(parent["startTimeUnixNano"]) <= int(s["startTimeUnixNano"])
            assert int(s["endTimeUnixNano"]) <= int(parent["endTimeUnixNano"])

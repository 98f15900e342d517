"""Jaeger v2 as the demo and the tests run it: the shipped Collector pipeline (config/collector.yaml) on loopback
ports of its own, and the query API its UI reads (legacy /api/traces: tag filters, resource attributes included).

The binary is built and cached by `make setup` (tests/peers/build-jaeger); its UI assets are not in the Go module,
so what a user would see in the UI is read here through the same API.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

from tests.procs import Proc

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "collector.yaml"
VERSION = "v1.75.0"
STARTUP_S = 300.0  # under emulation a Go binary of 80 MB takes a while to start


def cache_dir() -> Path:
    base = os.environ.get("RETSNOOP_OTEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "retsnoop-otel")
    return Path(base)


def binary() -> Path:
    path = cache_dir() / f"jaeger-{VERSION}" / "jaeger"
    if not path.exists():
        raise FileNotFoundError(f"{path}: Jaeger is not built; run `make setup` (tests/peers/build-jaeger)")
    return path


BIND_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Span(NamedTuple):
    """One span as Jaeger's API returns it (legacy JSON: times in microseconds, attributes as tags)."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root (no CHILD_OF reference)
    name: str
    start_us: int
    duration_us: int
    tags: dict[str, Any]
    service: str
    resource: dict[str, Any]  # the process's tags: the resource attributes besides service.name
    events: list[dict[str, Any]]  # logs: {"timestamp", "fields": {...}}


def spans_of(trace: dict) -> list[Span]:
    procs = trace.get("processes", {})
    out = []
    for s in trace.get("spans", []):
        parent = next((r["spanID"] for r in s.get("references", []) if r.get("refType") == "CHILD_OF"), "")
        proc = procs.get(s.get("processID", ""), {})
        out.append(Span(s["traceID"], s["spanID"], parent, s["operationName"], int(s["startTime"]),
                        int(s["duration"]), {t["key"]: t["value"] for t in s.get("tags", [])},
                        proc.get("serviceName", ""), {t["key"]: t["value"] for t in proc.get("tags", [])},
                        [{"timestamp": lg.get("timestamp"), "fields": {f["key"]: f["value"] for f in lg["fields"]}}
                         for lg in s.get("logs", [])]))
    return out


def tree_lines(spans: list[Span]) -> list[str]:
    """An indented tree: name, duration, service, error.type; children by start time."""
    by_parent: dict[str, list[Span]] = {}
    ids = {s.span_id for s in spans}
    for s in spans:
        by_parent.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(by_parent.get(parent, []), key=lambda x: x.start_us):
            err = s.tags.get("error.type", "")
            lines.append(f"{'    ' * depth + s.name:<44} {s.duration_us:8d}us  {s.service:<16} {err}".rstrip())
            walk(s.span_id, depth + 1)

    walk("", 0)
    return lines


class JaegerApi:
    """The query API of a Jaeger at `query` (http://HOST:PORT): what its UI reads. Apart from `Jaeger` because a
    guest queries the host's Jaeger through a forward (tests/vm/host_forwards.py) without starting one."""

    def __init__(self, query: str) -> None:
        self.query = query

    def search_url(self, service: str, tags: dict[str, str] | None = None, lookback: str = "1h",
                   limit: int = 100) -> str:
        """The query the UI's search page makes (/api/traces): by service, with tags (span or resource)."""
        q = {"service": service, "lookback": lookback, "limit": str(limit)}
        if tags:
            q["tags"] = json.dumps(tags, separators=(",", ":"))
        return f"{self.query}/api/traces?{urllib.parse.urlencode(q)}"

    def get(self, url: str) -> dict:
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return {"data": []}
            raise

    def find(self, service: str, tags: dict[str, str] | None = None, limit: int = 100) -> list[dict]:
        return self.get(self.search_url(service, tags, limit=limit)).get("data") or []

    def trace(self, trace_id: str) -> dict | None:
        data = self.get(f"{self.query}/api/traces/{trace_id}").get("data") or []
        return data[0] if data else None

    def wait_trace(self, trace_id: str, timeout: float) -> dict | None:
        """The trace once the store holds it (the tail sampler decides `decision_wait` after its first span), or
        None at `timeout`."""
        deadline = time.monotonic() + timeout
        while (found := self.trace(trace_id)) is None and time.monotonic() < deadline:
            time.sleep(2)
        return found

    def services(self) -> list[str]:
        return self.get(f"{self.query}/api/services").get("data") or []

    def wait_services(self, timeout: float) -> list[str]:
        """The services once any trace reached the store (after the tail sampler's decision), or [] at `timeout`."""
        deadline = time.monotonic() + timeout
        while not (found := self.services()) and time.monotonic() < deadline:
            time.sleep(1)
        return found

    def wait_find(self, service: str, tags: dict[str, str] | None, want: int, timeout: float) -> list[dict]:
        """Until `want` traces match (or `timeout`): the tail sampler decides `decision_wait` after a trace's
        first span, and only then does the trace reach the store."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find(service, tags)
            if len(found) >= want or time.monotonic() > deadline:
                return found
            time.sleep(1)


class Jaeger(JaegerApi):
    """`jaeger --config config/collector.yaml` with every address on `host` (loopback: nothing else reaches it);
    `decision_wait` and `sample_percent` set the tail sampler (errors are always kept)."""

    def __init__(self, host: str = "127.0.0.1", decision_wait: str = "2s", sample_percent: int = 0,
                 ports: dict[str, int] | None = None) -> None:
        self.host = host
        for attempt in range(BIND_ATTEMPTS):
            try:
                self._start(host, decision_wait, sample_percent, ports)
                return
            except TimeoutError as exc:
                # a port free_port() found free was taken before Jaeger bound it (the host tests run beside the
                # VMs and bind ports of their own): again with other ports
                if "process exited" not in str(exc) or "address already in use" not in str(exc) \
                        or attempt == BIND_ATTEMPTS - 1:
                    raise

    def _start(self, host: str, decision_wait: str, sample_percent: int, ports: dict[str, int] | None) -> None:
        p = {name: free_port(host) for name in ("otlp_grpc", "otlp_http", "query_http", "query_grpc", "health",
                                                  "prometheus", "telemetry")}
        p.update(ports or {})
        self.ports = p
        super().__init__(f"http://{host}:{p['query_http']}")
        env = {"OTLP_GRPC_ENDPOINT": f"{host}:{p['otlp_grpc']}", "OTLP_HTTP_ENDPOINT": f"{host}:{p['otlp_http']}",
               "QUERY_HTTP_ENDPOINT": f"{host}:{p['query_http']}", "QUERY_GRPC_ENDPOINT": f"{host}:{p['query_grpc']}",
               "HEALTH_ENDPOINT": f"{host}:{p['health']}", "PROMETHEUS_ENDPOINT": f"{host}:{p['prometheus']}",
               "TELEMETRY_HOST": host, "TELEMETRY_PORT": str(p["telemetry"]),
               "DECISION_WAIT": decision_wait, "SAMPLE_PERCENT": str(sample_percent)}
        self.proc = Proc([str(binary()), "--config", str(CONFIG)], env, str(ROOT))
        self.proc.wait_for_line(r"Everything is ready", STARTUP_S)

    @property
    def otlp_http(self) -> str:
        return f"http://{self.host}:{self.ports['otlp_http']}"

    @property
    def otlp_grpc(self) -> str:
        return f"{self.host}:{self.ports['otlp_grpc']}"

    @property
    def prometheus(self) -> str:
        """Where the Collector's prometheus exporter serves the metrics the agents pushed."""
        return f"http://{self.host}:{self.ports['prometheus']}/metrics"

    def stop(self) -> int:
        return self.proc.terminate(timeout=60)

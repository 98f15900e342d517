"""A real OTLP receiver for tests: traces and metrics over gRPC (TraceService/MetricsService Export)
and HTTP (POST /v1/traces, /v1/metrics).

Only grpcio and opentelemetry-proto are imported (no SDK), so it starts quickly inside a slow VM.
As a program: `python -m tests.otlp_receiver --port 0 [--http-port 0] --out FILE.jsonl` prints
`READY <grpc-port>` (plus ` HTTP <http-port>` when HTTP is on) once listening, and appends every
request to FILE as one JSON line (protobuf JSON mapping), flushed at once. SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import signal
import sys
import threading
import time
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToDict, Parse
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

Request = trace_service_pb2.ExportTraceServiceRequest
MetricsRequest = metrics_service_pb2.ExportMetricsServiceRequest
MAX_MESSAGE = 64 << 20


@dataclass
class Receiver:
    """Running receiver; `requests` grows as exports arrive (guarded by `lock`)."""

    port: int
    http_port: int | None
    requests: list[Any] = field(default_factory=list)
    metric_requests: list[Any] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # per trace request: lower-cased names
    lock: threading.Condition = field(default_factory=threading.Condition)
    out: TextIO | None = None
    keep: bool = True  # False: requests only go to `out` (long runs must not grow in memory)
    _grpc: Any = None
    _http: ThreadingHTTPServer | None = None

    def store(self, request: Any, headers: dict[str, str] | None = None) -> None:
        with self.lock:
            if self.keep and headers is not None and not isinstance(request, MetricsRequest):
                self.headers.append(headers)
            if self.keep:
                (self.metric_requests if isinstance(request, MetricsRequest) else self.requests).append(request)
            if self.out is not None:
                self.out.write(json.dumps(MessageToDict(request)) + "\n")
                self.out.flush()
            self.lock.notify_all()

    def spans(self) -> list[dict[str, Any]]:
        with self.lock:
            return flatten_requests(MessageToDict(r) for r in self.requests)

    def wait_for_spans(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Spans once at least `count` arrived; raises TimeoutError with what did arrive otherwise."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while (have := sum(_span_count(r) for r in self.requests)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"expected {count} spans, received {have}")
                self.lock.wait(left)
        return self.spans()

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=0.5).wait()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()


def _span_count(request: Any) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self._receiver.store(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        self._receiver.store(request, {k.lower(): v for k, v in context.invocation_metadata()})
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            path = self.path.split("?")[0]
            if path not in ("/v1/traces", "/v1/metrics"):
                self.send_error(404, "only /v1/traces and /v1/metrics are served")
                return
            metrics = path == "/v1/metrics"
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            request = MetricsRequest() if metrics else Request()
            json_body = self.headers.get("Content-Type", "").startswith("application/json")
            try:
                if json_body:
                    Parse(json.dumps(_hex_ids_to_base64(json.loads(body))), request)
                else:
                    request.ParseFromString(body)
            except Exception as exc:  # noqa: BLE001 - a bad body is the client's error
                self.send_error(400, f"cannot decode request: {exc}")
                return
            receiver.store(request, {k.lower(): v for k, v in self.headers.items()})
            response = (metrics_service_pb2.ExportMetricsServiceResponse() if metrics
                        else trace_service_pb2.ExportTraceServiceResponse())
            payload = json.dumps(MessageToDict(response)).encode() if json_body else response.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if json_body else "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logs
            pass

    return Handler


def _hex_ids_to_base64(doc: dict[str, Any]) -> dict[str, Any]:
    """OTLP/JSON writes trace and span ids as hex, unlike protobuf's JSON mapping (base64): convert."""
    def fix(obj: dict[str, Any]) -> None:
        for key in ("traceId", "spanId", "parentSpanId"):
            if obj.get(key):
                obj[key] = base64.b64encode(bytes.fromhex(obj[key])).decode()

    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                fix(span)
                for link in span.get("links", []):
                    fix(link)
    return doc


def start_receiver(port: int = 0, http_port: int | None = None, out: TextIO | None = None,
                   host: str = "127.0.0.1") -> Receiver:
    """Listen on host (gRPC on `port`, HTTP on `http_port` if not None; 0 picks a free port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                  ("grpc.so_reuseport", 0)])
    receiver = Receiver(port=0, http_port=None, out=out)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(receiver), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    server.start()
    receiver.port, receiver._grpc = bound, server
    if http_port is not None:
        try:
            httpd = ThreadingHTTPServer((host, http_port), _http_handler(receiver))
        except OSError:
            server.stop(grace=None)
            raise
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, name="otlp-http", daemon=True).start()
        receiver.http_port, receiver._http = httpd.server_address[1], httpd
    return receiver


def _hex_id(b64: str | None) -> str:
    return base64.b64decode(b64).hex() if b64 else ""


def _any_value(value: dict[str, Any]) -> Any:
    if "intValue" in value:
        return int(value["intValue"])  # int64 is a string in the protobuf JSON mapping
    if "arrayValue" in value:
        return [_any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values", []))
    for key in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if key in value:
            return value[key]
    return None


def attributes(kvs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """OTLP KeyValue list (JSON mapping) as a plain dict."""
    return {kv["key"]: _any_value(kv.get("value", {})) for kv in kvs}


def flatten_requests(requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans of JSON-mapped export requests as flat dicts with hex ids, int times, plain attributes."""
    out = []
    for req in requests:
        for rs in req.get("resourceSpans", []):
            resource = attributes(rs.get("resource", {}).get("attributes", []))
            for ss in rs.get("scopeSpans", []):
                scope = ss.get("scope", {})
                for span in ss.get("spans", []):
                    status = span.get("status", {})
                    out.append({
                        "name": span["name"],
                        "trace_id": _hex_id(span.get("traceId")),
                        "span_id": _hex_id(span.get("spanId")),
                        "parent_span_id": _hex_id(span.get("parentSpanId")),
                        "kind": span.get("kind", "SPAN_KIND_UNSPECIFIED"),
                        "start_ns": int(span.get("startTimeUnixNano", 0)),
                        "end_ns": int(span.get("endTimeUnixNano", 0)),
                        "attributes": attributes(span.get("attributes", [])),
                        "status_code": status.get("code", "STATUS_CODE_UNSET"),
                        "status_message": status.get("message", ""),
                        "resource": resource,
                        "scope": {"name": scope.get("name", ""), "version": scope.get("version", "")},
                    })
    return out


def load_spans(path: str | Path) -> list[dict[str, Any]]:
    """Flattened spans from a --out JSON-lines file (a partial last line is ignored)."""
    requests = []
    for line in Path(path).read_text().splitlines():
        try:
            requests.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return flatten_requests(requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OTLP trace receiver for tests")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0: pick a free one)")
    parser.add_argument("--http-port", type=int, default=None, help="also serve OTLP/HTTP on this port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--out", required=True, help="append each request as a JSON line to this file")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with open(args.out, "a", encoding="utf-8") as out:
        receiver = start_receiver(args.port, args.http_port, out, args.host)
        receiver.keep = False  # everything goes to --out
        ready = f"READY {receiver.port}" + (f" HTTP {receiver.http_port}" if receiver.http_port else "")
        print(ready, flush=True)
        try:
            while not stop.wait(0.5):
                pass
        finally:
            receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

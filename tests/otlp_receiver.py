"""A real OTLP receiver for tests: traces and metrics over gRPC (TraceService/MetricsService Export)
and HTTP (POST /v1/traces, /v1/metrics).

Only grpcio and opentelemetry-proto are imported (no SDK), so it starts quickly inside a slow VM.
As a program: `python -m tests.otlp_receiver --port 0 [--http-port 0] --out FILE.jsonl` prints
`READY <grpc-port>` (plus ` HTTP <http-port>` when HTTP is on) once listening, and appends every
request to FILE as one JSON line (protobuf JSON mapping), flushed at once. SIGTERM/SIGINT stop it.

For exporter tests it can also serve TLS (server certificate and key) and require client certificates
(mTLS, `client_ca`) on both transports, fail the next N requests (`fail_next`: gRPC UNAVAILABLE, HTTP 503
with an optional Retry-After), and answer with a partial success (`partial_success`).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import signal
import socket
import ssl
import sys
import threading
import time
import zlib
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
    attempts: int = 0  # every Export call or POST that reached a handler, failed ones included
    http_peers: list[tuple[str, int]] = field(default_factory=list)  # client address of every HTTP request
    partial_success: tuple[int, str] | None = None  # (rejected, message) put into every response when set
    _failures: int = 0
    _connections: set[Any] = field(default_factory=set)  # open HTTP connections, closed by stop()
    _retry_after: str | None = None
    _grpc: Any = None
    _http: ThreadingHTTPServer | None = None

    def fail_next(self, count: int, retry_after: float | None = None) -> None:
        """Fail the next `count` requests: gRPC UNAVAILABLE, HTTP 503 (with Retry-After seconds if given)."""
        with self.lock:
            self._failures = count
            self._retry_after = None if retry_after is None else f"{retry_after:g}"

    def _arrived(self) -> tuple[bool, str | None]:
        """Count an attempt; (whether to fail it, the Retry-After to send)."""
        with self.lock:
            self.attempts += 1
            fail = self._failures > 0
            self._failures -= fail
            self.lock.notify_all()
            return fail, self._retry_after

    def wait_for_attempts(self, count: int, timeout: float = 10.0) -> None:
        with self.lock:
            if not self.lock.wait_for(lambda: self.attempts >= count, timeout):
                raise TimeoutError(f"expected {count} attempts, got {self.attempts}")

    def response(self, metrics: bool) -> Any:
        """The Export response, with the configured partial success if any."""
        if self.partial_success is None:
            return metrics_service_pb2.ExportMetricsServiceResponse() if metrics \
                else trace_service_pb2.ExportTraceServiceResponse()
        rejected, message = self.partial_success
        if metrics:
            return metrics_service_pb2.ExportMetricsServiceResponse(partial_success=metrics_service_pb2.
                ExportMetricsPartialSuccess(rejected_data_points=rejected, error_message=message))
        return trace_service_pb2.ExportTraceServiceResponse(partial_success=trace_service_pb2.
            ExportTracePartialSuccess(rejected_spans=rejected, error_message=message))

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
            with self.lock:  # kept-alive connections too, as a collector that goes away would
                for conn in self._connections:
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


def _span_count(request: Any) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        if self._receiver._arrived()[0]:
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver told to fail")
        self._receiver.store(request)
        return self._receiver.response(metrics=True)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        if self._receiver._arrived()[0]:
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver told to fail")
        self._receiver.store(request, {k.lower(): v for k, v in context.invocation_metadata()})
        return self._receiver.response(metrics=False)


def _http_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a collector: exporters reuse their connection

        def setup(self) -> None:
            super().setup()
            with receiver.lock:
                receiver._connections.add(self.connection)

        def finish(self) -> None:
            with receiver.lock:
                receiver._connections.discard(self.connection)
            super().finish()

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            with receiver.lock:
                receiver.http_peers.append(self.client_address)
            path = self.path.split("?")[0]
            if path not in ("/v1/traces", "/v1/metrics"):
                self.send_error(404, "only /v1/traces and /v1/metrics are served")
                return
            metrics = path == "/v1/metrics"
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            fail, retry_after = receiver._arrived()
            if fail:
                self.send_response(503)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            encoding = self.headers.get("Content-Encoding", "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
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
            response = receiver.response(metrics)
            payload = json.dumps(MessageToDict(response)).encode() if json_body else response.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if json_body else "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logs
            pass

    return Handler


class _TlsHTTPServer(ThreadingHTTPServer):
    """HTTPS: the TLS handshake runs in the request's own thread, so a bad client cannot stall accept()."""

    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        super().finish_request(self.context.wrap_socket(request, server_side=True), client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # failed handshakes (e.g. no client certificate) are what mTLS tests expect


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


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
                   host: str = "127.0.0.1", *, tls_cert: str | None = None, tls_key: str | None = None,
                   client_ca: str | None = None) -> Receiver:
    """Listen on host (gRPC on `port`, HTTP on `http_port` if not None; 0 picks a free port).

    With tls_cert/tls_key (PEM paths) both transports serve TLS; with client_ca too they require a client
    certificate signed by that CA (mTLS)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                  ("grpc.so_reuseport", 0)])
    receiver = Receiver(port=0, http_port=None, out=out)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(receiver), server)
    if tls_cert is not None:
        credentials = grpc.ssl_server_credentials([(_read(tls_key), _read(tls_cert))],
                                                  root_certificates=_read(client_ca),
                                                  require_client_auth=client_ca is not None)
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    server.start()
    receiver.port, receiver._grpc = bound, server
    if http_port is not None:
        try:
            if tls_cert is not None:
                httpd = _TlsHTTPServer((host, http_port), _http_handler(receiver))
                httpd.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                httpd.context.load_cert_chain(tls_cert, tls_key)
                if client_ca is not None:
                    httpd.context.load_verify_locations(client_ca)
                    httpd.context.verify_mode = ssl.CERT_REQUIRED
            else:
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
            resource_schema = rs.get("schemaUrl", "")
            for ss in rs.get("scopeSpans", []):
                scope = ss.get("scope", {})
                scope_schema = ss.get("schemaUrl", "")
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
                        "trace_state": span.get("traceState", ""),
                        "resource_schema_url": resource_schema,
                        "scope_schema_url": scope_schema,
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
    parser.add_argument("--tls-cert", help="serve TLS with this PEM certificate (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--client-ca", help="require client certificates signed by this PEM CA (mTLS)")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None) or (args.client_ca and not args.tls_cert):
        parser.error("--tls-cert and --tls-key go together, and --client-ca needs them")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with open(args.out, "a", encoding="utf-8") as out:
        receiver = start_receiver(args.port, args.http_port, out, args.host, tls_cert=args.tls_cert,
                                  tls_key=args.tls_key, client_ca=args.client_ca)
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

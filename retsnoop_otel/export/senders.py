"""Senders of already-serialized OTLP requests: gRPC, HTTP (protobuf) and an OTLP/JSON lines file.

The span encoder and the metrics pusher produce Export{Trace|Metrics}ServiceRequest bytes themselves, so a
sender only moves bytes, retries transient failures within one deadline (protocol/exporter.md "Retry" and the
OTLP specification's retryable gRPC codes and HTTP statuses) and reports partial success. Only public APIs
are used (stdlib, grpcio, protobuf, opentelemetry-proto), none of the SDK's exporter internals.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import random
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from retsnoop_otel import __version__
from retsnoop_otel.export.otlp_settings import OtlpConfigError, OtlpSettings, describe

USER_AGENT = f"retsnoop-otel/{__version__}"
MAX_MESSAGE = 64 << 20
FIRST_BACKOFF_S = 1.0
# signal -> (gRPC method, request class, response class, partial-success field)
_SIGNAL: dict[str, tuple[str, Any, Any, str]] = {
    "traces": ("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
               trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse,
               "rejected_spans"),
    "metrics": ("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse,
                "rejected_data_points"),
}
# RESOURCE_EXHAUSTED is retryable only with RetryInfo in the status details, which we do not parse.
RETRYABLE_GRPC = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class SendResult:
    ok: bool
    rejected: int = 0  # items the receiver refused in a partial success (rejected_spans / rejected_data_points)
    error: str | None = None  # one line, for logs and counters (with ok=True: the partial success message)


class Sender(Protocol):
    def send(self, body: bytes, items: int) -> SendResult: ...  # body: a serialized Export*ServiceRequest
    def shutdown(self) -> None: ...  # aborts retry waits at once; later sends fail fast


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:limit]


def _partial(response: Any, field: str) -> SendResult:
    ps = response.partial_success
    return SendResult(True, rejected=getattr(ps, field), error=_one_line(ps.error_message) or None)


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class _Retrying:
    """The retry loop shared by the network senders: exponential backoff from 1 s (factor 2, +/-20% jitter) or
    the server's Retry-After, all attempts inside one deadline of settings.timeout_s; waits on an Event so that
    shutdown() from another thread ends them at once."""

    def __init__(self, settings: OtlpSettings) -> None:
        self.settings = settings
        self._stopped = threading.Event()

    def send(self, body: bytes, items: int) -> SendResult:
        if self._stopped.is_set():
            return SendResult(False, error="sender is shut down")
        deadline = time.monotonic() + self.settings.timeout_s
        payload, backoff = self._encode(body), FIRST_BACKOFF_S
        while True:
            result, retry, delay = self._attempt(payload, deadline)
            if not retry:
                return result
            wait = delay if delay is not None else backoff * random.uniform(0.8, 1.2)
            backoff *= 2
            if not self._stopped.is_set() and time.monotonic() + wait >= deadline:
                return result  # the next attempt could not start before the deadline
            if self._stopped.is_set() or self._stopped.wait(wait):
                return SendResult(False, error=f"shut down before retrying: {result.error}")

    def shutdown(self) -> None:
        self._stopped.set()

    def _encode(self, body: bytes) -> bytes:
        return body

    def _attempt(self, payload: bytes, deadline: float) -> tuple[SendResult, bool, float | None]:
        """(result, retryable, server-requested delay in seconds or None)."""
        raise NotImplementedError


class GrpcSender(_Retrying):
    """Unary Export calls with the request bytes as they are (no serializer: nothing is parsed again)."""

    def __init__(self, settings: OtlpSettings) -> None:
        super().__init__(settings)
        method, _, response_cls, self._field = _SIGNAL[settings.signal]
        options = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.primary_user_agent", USER_AGENT)]
        if settings.tls:
            credentials = grpc.ssl_channel_credentials(_read(settings.certificate), _read(settings.client_key),
                                                       _read(settings.client_certificate))
            self._channel = grpc.secure_channel(settings.target, credentials, options)
        else:
            self._channel = grpc.insecure_channel(settings.target, options)
        self._export = self._channel.unary_unary(method, request_serializer=None,
                                                 response_deserializer=response_cls.FromString)
        self._compression = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate,
                             "none": grpc.Compression.NoCompression}[settings.compression]

    def _attempt(self, payload: bytes, deadline: float) -> tuple[SendResult, bool, float | None]:
        left = deadline - time.monotonic()
        if left <= 0:
            return SendResult(False, error="DEADLINE_EXCEEDED: no time left for an attempt"), False, None
        try:
            response = self._export(payload, timeout=left, metadata=self.settings.headers or None,
                                    compression=self._compression)
        except grpc.RpcError as err:
            if not isinstance(err, grpc.Call):  # raised RpcErrors of unary calls are Calls too (grpcio docs)
                return SendResult(False, error=_one_line(f"gRPC error: {err}")), False, None
            code = err.code()
            return SendResult(False, error=_one_line(f"{code.name}: {err.details()}")), code in RETRYABLE_GRPC, None
        except (ValueError, TypeError) as exc:  # the channel was closed by shutdown(), or bad metadata
            why = "sender is shut down" if self._stopped.is_set() else "cannot start the call"
            return SendResult(False, error=_one_line(f"{why}: {exc}")), False, None
        return _partial(response, self._field), False, None

    def shutdown(self) -> None:
        super().shutdown()
        self._channel.close()  # also cancels an RPC in flight; the canceled send is not retried


class HttpSender(_Retrying):
    """POSTs over one kept-alive connection (http.client), reconnecting after errors. One sending thread at a
    time (the export worker); shutdown() may come from any thread."""

    def __init__(self, settings: OtlpSettings) -> None:
        super().__init__(settings)
        parts = urlsplit(settings.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        _, _, self._response_cls, self._field = _SIGNAL[settings.signal]
        self._headers = {"User-Agent": USER_AGENT, **dict(settings.headers), "Content-Type": "application/x-protobuf"}
        if settings.compression != "none":
            self._headers["Content-Encoding"] = settings.compression
        self._context: ssl.SSLContext | None = None
        if self._https:
            try:
                self._context = ssl.create_default_context(cafile=settings.certificate)
                if settings.client_certificate:
                    self._context.load_cert_chain(settings.client_certificate, settings.client_key)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise OtlpConfigError(f"{describe(settings)}: cannot load the TLS certificate or key ({exc}); "
                                      "give PEM files for certificate, client_key and client_certificate") from None
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # guards _conn and _busy between send() and shutdown()
        self._busy = False

    def _encode(self, body: bytes) -> bytes:
        if self.settings.compression == "gzip":
            return gzip.compress(body, compresslevel=6, mtime=0)
        if self.settings.compression == "deflate":
            return zlib.compress(body, 6)  # HTTP "deflate" is the zlib format (RFC 9110)
        return body

    def send(self, body: bytes, items: int) -> SendResult:
        with self._lock:
            self._busy = True
        try:
            return super().send(body, items)
        finally:
            with self._lock:
                self._busy = False
                if self._stopped.is_set():
                    self._close_locked()

    def shutdown(self) -> None:
        super().shutdown()
        with self._lock:
            if not self._busy:
                self._close_locked()
            elif self._conn is not None and self._conn.sock is not None:
                try:  # wake the sending thread out of a blocking read; it closes the connection itself
                    self._conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _attempt(self, payload: bytes, deadline: float) -> tuple[SendResult, bool, float | None]:
        for _ in range(2):
            left = deadline - time.monotonic()
            if left <= 0:
                return SendResult(False, error="timed out: no time left for an attempt"), False, None
            with self._lock:
                if self._conn is None:
                    self._conn = (http.client.HTTPSConnection(self._host, self._port, context=self._context)
                                  if self._https else http.client.HTTPConnection(self._host, self._port))
                conn = self._conn
            reused = conn.sock is not None
            try:
                conn.timeout = left
                if conn.sock is not None:
                    conn.sock.settimeout(left)
                conn.request("POST", self._path, body=payload, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                with self._lock:
                    self._close_locked()
                error = _one_line(f"connection error: {type(exc).__name__}: {exc}")
                if isinstance(exc, ssl.SSLError):  # certificates or TLS settings: retrying will not help
                    return SendResult(False, error=error), False, None
                if reused and not isinstance(exc, TimeoutError) and not self._stopped.is_set():
                    continue  # the server closed an idle kept-alive connection: reconnect at once, once
                return SendResult(False, error=error), True, None
            return self._result(response, data)
        raise AssertionError("unreachable")

    def _result(self, response: http.client.HTTPResponse, data: bytes) -> tuple[SendResult, bool, float | None]:
        if 200 <= response.status < 300:
            try:
                return _partial(self._response_cls.FromString(data), self._field), False, None
            except DecodeError:
                return SendResult(True), False, None  # accepted; an unreadable response adds nothing
        error = f"HTTP {response.status}: {_one_line(data[:200].decode('utf-8', 'replace'))}".rstrip(": ")
        retry = response.status in RETRYABLE_HTTP
        delay = None
        after = (response.getheader("Retry-After") or "").strip()
        if retry and after:
            try:  # seconds only; an HTTP-date falls back to the exponential backoff
                delay = max(0.0, float(after))
            except ValueError:
                pass
        return SendResult(False, error=error), retry, delay


def build_sender(settings: OtlpSettings) -> Sender:
    """The one exporter builder: a GrpcSender or an HttpSender for the resolved settings."""
    return GrpcSender(settings) if settings.protocol == "grpc" else HttpSender(settings)


def _hex_ids(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where the protobuf JSON mapping would use base64."""
    if isinstance(obj, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                    else _hex_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


class OtlpJsonFileSender:
    """Appends each request as one OTLP/JSON line (the collector's file format: integer enums, hex ids)."""

    def __init__(self, path: str, signal: str = "traces") -> None:
        self.path = path
        self._request_cls = _SIGNAL[signal][1]
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the sender's life

    def send(self, body: bytes, items: int) -> SendResult:
        try:
            request = self._request_cls.FromString(body)
        except DecodeError as exc:
            return SendResult(False, error=_one_line(f"cannot decode the request: {exc}"))
        doc = _hex_ids(MessageToDict(request, use_integers_for_enums=True))
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file.closed:
                return SendResult(False, error="sender is shut down")
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                return SendResult(False, error=_one_line(f"cannot write {self.path}: {exc.strerror or exc}"))
        return SendResult(True)

    def shutdown(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:
                pass  # a failed final flush was already reported by send()

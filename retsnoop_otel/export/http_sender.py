"""OTLP/HTTP: protobuf POSTs over one kept-alive http.client connection, gzip or deflate, TLS and mTLS.

http.client (with the email package it parses headers with), gzip and, over plain HTTP, ssl are imported by the
export thread at its first send, not in a start's inputs phase (bench/RESULTS.md, issue 48).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from retsnoop_otel.export.otlp_settings import OtlpConfigError, OtlpSettings, describe
from retsnoop_otel.export.sending import (
    RETRYABLE_HTTP,
    USER_AGENT,
    Retrying,
    SendResult,
    one_line,
    partial_success,
    signal_messages,
)
from retsnoop_otel.inputs.tls_files import load_key_pair

if TYPE_CHECKING:
    import http.client
    import ssl

GRPC_PORT_HINT = ("the server answered in HTTP/2, as an OTLP/gRPC receiver does (port 4317?): send OTLP/HTTP to "
                  "its OTLP/HTTP port (4318), or set the protocol to grpc")


def _http2_settings(line: str) -> bool:
    """Whether a status line is an HTTP/2 SETTINGS frame (RFC 9113 4.1, 6.5), which a gRPC server sends first."""
    return len(line) >= 4 and line[:2] == "\x00\x00" and line[3] == "\x04"


class HttpSender(Retrying):
    """POSTs over one kept-alive connection (http.client), reconnecting after errors. One sending thread at a
    time (the export worker); shutdown() may come from any thread."""

    def __init__(self, settings: OtlpSettings) -> None:
        super().__init__(settings)
        parts = urlsplit(settings.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._signal = settings.signal  # its response class is read at the first answer (signal_messages)
        self._headers = {"User-Agent": USER_AGENT, **dict(settings.headers), "Content-Type": "application/x-protobuf"}
        if settings.compression != "none":
            self._headers["Content-Encoding"] = settings.compression
        self._context: ssl.SSLContext | None = None
        if self._https:
            import ssl  # here, at start: a certificate or key that cannot load refuses the run

            try:
                # the bytes read and checked at start (otlp_settings), not the files again
                ca = settings.ca_data
                self._context = ssl.create_default_context(cadata=None if ca is None else ca.decode("latin-1"))
                if settings.client_pair:
                    load_key_pair(self._context, settings.client_pair)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise OtlpConfigError(f"{describe(settings)}: cannot load the TLS certificate or key ({exc}); "
                                      "give PEM files for certificate, client_key and client_certificate") from None
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # guards _conn and _busy between send() and shutdown()
        self._busy = False

    def _encode(self, body: bytes) -> bytes:
        if self.settings.compression == "gzip":
            import gzip

            return gzip.compress(body, compresslevel=6, mtime=0)
        if self.settings.compression == "deflate":
            import zlib

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
        import http.client
        import ssl

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
                error = one_line(f"connection error: {type(exc).__name__}: {exc}")
                if isinstance(exc, ssl.SSLError):  # certificates or TLS settings: retrying will not help
                    return SendResult(False, error=error), False, None
                if isinstance(exc, http.client.BadStatusLine) and _http2_settings(exc.line):
                    return SendResult(False, error=GRPC_PORT_HINT), False, None  # a gRPC port stays one
                if reused and not isinstance(exc, TimeoutError) and not self._stopped.is_set():
                    continue  # the server closed an idle kept-alive connection: reconnect at once, once
                return SendResult(False, error=error), True, None
            return self._result(response, data)
        raise AssertionError("unreachable")

    def _result(self, response: http.client.HTTPResponse, data: bytes) -> tuple[SendResult, bool, float | None]:
        if 200 <= response.status < 300:
            # in the export thread, not at start: the protobuf runtime is a quarter of an agent's start imports
            from google.protobuf.message import DecodeError

            _, _, response_cls, field = signal_messages(self._signal)
            try:
                return partial_success(response_cls.FromString(data), field), False, None
            except DecodeError:
                return SendResult(True), False, None  # accepted; an unreadable response adds nothing
        error = f"HTTP {response.status}: {one_line(data[:200].decode('utf-8', 'replace'))}".rstrip(": ")
        retry = response.status in RETRYABLE_HTTP
        delay = None
        after = (response.getheader("Retry-After") or "").strip()
        if retry and after:
            try:  # seconds only; an HTTP-date falls back to the exponential backoff
                delay = max(0.0, float(after))
            except ValueError:
                pass
        return SendResult(False, error=error), retry, delay

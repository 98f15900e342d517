"""What answers on the /metrics listener once it serves (metrics/server.py binds it): the HTTP server around its bound
socket, and the routes. `/metrics` is prometheus_client's own WSGI app (OpenMetrics negotiation, gzip, `name[]`
filter), so the exposition format stays theirs; around it: `/healthz`, HEAD, 405/404, a one-line 500 when a
collector fails, quiet logs. With a web config (web_config.py), every path is served over TLS and behind basic auth
alike, as exporter-toolkit does: the TLS handshake and the password check run in the connection's own worker
thread, never in the accepting one, the handshake within HANDSHAKE_TIMEOUT_S; when every password check slot is
taken a login that needs one gets a 503 at once (basic_auth.py).

Apart from the listener because its imports (wsgiref, http.server, email, prometheus_client) are most of what
binding /metrics used to cost a start: the listener binds in the inputs phase, and this loads while the kernel
phases run (runtime/prefetch.py).
"""

from __future__ import annotations

import json
import socket
import socketserver
import ssl
import sys
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import make_wsgi_app

from retsnoop_otel.metrics.basic_auth import REALM, BasicAuth, Verdict
from retsnoop_otel.metrics.web_config import WebConfig
from retsnoop_otel.metrics.web_tls import WebWatcher, san_allowed

# (healthy, details): details become the JSON body; unhealthy answers 503
HealthFn = Callable[[], tuple[bool, dict[str, Any]]]
_Response = tuple[str, list[tuple[str, str]], bytes]
_TEXT = "text/plain; charset=utf-8"
HANDSHAKE_TIMEOUT_S = 10.0  # a client that connects and stays silent does not hold a thread longer
TLS_RECORD_HANDSHAKE = 0x16  # the first byte of every TLS connection (a ClientHello record)
_PLAIN_TO_TLS = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
                 b"Client sent an HTTP request to an HTTPS server.\n")


class _Handler(WSGIRequestHandler):
    timeout = 30  # a client that stops talking does not hold a thread forever
    error_content_type = _TEXT  # malformed requests get a one-line 400, not http.server's HTML page
    error_message_format = "%(code)d %(message)s\n"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no line per request
        pass


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    web: WebWatcher | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's worker thread: TLS first when the web config asks for it."""
        web = self.web.current() if self.web is not None else None
        if web is None or web.context is None:
            return super().finish_request(request, client_address)
        conn = _tls_accept(request, web)
        if conn is None:
            return None
        try:
            super().finish_request(conn, client_address)
        finally:
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()
        return None

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that stalls or resets: not worth a traceback
            super().handle_error(request, client_address)


def _refuse_plain(sock: socket.socket) -> None:
    """Go's answer to plain HTTP on a TLS port; the request is read first, so closing does not reset the
    connection before the client has read the answer."""
    sock.sendall(_PLAIN_TO_TLS)
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(1.0)
    for _ in range(16):
        if not sock.recv(4096):
            break


def _tls_accept(sock: socket.socket, web: WebConfig) -> ssl.SSLSocket | None:
    """The handshaken connection, or None (after a plain-text 400 to a plain HTTP client) when it fails."""
    assert web.context is not None and web.tls is not None
    sock.settimeout(HANDSHAKE_TIMEOUT_S)  # CPython applies it to the whole handshake, not to each read
    try:
        first = sock.recv(1, socket.MSG_PEEK)
        if first and first[0] != TLS_RECORD_HANDSHAKE:
            _refuse_plain(sock)
            return None
        if not first:
            return None
        conn = web.context.wrap_socket(sock, server_side=True)
    except (OSError, ValueError):  # ssl.SSLError and timeouts are OSErrors
        return None
    if web.tls.allowed_sans and not san_allowed(conn.getpeercert(), web.tls.allowed_sans):
        conn.close()  # as the toolkit does: the connection ends, nothing is served
        return None
    return conn


class _Server6(_Server):
    address_family = socket.AF_INET6


def _text(status: str, message: str, *extra: tuple[str, str]) -> _Response:
    return status, [("Content-Type", _TEXT), *extra], (message + "\n").encode()


class _App:
    """Routes requests; every answer has a Content-Length, and HEAD gets GET's headers without the body."""

    def __init__(self, registry: CollectorRegistry, health: HealthFn, server: _Server) -> None:
        self._metrics_app = make_wsgi_app(registry)
        self._health = health
        self._server = server
        self._auth = BasicAuth()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        web = self._server.web.current() if self._server.web is not None else None
        extra = list(web.headers) if web is not None else []
        verdict = self._auth.check(environ.get("HTTP_AUTHORIZATION"), web.users) \
            if web is not None and web.users else Verdict.ALLOWED
        if verdict is Verdict.REFUSED:
            status, headers, body = _text("401 Unauthorized", "401 Unauthorized: this endpoint needs basic auth",
                                          ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"'))
        elif verdict is Verdict.BUSY:
            status, headers, body = _text("503 Service Unavailable", "503 Service Unavailable: too many password "
                                          "checks at once; retry later", ("Retry-After", "1"))
        elif method not in ("GET", "HEAD"):
            status, headers, body = _text("405 Method Not Allowed", f"{method} is not allowed: use GET or HEAD",
                                          ("Allow", "GET, HEAD"))
        elif path == "/metrics":
            status, headers, body = self._metrics(environ)
        elif path == "/healthz":
            ok, details = self._health()
            status = "200 OK" if ok else "503 Service Unavailable"
            headers, body = [("Content-Type", "application/json")], (json.dumps(details, default=str) + "\n").encode()
        elif path == "/":
            status, headers, body = _text("200 OK", "retsnoop-otel: /metrics /healthz")
        else:
            status, headers, body = _text("404 Not Found", f"not found: {path}; try /metrics or /healthz")
        start_response(status, [*headers, *extra, ("Content-Length", str(len(body)))])
        return [] if method == "HEAD" else [body]

    def _metrics(self, environ: dict[str, Any]) -> _Response:
        # Called as GET whatever the method: prometheus_client 0.26 answers 405 to HEAD, 0.20 serves any method.
        answer: list[Any] = []
        chunks: list[bytes] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            answer[:] = [status, headers]
            return chunks.append

        try:
            chunks.extend(self._metrics_app({**environ, "REQUEST_METHOD": "GET"}, start))
        except Exception as exc:  # noqa: BLE001 - a failing collector gives a 500, not a traceback on stderr
            why = " ".join(str(exc).split()) or type(exc).__name__
            return _text("500 Internal Server Error", f"metrics collection failed: {why}")
        status, headers = answer
        return status, [(k, v) for k, v in headers if k.lower() != "content-length"], b"".join(chunks)




def serve_on(sock: socket.socket, registry: CollectorRegistry, health: HealthFn, web: WebWatcher | None) -> _Server:
    """The server around `sock`, bound by the listener and listening: serve_forever() answers from then on."""
    server = (_Server6 if sock.family == socket.AF_INET6 else _Server)(sock.getsockname()[:2], _Handler,
                                                                     bind_and_activate=False)
    server.socket.close()  # socketserver makes a socket of its own; the listener's is the one bound
    server.socket = sock
    server.server_address = sock.getsockname()
    server.server_name, server.server_port = server.server_address[:2]
    server.setup_environ()
    server.web = web
    server.set_app(_App(registry, health, server))
    return server

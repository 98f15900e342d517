"""The one HTTP listener for `/metrics` and `/healthz`, used by both `trace --metrics-port` and `agent`.

One server, so both commands answer scrapes, probes and bind errors the same way. `/metrics` is
prometheus_client's own WSGI app (OpenMetrics negotiation, gzip, `name[]` filter), so the
exposition format stays theirs; around it we add `/healthz`, HEAD, 405/404, a one-line 500 when a
collector fails, quiet logs, and bind errors that say what to change. With a web config (web_config.py),
every path is served over TLS and behind basic auth alike, as exporter-toolkit does: the TLS handshake and the
password check run in the connection's own worker thread, never in the accepting one, the handshake within
HANDSHAKE_TIMEOUT_S; when every password check slot is taken a login that needs one gets a 503 at once
(basic_auth.py).
"""

from __future__ import annotations

import errno
import json
import socket
import socketserver
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import make_wsgi_app

from retsnoop_otel.inputs.files import plain
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


class ListenError(RuntimeError):
    """The address cannot be bound: one line naming the address, why, and what to change."""


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

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves getfqdn(host), a DNS lookup that can stall startup
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()

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


def _why(exc: Exception, host: str, setting: str, host_setting: str) -> str:
    """`setting` names the port (and the address, when one flag or key says both); `host_setting` the address."""
    if isinstance(exc, OverflowError):
        return f"the port must be 0-65535; fix {setting}"
    code = getattr(exc, "errno", None)
    if isinstance(exc, (ValueError, socket.gaierror)) or code == errno.EADDRNOTAVAIL:
        return (f"{plain(host)} is not an address of this machine: use one of its addresses, 0.0.0.0 (all IPv4) "
                f"or :: (all IPv6) in {host_setting}")
    if code == errno.EADDRINUSE:
        return (f"the address is already in use (another agent or exporter?): pick another port with {setting} "
                "or stop the other process")
    if code == errno.EACCES:
        return f"permission denied: ports below 1024 need CAP_NET_BIND_SERVICE; pick a port above 1023 with {setting}"
    return f"{getattr(exc, 'strerror', None) or exc}; check {setting}"


def _address(host: str, port: int) -> str:
    """HOST:PORT, [V6]:PORT, as a message shows it (cut, escaped)."""
    return f"[{plain(host)}]:{port}" if ":" in host and not host.startswith("[") else f"{plain(host)}:{port}"


class MetricsServer:
    """Binds at once (a busy or privileged port fails before anything else starts) and answers only from
    `start`, from a daemon thread until `close`: until then a connection is refused, so nobody reads
    "up" or "healthy" before the run is (the agent starts it once its probes are attached). Port 0 picks a
    free port; `port` is the bound one."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, health: HealthFn, *,
                 setting: str = "metrics.listen", host_setting: str = "", web: WebWatcher | None = None) -> None:
        try:
            # bound but not listening: the kernel refuses connections to it (RST) until start()
            self._server = (_Server6 if ":" in host else _Server)((host, port), _Handler, bind_and_activate=False)
            try:
                self._server.server_bind()
            except BaseException:
                self._server.server_close()
                raise
        except (OSError, OverflowError, ValueError) as exc:
            raise ListenError(f"cannot listen on {_address(host, port)}: "
                              f"{_why(exc, host, setting, host_setting or setting)}") from None
        self._server.web = web
        self._server.set_app(_App(registry, health, self._server))
        self.host = host
        self.port: int = self._server.server_address[1]
        self._setting, self._host_setting = setting, host_setting or setting
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        """Listen and answer from now on."""
        with self._lock:
            if self._thread is None and not self._closed:
                try:  # another process that bound the port meanwhile (SO_REUSEADDR) and listened first
                    self._server.server_activate()
                except OSError as exc:
                    raise ListenError(f"cannot listen on {_address(self.host, self.port)}: "
                                      f"{_why(exc, self.host, self._setting, self._host_setting)}") from None
                self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
                self._thread.start()
        return self

    @property
    def scheme(self) -> str:
        web = self._server.web.current() if self._server.web is not None else None
        return "https" if web is not None and web.context is not None else "http"

    def use_web(self, web: WebWatcher | None) -> None:
        """Another web config for the connections from now on (the agent's SIGHUP), without re-binding."""
        self._server.web = web

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:  # shutdown() waits for serve_forever, which never ran without start()
            self._server.shutdown()
        self._server.server_close()
        if thread is not None:
            thread.join()

"""The one HTTP listener for `/metrics` and `/healthz`, used by both `trace --metrics-port` and `agent`.

One listener, so both commands answer scrapes, probes and bind errors the same way. It binds in the inputs
phase with the socket module alone (a busy or privileged port fails before the kernel is touched), and what
answers on it (metrics/http_app.py: the HTTP server, the routes and the exposition library) is imported when it
starts serving, once the run is attached.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable
from typing import Any

from retsnoop_otel.inputs.files import plain

BACKLOG = 5  # socketserver's request_queue_size


class ListenError(RuntimeError):
    """The address cannot be bound: one line naming the address, why, and what to change."""


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


def _bound(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEADDR, not listening: the kernel refuses connections to it
    (RST) until start(). As socketserver's HTTP servers bind, without their DNS lookup of the host's name."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class MetricsServer:
    """Binds at once (a busy or privileged port fails before anything else starts) and answers only from
    `start`, from a daemon thread until `close`: until then a connection is refused, so nobody reads
    "up" or "healthy" before the run is (the agent starts it once its probes are attached). Port 0 picks a
    free port; `port` is the bound one. `registry`: the CollectorRegistry to serve, or what makes it at start;
    `health`: http_app.HealthFn."""

    def __init__(self, host: str, port: int, registry: Any, health: Callable[[], tuple[bool, dict[str, Any]]], *,
                 setting: str = "metrics.listen", host_setting: str = "", web: Any = None) -> None:
        try:
            self._sock = _bound(host, port)
        except (OSError, OverflowError, ValueError) as exc:
            raise ListenError(f"cannot listen on {_address(host, port)}: "
                              f"{_why(exc, host, setting, host_setting or setting)}") from None
        self._registry, self._health, self._web = registry, health, web
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._setting, self._host_setting = setting, host_setting or setting
        self._lock = threading.Lock()
        self._closed = False
        self._server: Any = None  # http_app's server, from start()
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        """Listen and answer from now on."""
        with self._lock:
            if self._thread is None and not self._closed:
                try:  # another process that bound the port meanwhile (SO_REUSEADDR) and listened first
                    self._sock.listen(BACKLOG)
                except OSError as exc:
                    raise ListenError(f"cannot listen on {_address(self.host, self.port)}: "
                                      f"{_why(exc, self.host, self._setting, self._host_setting)}") from None
                from retsnoop_otel.metrics.http_app import serve_on
                registry = self._registry() if callable(self._registry) else self._registry
                self._server = serve_on(self._sock, registry, self._health, self._web)
                self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
                self._thread.start()
        return self

    @property
    def scheme(self) -> str:
        web = self._web.current() if self._web is not None else None
        return "https" if web is not None and web.context is not None else "http"

    def use_web(self, web: Any) -> None:
        """Another web config (metrics.web_tls.WebWatcher) for the connections from now on (the agent's SIGHUP),
        without re-binding."""
        with self._lock:
            self._web = web
            if self._server is not None:
                self._server.web = web

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, server = self._thread, self._server
        if thread is not None:  # shutdown() waits for serve_forever, which never ran without start()
            server.shutdown()
        if server is not None:
            server.server_close()
        else:
            self._sock.close()
        if thread is not None:
            thread.join()

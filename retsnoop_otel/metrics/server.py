"""The agent's HTTP endpoint: /metrics (Prometheus text or OpenMetrics) and /healthz, one listener.

prometheus_client's own server serves only metrics; the agent also needs a health answer that
Kubernetes liveness probes and load balancers can use, so both live on one small threaded server.
"""

from __future__ import annotations

import errno
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

# (healthy, details): details become the JSON body; unhealthy answers 503
HealthFn = Callable[[], tuple[bool, dict[str, Any]]]


class ListenError(RuntimeError):
    """The metrics address cannot be bound: names the address and how to fix it."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _handler(registry: CollectorRegistry, health: HealthFn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                try:
                    body = encoder(registry)
                except Exception as exc:  # noqa: BLE001 - a failing reader must give a 500, not a dead thread
                    self._send(500, "text/plain; charset=utf-8", f"metrics collection failed: {exc}\n".encode())
                    return
                self._send(200, content_type, body)
            elif path == "/healthz":
                ok, details = health()
                self._send(200 if ok else 503, "application/json",
                           (json.dumps(details, default=str) + "\n").encode())
            elif path == "/":
                self._send(200, "text/plain; charset=utf-8", b"retsnoop-otel agent: /metrics /healthz\n")
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no line per scrape
            pass

    return Handler


class HttpServer:
    """Serves until `close`; port 0 picks a free port (see `port`)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, health: HealthFn) -> None:
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        server_cls = _Server
        if ":" in host:
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        try:
            self._server = server_cls((host, port), _handler(registry, health))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ListenError(f"cannot listen on {listen}: the address is already in use (another agent or "
                                  "exporter?); change metrics.listen in the config or stop the other process") from None
            if exc.errno == errno.EACCES:
                raise ListenError(f"cannot listen on {listen}: permission denied (ports below 1024 need "
                                  "CAP_NET_BIND_SERVICE); pick a port above 1023 in metrics.listen") from None
            raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}; check metrics.listen "
                              "(host must be a local address)") from None
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

"""The /metrics + /healthz server over real sockets with real HTTP clients."""

from __future__ import annotations

import errno
import gzip
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

import retsnoop_otel.metrics.http_app as server_module
from retsnoop_otel.metrics.http_app import HealthFn
from retsnoop_otel.metrics.server import ListenError, MetricsServer

REPO = Path(__file__).resolve().parents[2]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class _Static:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("retsnoop_demo_a", "First demo gauge.", value=1)
        yield GaugeMetricFamily("retsnoop_demo_b", "Second demo gauge.", value=2)


class _Broken:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        raise RuntimeError("kallsyms went away\nsecond line")


def _registry(collector: Any, auto_describe: bool = False) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=auto_describe)
    registry.register(collector)
    return registry


@contextmanager
def serve(collector: Any = None, health: HealthFn = lambda: (True, {"status": "ok"}),
          host: str = "127.0.0.1") -> Iterator[MetricsServer]:
    server = MetricsServer(host, 0, _registry(collector or _Static()), health).start()
    try:
        yield server
    finally:
        server.close()


def fetch(server: MetricsServer, method: str, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_prometheus_text_by_default() -> None:
    with serve() as server:
        status, headers, body = fetch(server, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "retsnoop_demo_a 1.0\n" in body.decode() and "# EOF" not in body.decode()
    assert int(headers["content-length"]) == len(body) and "content-encoding" not in headers


def test_openmetrics_when_accept_asks_for_it() -> None:
    with serve() as server:
        status, headers, body = fetch(server, "GET", "/metrics", Accept=OPENMETRICS)
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.decode().endswith("# EOF\n") and "retsnoop_demo_b 2.0\n" in body.decode()


def test_gzip_when_client_accepts_it() -> None:
    with serve() as server:
        _, _, plain = fetch(server, "GET", "/metrics")
        status, headers, body = fetch(server, "GET", "/metrics", Accept_Encoding="gzip")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert int(headers["content-length"]) == len(body) and gzip.decompress(body) == plain


def test_name_filter_is_prometheus_clients() -> None:
    # prometheus_client filters by the names a collector registered under: without describe(), only
    # auto_describe=True records them (with auto_describe=False the filtered answer is empty).
    server = MetricsServer("127.0.0.1", 0, _registry(_Static(), auto_describe=True), lambda: (True, {})).start()
    try:
        _, _, body = fetch(server, "GET", "/metrics?name[]=retsnoop_demo_b")
    finally:
        server.close()
    assert "retsnoop_demo_b" in body.decode() and "retsnoop_demo_a" not in body.decode()


@pytest.mark.parametrize("headers", [{}, {"Accept": OPENMETRICS}, {"Accept_Encoding": "gzip"}],
                         ids=["text", "openmetrics", "gzip"])
@pytest.mark.parametrize("path", ["/metrics", "/healthz"])
def test_head_has_get_headers_and_no_body(path: str, headers: dict[str, str]) -> None:
    with serve() as server:
        get_status, get_headers, get_body = fetch(server, "GET", path, **headers)
        status, head_headers, body = fetch(server, "HEAD", path, **headers)
    assert (status, body) == (get_status, b"") and get_status == 200
    for name in ("content-type", "content-encoding", "content-length"):
        assert head_headers.get(name) == get_headers.get(name), name
    assert int(head_headers["content-length"]) == len(get_body) > 0


def test_healthz_answers_json_and_503_when_unhealthy() -> None:
    with serve(health=lambda: (True, {"status": "ok", "sessions": 3})) as server:
        status, headers, body = fetch(server, "GET", "/healthz")
    assert (status, headers["content-type"], json.loads(body)) == (200, "application/json",
                                                                   {"status": "ok", "sessions": 3})
    with serve(health=lambda: (False, {"status": "exporter down", "since": Path("/x")})) as server:
        status, _, body = fetch(server, "GET", "/healthz")
    assert status == 503 and body == b'{"status": "exporter down", "since": "/x"}\n'


def test_index_and_not_found() -> None:
    with serve() as server:
        index = fetch(server, "GET", "/")
        missing = fetch(server, "GET", "/metricz")
    assert index[0] == 200 and b"/metrics" in index[2] and b"/healthz" in index[2]
    assert missing[0] == 404 and missing[2].count(b"\n") == 1 and missing[2].endswith(b"\n")


@pytest.mark.parametrize("method,path", [("POST", "/metrics"), ("OPTIONS", "/metrics"), ("DELETE", "/healthz"),
                                         ("PUT", "/"), ("POST", "/nowhere")])
def test_other_methods_are_405_with_allow(method: str, path: str) -> None:
    with serve() as server:
        status, headers, _ = fetch(server, method, path)
    assert status == 405 and headers["allow"] == "GET, HEAD"


def test_failing_collector_is_a_one_line_500_without_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    with serve(collector=_Broken()) as server:
        status, headers, body = fetch(server, "GET", "/metrics")
        head = fetch(server, "HEAD", "/metrics")
        alive = fetch(server, "GET", "/healthz")[0]
    assert status == 500 and headers["content-type"].startswith("text/plain")
    assert body == b"metrics collection failed: kallsyms went away second line\n"
    assert head[0] == 500 and head[2] == b"" and alive == 200
    assert capfd.readouterr() == ("", "")  # no traceback, and no log line per request


def test_stalled_or_malformed_clients_leave_stderr_quiet(monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(server_module._Handler, "timeout", 0.2)
    with serve() as server:
        with socket.create_connection((server.host, server.port)) as stalled:
            stalled.sendall(b"GET /metrics HTTP/1.1\r\n")  # then nothing: the server times out and hangs up
            assert stalled.recv(100) == b""
        with socket.create_connection((server.host, server.port)) as garbled:
            garbled.sendall(b"NONSENSE\r\n\r\n")
            answer = garbled.makefile("rb").read()
        assert fetch(server, "GET", "/healthz")[0] == 200
    assert answer == b"400 Bad request syntax ('NONSENSE')\n"  # no status line: an HTTP/0.9-style request
    assert capfd.readouterr() == ("", "")


def test_port_zero_picks_a_free_port_and_close_is_idempotent() -> None:
    server = MetricsServer("127.0.0.1", 0, _registry(_Static()), lambda: (True, {})).start()
    assert server.host == "127.0.0.1" and server.port > 0
    assert fetch(server, "GET", "/metrics")[0] == 200
    server.close()
    server.close()
    with pytest.raises(ConnectionRefusedError):
        fetch(server, "GET", "/metrics")


def test_ipv6_loopback() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        if exc.errno != errno.EADDRNOTAVAIL:
            raise
        pytest.skip("this machine has no ::1 (binding it gives EADDRNOTAVAIL): environment, not code")
    with serve(host="::1") as server:
        assert fetch(server, "GET", "/healthz")[0] == 200


def test_a_bound_server_refuses_connections_until_started() -> None:
    """Bound at once (a busy port fails early), answering only from start(): nobody reads "up" before the run
    counts the calls it traces (issue 49)."""
    server = MetricsServer("127.0.0.1", 0, _registry(_Static()), lambda: (True, {}))
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.port), timeout=10).close()
        assert server.start() is server
        assert fetch(server, "GET", "/metrics")[0] == 200
    finally:
        server.close()


def test_a_server_never_started_closes_at_once() -> None:
    server = MetricsServer("127.0.0.1", 0, _registry(_Static()), lambda: (True, {}))
    server.close()  # shutdown() would wait forever for a serve loop that never ran
    server.close()


def test_a_port_taken_between_bind_and_start_is_named() -> None:
    """Two processes may bind one port before either listens (SO_REUSEADDR): the second to start is told."""
    first = MetricsServer("127.0.0.1", 0, _registry(_Static()), lambda: (True, {}))
    try:
        second = MetricsServer("127.0.0.1", first.port, _registry(_Static()), lambda: (True, {}), setting="--x")
        first.start()
        with pytest.raises(ListenError, match=rf"cannot listen on 127.0.0.1:{first.port}: the address is already "
                                              r"in use .* pick another port with --x"):
            second.start()
        second.close()
    finally:
        first.close()


@pytest.mark.parametrize("setting", ["metrics.listen", "--metrics-port"])
def test_port_in_use_names_address_and_setting(setting: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as exc:
            MetricsServer("127.0.0.1", port, _registry(_Static()), lambda: (True, {}), setting=setting)
    assert str(exc.value) == (f"cannot listen on 127.0.0.1:{port}: the address is already in use (another agent "
                              f"or exporter?): pick another port with {setting} or stop the other process")


@pytest.mark.parametrize("host", ["192.0.2.1", "::1::"])
def test_foreign_or_bad_host_is_named(host: str) -> None:
    with pytest.raises(ListenError, match="is not an address of this machine") as exc:
        MetricsServer(host, 0, _registry(_Static()), lambda: (True, {}), setting="--metrics-addr")
    listen = f"[{host}]:0" if ":" in host else f"{host}:0"
    assert str(exc.value).startswith(f"cannot listen on {listen}: {host} is not") and "--metrics-addr" in str(exc.value)


_AS_NOBODY = """
from prometheus_client import CollectorRegistry
from retsnoop_otel.metrics.server import ListenError, MetricsServer
try:
    MetricsServer("127.0.0.1", 80, CollectorRegistry(), lambda: (True, {}), setting="--metrics-port").close()
    print("bound")
except ListenError as exc:
    print(exc)
"""


def test_privileged_port_as_unprivileged_user() -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv(1) to drop to user nobody")
    if int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()) <= 80:
        pytest.skip("net.ipv4.ip_unprivileged_port_start lets anyone bind port 80 on this machine")
    out = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-c", _AS_NOBODY],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout == ("cannot listen on 127.0.0.1:80: permission denied: ports below 1024 need "
                          "CAP_NET_BIND_SERVICE; pick a port above 1023 with --metrics-port\n"), out.stderr

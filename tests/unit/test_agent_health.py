"""`agent --health` (the image's HEALTHCHECK) against the real metrics server on loopback: plain HTTP, TLS from a
web config, basic auth, a stalled capture loop and nothing listening."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from retsnoop_otel.agent import health
from retsnoop_otel.agent.main import main as agent_main
from retsnoop_otel.metrics.server import MetricsServer
from retsnoop_otel.metrics.web_tls import WebWatcher, load_web_config
from tests.fakes import WEB_TLS, WEB_USERS
from tests.tls_certs import make_pki


def _serve(healthy: bool, web_file: Path | None = None) -> MetricsServer:
    watcher = WebWatcher(load_web_config(str(web_file)), lambda _w: None) if web_file else None
    state = (True, {"status": "ok"}) if healthy else (False, {"status": "stalled"})
    return MetricsServer("127.0.0.1", 0, CollectorRegistry(), lambda: state, web=watcher).start()


def _config(tmp_path: Path, port: int, web_file: Path | None = None, host: str = "0.0.0.0") -> Path:
    web = f"\n  web_config_file: {web_file}" if web_file else ""
    path = tmp_path / "agent.yaml"
    path.write_text(f"probe_sets: {{a: {{entry: [f]}}}}\nmetrics:\n  listen: '{host}:{port}'{web}\n")
    return path


def _run(config: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = agent_main(["--health", "--config", str(config)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_plain_http_healthy_then_stalled_then_gone(tmp_path: Path) -> None:
    server = _serve(True)
    try:
        code, out, _ = _run(_config(tmp_path, server.port))
        assert code == 0 and out.startswith(f"http://127.0.0.1:{server.port}/healthz: ")
    finally:
        server.close()
    stalled = _serve(False)
    try:
        code, _, err = _run(_config(tmp_path, stalled.port))
        assert code == 1 and " 503 " in err, err
    finally:
        stalled.close()
    code, _, err = _run(_config(tmp_path, stalled.port))  # closed: nothing listens there any more
    assert code == 1 and "connection refused (the agent is not running, or still attaching its probes)" in err, err


@pytest.mark.parametrize("auth", [False, True], ids=["tls", "tls+basic_auth"])
def test_tls_from_the_web_config(tmp_path: Path, auth: bool) -> None:
    pki = make_pki(tmp_path / "pki")
    web = pki.dir / "web.yml"
    web.write_text(WEB_TLS + (WEB_USERS if auth else ""))
    server = _serve(True, web)
    try:
        code, out, err = _run(_config(tmp_path, server.port, web))
        assert code == 0, err
        assert out.startswith(f"https://127.0.0.1:{server.port}/healthz: ")
        assert ("behind basic auth" in out) == auth, out
    finally:
        server.close()


def test_unreadable_config_or_web_config_is_exit_2(tmp_path: Path) -> None:
    code, _, err = _run(tmp_path / "missing.yaml")
    assert code == 2 and err.startswith("retsnoop-otel agent: ") and "cannot read the --config file" in err
    code, line = health.main(str(_config(tmp_path, 9464, tmp_path / "no-web.yml")))
    assert code == 2 and "cannot read the web config file" in line, line


def test_ipv6_wildcard_asks_the_ipv6_loopback(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.fail("this host has no IPv6: the test needs ::1")
    server = MetricsServer("::1", 0, CollectorRegistry(), lambda: (True, {"status": "ok"})).start()
    try:
        code, out, err = _run(_config(tmp_path, server.port, host="[::]"))
        assert code == 0 and out.startswith(f"http://[::1]:{server.port}/healthz"), err
    finally:
        server.close()

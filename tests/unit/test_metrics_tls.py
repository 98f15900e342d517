"""/metrics and /healthz over TLS and basic auth: the real server on loopback, real TLS clients (ssl,
http.client), certificates made by openssl for the test (tests/tls_certs.py)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import queue
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

import retsnoop_otel.metrics.basic_auth as basic_auth_module
import retsnoop_otel.metrics.http_app as server_module
from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.errors import InputError
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.metrics.server import MetricsServer
from retsnoop_otel.metrics.web_config import MAX_BCRYPT_COST
from retsnoop_otel.metrics.web_tls import WebWatcher, load_web_config
from tests.fakes import AGENT_CONFIG, BCRYPT_COST, PASSWORD_HASH, WEB_TLS, WEB_USERS, World, log_events
from tests.tls_certs import CLIENT_URI, Pki, leaf, make_pki

MTLS = WEB_TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"


class _Gauge:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("retsnoop_demo", "A demo gauge.", value=1)


@pytest.fixture(scope="module")
def module_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture()
def pki(module_pki: Pki, tmp_path: Path) -> Pki:
    """A copy per test, so rotating files in one test leaves the others alone."""
    d = tmp_path / "pki"
    shutil.copytree(module_pki.dir, d)
    return make_pki_copy(module_pki, d)


def make_pki_copy(p: Pki, d: Path) -> Pki:
    return Pki(d, *(d / getattr(p, f).name for f in ("ca", "server_cert", "server_key", "client_cert", "client_key",
                                                    "other_client_cert", "other_client_key")))


@contextmanager
def serve(pki: Pki, text: str, warnings: list[str] | None = None) -> Iterator[MetricsServer]:
    path = pki.dir / "web.yml"
    path.write_text(text)
    registry = CollectorRegistry()
    registry.register(_Gauge())
    watcher = WebWatcher(load_web_config(str(path)), (warnings if warnings is not None else []).append)
    server = MetricsServer("127.0.0.1", 0, registry, lambda: (True, {"status": "ok"}), web=watcher).start()
    try:
        yield server
    finally:
        server.close()


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def get(server: MetricsServer, ctx: ssl.SSLContext | None, path: str = "/metrics", method: str = "GET",
        auth: str | None = None, host: str = "localhost", timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(host, server.port, context=ctx, timeout=timeout)
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def refused(server: MetricsServer, ctx: ssl.SSLContext) -> bool:
    """True when the TLS connection or the first request on it fails (TLS 1.3 reports a refused client
    certificate after the client's side of the handshake is done)."""
    try:
        get(server, ctx)
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
        return True
    return False


def served_cert(server: MetricsServer, pki: Pki) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            client_context(pki).wrap_socket(raw, server_hostname="localhost") as tls:
        return tls.getpeercert(binary_form=True)


def pem_der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


# ---- TLS ----------------------------------------------------------------------------------------


def test_every_path_over_tls_and_the_certificate_verifies(pki: Pki) -> None:
    with serve(pki, WEB_TLS) as server:
        assert server.scheme == "https"
        status, headers, body = get(server, client_context(pki))
        assert status == 200 and b"retsnoop_demo 1.0" in body
        assert get(server, client_context(pki), "/healthz")[2] == b'{"status": "ok"}\n'
        assert get(server, client_context(pki), "/metrics", "HEAD")[0] == 200
        assert get(server, client_context(pki), host="127.0.0.1")[0] == 200  # the IP SAN
        assert served_cert(server, pki) == pem_der(pki.server_cert)


def test_plain_http_on_the_tls_port_gets_gos_answer(pki: Pki) -> None:
    with serve(pki, WEB_TLS) as server:
        status, _headers, body = get(server, None)
        assert (status, body) == (400, b"Client sent an HTTP request to an HTTPS server.\n")
        assert get(server, client_context(pki))[0] == 200  # the server is fine afterwards


def test_client_certificate_required_and_verified(pki: Pki) -> None:
    with serve(pki, MTLS) as server:
        assert refused(server, client_context(pki))  # no certificate
        assert refused(server, client_context(pki, pki.other_client_cert, pki.other_client_key))  # unknown CA
        assert get(server, client_context(pki, pki.client_cert, pki.client_key))[0] == 200


def test_client_certificate_verified_if_given(pki: Pki) -> None:
    text = WEB_TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n"
    with serve(pki, text) as server:
        assert get(server, client_context(pki))[0] == 200
        assert refused(server, client_context(pki, pki.other_client_cert, pki.other_client_key))
        assert get(server, client_context(pki, pki.client_cert, pki.client_key))[0] == 200


@pytest.mark.parametrize(("sans", "allowed"), [("[scraper]", True), (f"['{CLIENT_URI}']", True),
                                                ("[prometheus, other]", False)])
def test_client_allowed_sans(pki: Pki, sans: str, allowed: bool) -> None:
    with serve(pki, MTLS + f"  client_allowed_sans: {sans}\n") as server:
        ctx = client_context(pki, pki.client_cert, pki.client_key)
        assert refused(server, ctx) is not allowed
        if allowed:
            assert get(server, ctx)[0] == 200


def test_tls_versions_ciphers_and_curve_are_enforced(pki: Pki) -> None:
    with serve(pki, WEB_TLS + "  min_version: TLS13\n") as server:
        old = client_context(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        assert refused(server, old)
        assert get(server, client_context(pki))[0] == 200
    tls12 = WEB_TLS + "  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n"
    with serve(pki, tls12) as s:
        other = client_context(pki)
        other.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
        assert refused(s, other)
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as raw, \
                client_context(pki).wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.cipher()[:2] == ("ECDHE-ECDSA-AES256-GCM-SHA384", "TLSv1.2")
    with serve(pki, WEB_TLS + "  curve_preferences: [CurveP384]\n") as server:
        p256 = client_context(pki)
        p256.set_ecdh_curve("prime256v1")
        assert refused(server, p256)
        p384 = client_context(pki)
        p384.set_ecdh_curve("secp384r1")
        assert get(server, p384)[0] == 200


def test_a_silent_client_does_not_block_others_and_is_dropped(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "HANDSHAKE_TIMEOUT_S", 0.5)
    with serve(pki, WEB_TLS) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as silent:
            assert get(server, client_context(pki))[0] == 200  # while the silent one is connected
            assert silent.recv(1) == b""  # closed by the server, not by our 30 s timeout
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as stalled:
            stalled.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
            assert stalled.recv(1) == b""


# ---- basic auth ---------------------------------------------------------------------------------


def test_basic_auth_on_every_path(pki: Pki) -> None:
    text = WEB_TLS + WEB_USERS + "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    with serve(pki, text) as server:
        ctx = client_context(pki)
        for path in ("/metrics", "/healthz", "/", "/nope"):
            status, headers, body = get(server, ctx, path)
            assert status == 401 and headers["www-authenticate"] == 'Basic realm="retsnoop-otel", charset="UTF-8"'
            assert headers["x-content-type-options"] == "nosniff" and body.startswith(b"401 Unauthorized")
        for wrong in ("alice:wrong", "bob:s3cret", "alice", "alice:s3cret "):
            assert get(server, ctx, auth=wrong)[0] == 401, wrong
        status, headers, body = get(server, ctx, auth="alice:s3cret")
        assert status == 200 and b"retsnoop_demo" in body and headers["x-content-type-options"] == "nosniff"
        assert json.loads(get(server, ctx, "/healthz", auth="alice:s3cret")[2]) == {"status": "ok"}
        assert get(server, ctx, "/metrics", "HEAD", auth="alice:s3cret")[0] == 200
        assert get(server, ctx, "/metrics", "POST", auth="alice:s3cret")[0] == 405


def test_basic_auth_without_tls(pki: Pki) -> None:
    with serve(pki, WEB_USERS) as server:
        assert server.scheme == "http"
        assert get(server, None)[0] == 401 and get(server, None, auth="alice:s3cret")[0] == 200


def test_verified_credentials_are_cached_and_an_unknown_user_pays_a_full_check(
        pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """The toolkit's cache: a scrape with the same credentials does not run bcrypt again. An unknown user is
    checked against a decoy of the configured cost, so it costs what a wrong password does."""
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(basic_auth_module.bcrypt, "checkpw", counting)
    cost12 = bcrypt.hashpw(b"other", bcrypt.gensalt(BCRYPT_COST)).decode().replace(f"${BCRYPT_COST:02d}$", "$12$", 1)
    with serve(pki, WEB_TLS + WEB_USERS + f"  carol: '{cost12}'\n  dave: '{PASSWORD_HASH}'\n") as server:
        ctx = client_context(pki)
        for _ in range(3):
            assert get(server, ctx, auth="alice:s3cret")[0] == 200
        assert calls == [PASSWORD_HASH.encode()]
        assert get(server, ctx, auth="alice:nope")[0] == 401
        assert get(server, ctx, auth="mallory:s3cret")[0] == 401
        decoy = calls[-1]
        assert decoy not in (PASSWORD_HASH.encode(), cost12.encode())
        assert decoy.startswith(f"$2b${BCRYPT_COST:02d}$".encode())
        assert len(calls) == 3
        assert get(server, ctx, auth="mallory:s3cret")[0] == 401 and len(calls) == 3  # failures are cached too


def test_long_passwords_compare_their_first_72_bytes_like_go(pki: Pki) -> None:
    long_hash = bcrypt.hashpw(b"x" * 72, bcrypt.gensalt(BCRYPT_COST)).decode()
    with serve(pki, f"basic_auth_users:\n  alice: '{long_hash}'\n") as server:
        assert get(server, None, auth="alice:" + "x" * 100)[0] == 200


# ---- changes: rotation and the agent's SIGHUP ----------------------------------------------------


def test_rotated_certificate_is_served_to_new_connections(pki: Pki) -> None:
    warnings: list[str] = []
    with serve(pki, WEB_TLS, warnings) as server:
        assert served_cert(server, pki) == pem_der(pki.server_cert)
        new_cert, new_key = leaf(pki.dir, "server2", "ca", "DNS:localhost,IP:127.0.0.1")
        # cert-manager writes one file, then the other: in between the pair does not match
        shutil.copy(new_cert, pki.server_cert)
        assert served_cert(server, pki) != pem_der(new_cert)  # the previous pair stays in force
        assert len(warnings) == 1 and "does not match the certificate" in warnings[0]
        assert served_cert(server, pki) != pem_der(new_cert) and len(warnings) == 1  # reported once
        shutil.copy(new_key, pki.server_key)
        assert served_cert(server, pki) == pem_der(new_cert)


def test_kubernetes_secret_swap_is_seen(pki: Pki) -> None:
    """kubelet updates a mounted secret by pointing the ..data symlink at a new directory."""
    for gen in ("v1", "v2"):
        (pki.dir / gen).mkdir()
    shutil.copy(pki.server_cert, pki.dir / "v1" / "tls.crt")
    shutil.copy(pki.server_key, pki.dir / "v1" / "tls.key")
    os.symlink("v1", pki.dir / "..data")
    for name in ("tls.crt", "tls.key"):
        os.symlink(f"..data/{name}", pki.dir / name)
    with serve(pki, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n") as server:
        assert served_cert(server, pki) == pem_der(pki.server_cert)
        cert, key = leaf(pki.dir, "server3", "ca", "DNS:localhost")
        shutil.copy(cert, pki.dir / "v2" / "tls.crt")
        shutil.copy(key, pki.dir / "v2" / "tls.key")
        os.symlink("v2", pki.dir / "..tmp")
        os.replace(pki.dir / "..tmp", pki.dir / "..data")
        assert served_cert(server, pki) == pem_der(cert)


def test_edited_web_config_applies_to_the_next_request(pki: Pki) -> None:
    with serve(pki, WEB_USERS) as server:
        assert get(server, None, auth="alice:s3cret")[0] == 200
        bob = bcrypt.hashpw(b"pw", bcrypt.gensalt(BCRYPT_COST)).decode()
        (pki.dir / "web.yml").write_text(f"basic_auth_users:\n  bob: '{bob}'\n")
        assert get(server, None, auth="alice:s3cret")[0] == 401 and get(server, None, auth="bob:pw")[0] == 200


def _agent(tmp_path: Path, pki: Pki, web_text: str) -> tuple[Agent, io.StringIO, Path]:
    web = pki.dir / "agent-web.yml"
    web.write_text(web_text)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace('listen: "127.0.0.1:0"\n',
                                                   f'listen: "127.0.0.1:0"\n  web_config_file: {web}\n'))
    logbuf = io.StringIO()
    return Agent(str(cfg), World().deps(), EventLog(logbuf)), logbuf, web


def test_agent_serves_tls_and_sighup_rereads_the_web_config(pki: Pki, tmp_path: Path) -> None:
    agent, logbuf, web = _agent(tmp_path, pki, WEB_TLS + WEB_USERS)
    agent.start()
    try:
        server = agent.runtime.server
        ctx = client_context(pki)
        assert server.scheme == "https" and get(server, ctx)[0] == 401
        status, _h, body = get(server, ctx, auth="alice:s3cret")
        assert status == 200 and b'retsnoop_attached_functions{mode="kprobe",probe_set="bpf_errors"} 3.0' in body
        # a bad web config at SIGHUP: refused like any bad config, the old one keeps serving
        web.write_text(WEB_TLS + "  min_version: TLS10\n" + WEB_USERS)
        assert agent.reload() is False and agent.runtime.server is server
        failed = [e for e in log_events(logbuf) if e["msg"].startswith("config reload failed")]
        error = failed[0]["error"]
        assert error.startswith(f"metrics.web_config_file: {web}:4: tls_server_config.min_version: OpenSSL 3 refuses")
        assert get(server, ctx, auth="alice:s3cret")[0] == 200
        # a good one: applied without re-binding the port
        web.write_text(WEB_TLS)
        assert agent.reload() is True and agent.runtime.server is server
        assert get(server, ctx)[0] == 200
    finally:
        agent.runtime.shutdown(0.5)


def test_agent_with_a_bad_web_config_attaches_nothing(pki: Pki, tmp_path: Path, world: World) -> None:
    agent, _log, web = _agent(tmp_path, pki, "tls_server_config:\n  cert_file: server.crt\n  key_file: client.key\n")
    agent.deps = world.deps()
    with pytest.raises(InputError) as exc:
        agent.start()
    assert str(exc.value) == (f"agent.yaml:14: metrics.web_config_file: {web}:3: tls_server_config.key_file: "
                              f"{pki.client_key} does not match the certificate in {pki.server_cert}")
    assert world.tracers == [] and agent.runtime is None


def test_concurrent_scrapes_with_the_same_credentials_share_one_check(
        pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many scrapers at once with the same credentials: all served, by one bcrypt check (the others wait for its
    answer rather than taking a check slot or a 503)."""
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(basic_auth_module.bcrypt, "checkpw", counting)
    with serve(pki, WEB_TLS + WEB_USERS) as server:
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(get(server, client_context(pki),
                                                                      auth="alice:s3cret")[0])) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [200] * 8 and calls == [b"s3cret"]


# ---- what a login may cost: the bcrypt cost cap, checks off the accepting thread, the check cap (issue 47) ------

COST_31 = "$2y$31$" + PASSWORD_HASH[7:]  # well-formed: a check of it would run for over a day


class _HeldChecks:
    """bcrypt.checkpw for passwords starting with 'slow': held until released (each one announced when it starts);
    others are real. `waiting` counts logins waiting for another login's running check."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: queue.Queue[bytes] = queue.Queue()
        self.release = threading.Event()
        self.calls: list[bytes] = []
        self.waiting: queue.Queue[None] = queue.Queue()
        real, held = bcrypt.checkpw, self

        def checkpw(password: bytes, hashed: bytes) -> bool:
            self.calls.append(password)
            if not password.startswith(b"slow"):
                return real(password, hashed)
            self.started.put(password)
            assert self.release.wait(60), "never released"
            return False

        class Event(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                held.waiting.put(None)
                return super().wait(timeout)

        class Check(basic_auth_module._Check):
            def __init__(self) -> None:
                super().__init__()
                self.done = Event()

        monkeypatch.setattr(basic_auth_module.bcrypt, "checkpw", checkpw)
        monkeypatch.setattr(basic_auth_module, "_Check", Check)


def _in_thread(results: dict[str, int], name: str, server: MetricsServer, auth: str) -> threading.Thread:
    t = threading.Thread(target=lambda: results.__setitem__(name, get(server, None, auth=auth, timeout=90)[0]),
                         daemon=True)  # held until released: a generous timeout, not a measure
    t.start()
    return t


def test_a_slow_password_check_blocks_no_other_client_and_the_check_cap_answers_503(
        pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _HeldChecks(monkeypatch)
    bob = bcrypt.hashpw(b"pw", bcrypt.gensalt(BCRYPT_COST)).decode()
    with serve(pki, WEB_USERS + f"  bob: '{bob}'\n") as server:
        results: dict[str, int] = {}
        threads = [_in_thread(results, "unknown user", server, "mallory:slow-0")]  # the decoy's check, held
        assert held.started.get(timeout=30) == b"slow-0"
        # meanwhile another client logs in (a check of its own), probes, and scrapes with its verified login
        assert get(server, None, "/healthz", auth="alice:s3cret")[0] == 200
        assert get(server, None, auth="alice:s3cret")[0] == 200
        assert get(server, None)[0] == 401
        # every check slot taken: a login that needs a check is answered 503 at once, not queued
        for i in range(1, basic_auth_module.MAX_CHECKS):
            threads.append(_in_thread(results, f"held {i}", server, f"alice:slow-{i}"))
            assert held.started.get(timeout=30) == f"slow-{i}".encode()
        status, headers, body = get(server, None, auth="bob:pw")
        assert status == 503 and headers["retry-after"] == "1" and body.startswith(b"503 Service Unavailable")
        assert get(server, None, "/healthz", auth="alice:s3cret")[0] == 200  # a verified login needs no check
        # the same credentials as a running check wait for its answer (no second check, no 503)
        threads.append(_in_thread(results, "unknown user again", server, "mallory:slow-0"))
        held.waiting.get(timeout=30)
        held.release.set()
        for t in threads:
            t.join(30)
        assert results == {"unknown user": 401, "unknown user again": 401,
                           **{f"held {i}": 401 for i in range(1, basic_auth_module.MAX_CHECKS)}}
        assert held.calls.count(b"slow-0") == 1
        assert get(server, None, auth="bob:pw")[0] == 200  # the slots are free again


def test_unknown_users_are_checked_at_the_configured_cost_never_above_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoy of an unknown user costs what the configured hashes cost; a hash above the cap that reaches the
    checker without the web config (which refuses it) is refused without a check."""
    calls: list[bytes] = []
    monkeypatch.setattr(basic_auth_module.bcrypt, "checkpw", lambda p, h: calls.append(h) or False)
    auth = basic_auth_module.BasicAuth()
    header = "Basic " + base64.b64encode(b"mallory:x").decode()
    cost12 = PASSWORD_HASH.replace(f"${BCRYPT_COST:02d}$", "$12$", 1)
    assert auth.check(header, {"alice": cost12}) is basic_auth_module.Verdict.REFUSED
    assert basic_auth_module.hash_cost(calls[-1].decode()) == 12
    assert auth.check(header, {"alice": COST_31}) is basic_auth_module.Verdict.REFUSED
    assert basic_auth_module.hash_cost(calls[-1].decode()) == MAX_BCRYPT_COST  # the decoy: at the cap
    calls.clear()
    alice = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert auth.check(alice, {"alice": COST_31}) is basic_auth_module.Verdict.REFUSED and calls == []


def test_a_cost_above_the_cap_is_refused_at_start_and_at_reload(pki: Pki, tmp_path: Path, world: World) -> None:
    """The agent on a real port: a web config with a cost-31 hash is one line at start (nothing attached, nothing
    listening); written over a running agent's, the reload fails and the previous users keep being served."""
    agent, logbuf, web = _agent(tmp_path, pki, f"basic_auth_users:\n  alice: '{COST_31}'\n")
    agent.deps = world.deps()
    with pytest.raises(InputError) as exc:
        agent.start()
    said = (f"{web}:2: basic_auth_users.alice: bcrypt cost 31 is outside 4..14 (each login with a wrong password or "
            f"an unknown user runs one check of 2^31 rounds, and 2^14 already takes about a second of CPU); make one "
            f"with: htpasswd -nBC 10 \"\" | tr -d ':\\n'")
    assert str(exc.value) == f"agent.yaml:14: metrics.web_config_file: {said}"
    assert world.tracers == [] and agent.runtime is None
    agent, logbuf, web = _agent(tmp_path, pki, WEB_USERS)
    agent.start()
    try:
        server = agent.runtime.server
        assert get(server, None, auth="alice:s3cret")[0] == 200
        web.write_text(f"basic_auth_users:\n  alice: '{COST_31}'\n")
        assert agent.reload() is False and agent.runtime.server is server
        failed = [e for e in log_events(logbuf) if e["msg"].startswith("config reload failed")]
        assert failed[0]["error"] == f"metrics.web_config_file: {said}"
        assert get(server, None, auth="alice:s3cret")[0] == 200 and get(server, None, auth="mallory:x")[0] == 401
    finally:
        agent.runtime.shutdown(0.5)


def test_a_cost_above_the_cap_written_under_a_running_server_keeps_the_previous_users(pki: Pki) -> None:
    warnings: list[str] = []
    with serve(pki, WEB_USERS, warnings) as server:
        (pki.dir / "web.yml").write_text(f"basic_auth_users:\n  alice: '{COST_31}'\n  mallory: '{COST_31}'\n")
        assert get(server, None, auth="alice:s3cret")[0] == 200 and get(server, None, auth="mallory:x")[0] == 401
        assert len(warnings) == 1 and "\n" not in warnings[0]
        assert warnings[0].startswith(f"{pki.dir / 'web.yml'}:2: basic_auth_users.alice: bcrypt cost 31 is outside")

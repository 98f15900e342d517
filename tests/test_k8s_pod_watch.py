"""The pod metadata watch against a local API server stand-in (tests/fake_apiserver.py): real sockets, TLS
with a CA made at test time, a bearer token file, and recorded list and watch responses (tests/fixtures/k8s).

No cluster is reachable from the test machine; what is checked is the protocol as the API server speaks
it: the node-scoped list (resourceVersion=0: served from the API server's watch cache, as client-go's reflector
lists; after a 410, without resourceVersion: the most recent state), the watch from its resourceVersion with
bookmarks, ADDED/MODIFIED/DELETED,
410 Gone (as a watch event and as a status) leading to a new list, 401/403 and a server that goes away
(one warning, back-off, the cache kept, recovery without a new list), token rotation, TLS checked against
the given CA, and an API server at an IPv6 address (https://[::1]:port).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retsnoop_otel.workload.k8s_settings import KubeSettings
from retsnoop_otel.workload.k8s_watch import HttpError, PodWatch, _short, reason_of
from retsnoop_otel.workload.pods import ContainerMeta, PodCache
from tests import fake_apiserver
from tests.fake_apiserver import Answer, FakeApiServer, fixture, fixture_events, make_test_ca

CHECKOUT = "6f1b6c5e-2a4d-4a8e-9c3b-0f2e1d4c5b6a"
COREDNS = "b8e4c2a1-7f3d-4e6b-a9c5-d1f0e2b3c4a5"
PENDING = "d4c3b2a1-0f9e-4d8c-b7a6-958473625140"
WEB = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"
APP_ID = "3a8f1c4b2d9e7f6051a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8"
WEB_ID = "7f6e5d4c3b2a19080f7e6d5c4b3a29180e4b0f6b9d3c1a2f8e7d6c5b4a392817"


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def warning(self, msg: str, **fields: Any) -> None:
        self.lines.append(("warning", msg, fields))

    def info(self, msg: str, **fields: Any) -> None:
        self.lines.append(("info", msg, fields))

    def of(self, level: str) -> list[str]:
        return [msg for lv, msg, _ in self.lines if lv == level]


def wait_for(cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
    return value


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_test_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.first\n")
    return path


@pytest.fixture
def server(certs: dict[str, str], token: Path) -> Iterator[FakeApiServer]:
    api = FakeApiServer({token.read_text().strip()}).start(cert=certs["server.pem"], key=certs["server.key"])
    yield api
    api.stop()


def watch_of(api: FakeApiServer, certs: dict[str, str], token: Path, log: Log,
             cache: PodCache | None = None, well_known_labels: bool = False) -> PodWatch:
    settings = KubeSettings("node-a", f"https://127.0.0.1:{api.port}", str(token), Path(certs["ca.pem"]).read_bytes(),
                            well_known_labels=well_known_labels)
    return PodWatch(settings, cache or PodCache(time.monotonic), log, backoff_first_s=0.05, backoff_max_s=0.2)


def test_list_then_watch_fills_the_cache(server: FakeApiServer, certs, token: Path) -> None:
    server.lists.append(Answer(body=fixture("pods_list.json")))
    server.watches.append(Answer(events=fixture_events("watch_events.jsonl")))  # ends: the watch is resumed
    server.watches.append(Answer(events=['{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1",'
                                         '"metadata":{"resourceVersion":"2000"}}}']))
    log = Log()
    watch = watch_of(server, certs, token, log).start()
    try:
        third = server.wait_requests(4)  # list, watch from 1000, watch from 1012, watch from the bookmark's 2000
        cache = watch.cache
        checkout = cache.get(CHECKOUT)
        assert checkout is not None and (checkout.name, checkout.namespace) == ("checkout-7d4b9c8f6-x2x9k", "shop")
        assert {cid[:8]: c for cid, c in checkout.containers.items()} == {  # images from spec.*containers[]
            "3a8f1c4b": ContainerMeta("app", "containerd", "registry.example/shop/checkout", ("1.4.2",)),
            "e4b0f6b9": ContainerMeta("istio-proxy", "containerd", "docker.io/istio/proxyv2", ("1.24.1",)),
            "9d2c7e1f": ContainerMeta("migrate", "containerd", "registry.example/shop/migrate", ("1.4.2",)),
            "c0ffee1d": ContainerMeta("debugger-h7k2p", "containerd", "docker.io/library/busybox", ("1.37",))}
        # ownerReferences: the ReplicaSet, and its Deployment by the pod-template-hash label
        assert checkout.owners == (("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout"))
        assert (checkout.annotated_service, checkout.app_name, checkout.app_instance) == ("", "", "")
        pending = cache.get(PENDING)
        assert pending.containers == {}  # no container id before the container is created
        assert pending.owners == (("job", "report-29919600"), ("cronjob", "report"))  # the Job's name: a schedule
        web = cache.get(WEB)  # ADDED without, MODIFIED with an id
        assert web.containers == {WEB_ID: ContainerMeta("web", "containerd", "registry.example/shop/web", ("2.0.1",))}
        assert web.app_name == "" and web.owners[-1] == ("deployment", "web")  # labels: not without the opt-in
        gone = cache.get(COREDNS)  # DELETED, but kept for the sessions still on their way
        assert gone is not None and gone.name == "coredns-76f75df574-9bz6m" and cache.deleted == 1
        assert gone.annotated_service == "cluster-dns"
        assert len(cache) == 3
    finally:
        watch.close()
    lst, w1, w2, w3 = third[:4]
    # the list is served from the watch cache (resourceVersion=0), not read from etcd
    assert lst["kind"] == "list" and lst["query"] == {"fieldSelector": "spec.nodeName=node-a", "resourceVersion": "0"}
    assert lst["authorization"] == "Bearer " + token.read_text().strip()
    assert (w1["kind"], w1["query"]["resourceVersion"], w1["query"]["allowWatchBookmarks"].lower()) == \
        ("watch", "1000", "true")  # older clients write True: the API server parses both
    assert w1["query"]["fieldSelector"] == "spec.nodeName=node-a" and int(w1["query"]["timeoutSeconds"]) > 0
    assert w2["query"]["resourceVersion"] == "1012"  # the last event's version (after the bookmark at 1010)
    assert w3["query"]["resourceVersion"] == "2000"  # a bookmark moves the version too
    c = watch.counters()
    assert c.current and c.lists == 1 and c.errors == {} and c.events == 3 and c.pods == 3
    assert log.lines == []


def test_well_known_labels_are_read_from_lists_and_events_when_opted_in(server: FakeApiServer, certs,
                                                                          token: Path) -> None:
    """kubernetes.well_known_labels: true reaches the watch: app.kubernetes.io/* of listed pods and of pods that
    watch events bring."""
    listed = fixture("pods_list.json")
    listed["items"][0]["metadata"]["labels"]["app.kubernetes.io/instance"] = "checkout-prod"
    server.lists.append(Answer(body=listed))
    server.watches.append(Answer(events=fixture_events("watch_events.jsonl"), hold=True))
    watch = watch_of(server, certs, token, Log(), well_known_labels=True).start()
    try:
        web = wait_for(lambda: watch.cache.get(WEB))
        checkout = watch.cache.get(CHECKOUT)
    finally:
        watch.close()
    assert web.app_name == "storefront"  # from the ADDED event's labels
    assert checkout is not None and (checkout.app_instance, checkout.app_name) == ("checkout-prod", "")


@pytest.mark.parametrize("gone", ["event", "status"])
def test_410_gone_lists_again(server: FakeApiServer, certs, token: Path, gone: str) -> None:
    server.lists.append(Answer(body=fixture("pods_list.json")))
    relisted = fixture("pods_list.json")
    relisted["metadata"]["resourceVersion"] = "1523"
    relisted["items"] = relisted["items"][:1]  # coredns went away while the watch was behind
    server.lists.append(Answer(body=relisted))
    server.watches.append(Answer(events=fixture_events("watch_gone.jsonl")) if gone == "event" else
                          Answer(410, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "message": "too old resource version: 1000 (1523)", "reason": "Expired",
                                       "code": 410}))
    log = Log()
    watch = watch_of(server, certs, token, log).start()
    try:
        reqs = server.wait_requests(4)
        assert [r["kind"] for r in reqs[:4]] == ["list", "watch", "list", "watch"]
        assert reqs[0]["query"]["resourceVersion"] == "0"  # the first list: from the watch cache
        # after the 410, the most recent state (no resourceVersion): a cached list may be as old as the expired one
        assert reqs[2]["query"] == {"fieldSelector": "spec.nodeName=node-a"}
        assert reqs[3]["query"]["resourceVersion"] == "1523"
        wait_for(lambda: watch.counters().lists == 2)
        assert watch.cache.get(COREDNS) is not None and watch.cache.deleted == 2  # missing from the new list
    finally:
        watch.close()
    c = watch.counters()
    assert c.current and c.errors == {"gone": 1}
    assert log.lines == []  # a 410 is the protocol, not an outage


@pytest.mark.parametrize("status,reason", [(403, "forbidden"), (401, "unauthorized")])
def test_refusal_degrades_with_one_warning(server: FakeApiServer, certs, token: Path, status: int,
                                           reason: str) -> None:
    if status == 403:
        server.lists.append(Answer(403, fixture("status_403.json")))
    else:
        server.tokens.clear()  # the token is not accepted (an expired or foreign one)
    log = Log()
    watch = watch_of(server, certs, token, log).start()
    try:
        reqs = server.wait_requests(5)  # retried, with back-off
        wait_for(lambda: watch.counters().errors.get(reason, 0) >= 4)
        assert {r["query"].get("resourceVersion") for r in reqs} == {"0"}  # every first list from the watch cache
    finally:
        watch.close()
    c = watch.counters()
    assert not c.current and c.pods == 0 and c.lists == 0
    (warning,) = [f for lv, _, f in log.lines if lv == "warning"]
    assert warning["reason"] == reason and str(status) in warning["error"]
    assert warning["api_server"].startswith("https://127.0.0.1:")


def test_a_server_that_goes_away_and_comes_back(server: FakeApiServer, certs, token: Path) -> None:
    server.lists.append(Answer(body=fixture("pods_list.json")))
    server.watches.append(Answer(events=fixture_events("watch_events.jsonl")[:1], hold=True))
    log = Log()
    watch = watch_of(server, certs, token, log).start()
    try:
        wait_for(lambda: watch.cache.get(WEB) is not None)
        port = server.port
        server.stop()  # the held watch is cut, and nothing listens any more
        wait_for(lambda: watch.counters().errors.get("unreachable", 0) >= 3)
        c = watch.counters()
        assert not c.current and c.pods == 4  # what was known stays
        assert len(log.of("warning")) == 1
        back = FakeApiServer(server.tokens)
        back.watches.append(Answer(events=['{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1",'
                                           '"metadata":{"resourceVersion":"1400"}}}'], hold=True))
        back.start(port, certs["server.pem"], certs["server.key"])
        try:
            (w,) = back.wait_requests(1)
            assert w["kind"] == "watch" and w["query"]["resourceVersion"] == "1001"  # resumed, not listed again
            wait_for(lambda: watch.counters().current and log.of("info"))  # the bookmark was read
        finally:
            watch.close()
            back.stop()
    finally:
        watch.close()
    assert log.of("info") == ["pod metadata watch running again"] and len(log.of("warning")) == 1
    assert watch.counters().lists == 1


def test_a_server_that_fails_every_watch_is_one_warning(server: FakeApiServer, certs, token: Path) -> None:
    """The list works, every watch then breaks mid-stream: the log says it once, not once per round."""
    server.lists.append(Answer(body=fixture("pods_list.json")))
    for _ in range(4):
        server.watches.append(Answer(events=['{"type":"ADDED","object":']))  # cut JSON
    log = Log()
    watch = watch_of(server, certs, token, log).start()
    try:
        server.wait_requests(4, kind="watch")
        wait_for(lambda: watch.counters().errors.get("invalid_response", 0) >= 4)
    finally:
        watch.close()
    assert len(log.of("warning")) == 1 and log.of("info") == []
    assert watch.cache.get(CHECKOUT) is not None  # the list's pods stay


def test_rotated_token_is_read_again(server: FakeApiServer, certs, token: Path) -> None:
    server.lists.append(Answer(body=fixture("pods_list.json")))
    server.watches.append(Answer(events=[]))  # ends at once: the next watch is a new request
    log = Log()
    watch = watch_of(server, certs, token, log).start()
    try:
        server.wait_requests(2)
        token.write_text("eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.second\n")  # kubelet rewrote the projected token
        server.tokens = {"eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.second"}  # and the old one expired
        reqs = server.wait_requests(3)
    finally:
        watch.close()
    assert reqs[2]["authorization"].endswith(".second") and reqs[0]["authorization"].endswith(".first")
    assert watch.counters().errors.get("unauthorized", 0) == 0


def test_tls_is_checked_against_the_ca_file(server: FakeApiServer, certs, token: Path,
                                           tmp_path: Path) -> None:
    """A server certificate the configured CA did not sign: nothing is sent, the server is unreachable."""
    server.lists.append(Answer(body=fixture("pods_list.json")))
    (tmp_path / "other").mkdir()
    other_ca = make_test_ca(tmp_path / "other")["ca.pem"]
    log = Log()
    settings = KubeSettings("node-a", f"https://127.0.0.1:{server.port}", str(token), Path(other_ca).read_bytes())
    watch = PodWatch(settings, PodCache(time.monotonic), log, backoff_first_s=0.05, backoff_max_s=0.2).start()
    try:
        wait_for(lambda: watch.counters().errors.get("unreachable", 0) >= 2)
    finally:
        watch.close()
    assert server.requests == [] and watch.counters().lists == 0
    (warning,) = [f for lv, _, f in log.lines if lv == "warning"]
    assert warning["reason"] == "unreachable" and warning["error"].startswith("SSLCertVerificationError")


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


class _Server6(fake_apiserver._Server):
    address_family = socket.AF_INET6


def test_an_ipv6_api_server(certs, token: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """https://[::1]:port: the host comes out of its brackets, and TLS matches it against the certificate's IP."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    d = Path(certs["ca.pem"]).parent  # sign a certificate for ::1 with the test CA (make_test_ca's ca.key)
    (d / "server6.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:::1\n")
    for args in (["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                  "server6.key", "-out", "server6.csr", "-subj", "/CN=kube-apiserver"],
                 ["x509", "-req", "-in", "server6.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                  "-out", "server6.pem", "-days", "2", "-extfile", "server6.ext"]):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=120)
    monkeypatch.setattr(fake_apiserver, "_Server", lambda addr, handler: _Server6(("::1", addr[1]), handler))
    api = FakeApiServer({token.read_text().strip()}).start(cert=str(d / "server6.pem"), key=str(d / "server6.key"))
    api.lists.append(Answer(body=fixture("pods_list.json")))
    try:
        settings = KubeSettings("node-a", f"https://[::1]:{api.port}", str(token), Path(certs["ca.pem"]).read_bytes())
        watch = PodWatch(settings, PodCache(time.monotonic), Log(), backoff_first_s=0.05, backoff_max_s=0.2).start()
        try:
            lst, w = api.wait_requests(2)[:2]
            wait_for(lambda: watch.counters().current)
        finally:
            watch.close()
    finally:
        api.stop()
    assert lst["query"] == {"fieldSelector": "spec.nodeName=node-a", "resourceVersion": "0"}
    assert w["kind"] == "watch" and w["query"]["resourceVersion"] == "1000"
    assert watch.cache.get(CHECKOUT) is not None and watch.counters().errors == {}


@pytest.mark.parametrize("exc,reason", [
    (HttpError(401, "Unauthorized"), "unauthorized"), (HttpError(403, "Forbidden"), "forbidden"),
    (HttpError(410, "Gone"), "gone"), (HttpError(503, "Service Unavailable"), "server_error"),
    (ssl.SSLCertVerificationError("certificate verify failed"), "unreachable"),  # a ValueError too
    (ConnectionRefusedError(111, "Connection refused"), "unreachable"), (TimeoutError("timed out"), "unreachable"),
    (http.client.IncompleteRead(b""), "unreachable"), (json.JSONDecodeError("Expecting value", "", 0),
                                                       "invalid_response")])
def test_failure_reasons(exc: BaseException, reason: str) -> None:
    assert reason_of(exc) == reason


def test_http_error_message() -> None:
    assert _short(HttpError(403, "Forbidden")) == "HTTP 403 Forbidden"


def test_deleted_pods_are_forgotten_after_keep_deleted() -> None:
    from retsnoop_otel.workload.pods import pod_meta
    now = [100.0]
    cache = PodCache(lambda: now[0], keep_deleted_s=300)
    pods = [p for p in map(pod_meta, fixture("pods_list.json")["items"]) if p]
    cache.replace(pods)
    gen = cache.generation
    cache.delete(pods[1])
    assert cache.get(pods[1].uid) is pods[1] and cache.generation > gen
    now[0] += 299
    cache.expire()
    assert cache.get(pods[1].uid) is not None
    now[0] += 2
    cache.expire()
    assert cache.get(pods[1].uid) is None and len(cache) == 2
    cache.upsert(pods[1])  # the same uid again (a list that still had it): live again
    assert cache.get(pods[1].uid) is pods[1] and len(cache) == 3

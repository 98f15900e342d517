"""OTLP senders against the real receiver (tests/otlp_receiver.py): gRPC and HTTP over real sockets, gzip on the
wire, headers, TLS and mTLS with certificates made by the openssl command line, retries, shutdown, partial success,
and the OTLP/JSON file sender."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Exemplar,
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from retsnoop_otel import __version__
from retsnoop_otel.export.grpc_sender import GrpcSender
from retsnoop_otel.export.http_sender import GRPC_PORT_HINT, HttpSender
from retsnoop_otel.export.otlp_file import OtlpJsonFileSender
from retsnoop_otel.export.otlp_settings import OtlpConfig, OtlpConfigError, OtlpSettings, resolve_settings
from retsnoop_otel.export.senders import build_sender
from retsnoop_otel.export.sending import SendResult
from tests.otlp_receiver import Receiver, start_receiver

TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")
SPAN_ID = bytes.fromhex("eee19b7ec3c1b174")
PARENT_ID = bytes.fromhex("0102030405060708")
PROTOCOLS = ["grpc", "http/protobuf"]


def trace_request(name: str = "vfs_read", attribute: str = "") -> bytes:
    span = Span(trace_id=TRACE_ID, span_id=SPAN_ID, parent_span_id=PARENT_ID, name=name, kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=1_000, end_time_unix_nano=2_000,
                links=[Span.Link(trace_id=TRACE_ID, span_id=PARENT_ID)],
                attributes=[KeyValue(key="payload", value=AnyValue(string_value=attribute))] if attribute else [])
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])
    return request.SerializeToString()


def metrics_request() -> bytes:
    point = NumberDataPoint(as_int=42, time_unix_nano=5, exemplars=[Exemplar(as_int=1, trace_id=TRACE_ID,
                                                                             span_id=SPAN_ID)])
    metric = Metric(name="retsnoop.calls", gauge=Gauge(data_points=[point]))
    request = ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(
        metrics=[metric])])])
    return request.SerializeToString()


def settings_for(receiver: Receiver, protocol: str | None, signal: str = "traces", env: dict[str, str] | None = None,
                 scheme: str = "http", host: str = "127.0.0.1", **cfg: object) -> OtlpSettings:
    port = receiver.port if protocol == "grpc" else receiver.http_port
    cfg.setdefault("endpoint", f"{scheme}://{host}:{port}")
    return resolve_settings(OtlpConfig(protocol=protocol, **cfg), signal, env or {})  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """grpc honours *_proxy variables; the senders must reach 127.0.0.1 directly."""
    for var in [v for v in os.environ if v.lower().endswith("_proxy")]:
        monkeypatch.delenv(var)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = start_receiver(port=0, http_port=0)
    yield r
    r.stop()


@pytest.fixture
def sender_cleanup() -> Iterator[list]:
    """Senders a test built; shut down afterwards whatever happened."""
    senders: list = []
    yield senders
    for s in senders:
        s.shutdown()


def build(settings: OtlpSettings, cleanup: list):
    sender = build_sender(settings)
    cleanup.append(sender)
    return sender


# ---- certificates (openssl command line) ----

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for localhost and 127.0.0.1 (subjectAltName) and a client certificate."""
    d = tmp_path_factory.mktemp("certs")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=retsnoop test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, usage, san in (("server", "serverAuth", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"),
                             ("client", "clientAuth", "")):
        (d / f"{name}.ext").write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                       f"extendedKeyUsage={usage}\n{san}")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return {name: str(d / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture
def tls_receiver(certs: dict[str, str]) -> Iterator[Receiver]:
    r = start_receiver(port=0, http_port=0, tls_cert=certs["server.pem"], tls_key=certs["server.key"])
    yield r
    r.stop()


@pytest.fixture
def mtls_receiver(certs: dict[str, str]) -> Iterator[Receiver]:
    r = start_receiver(port=0, http_port=0, tls_cert=certs["server.pem"], tls_key=certs["server.key"],
                       client_ca=certs["ca.pem"])
    yield r
    r.stop()


# ---- plaintext, signals, headers ----

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_plaintext_trace_request_arrives_intact(receiver: Receiver, protocol: str, sender_cleanup: list) -> None:
    sender = build(settings_for(receiver, protocol), sender_cleanup)
    assert isinstance(sender, GrpcSender if protocol == "grpc" else HttpSender)
    assert sender.send(trace_request(), 1) == SendResult(True)
    assert [r.SerializeToString() for r in receiver.requests] == [trace_request()]
    assert receiver.headers[0]["user-agent"].startswith(f"retsnoop-otel/{__version__}")
    if protocol == "http/protobuf":
        assert receiver.headers[0]["content-type"] == "application/x-protobuf"


@pytest.mark.parametrize("signal,path", [("traces", "/v1/traces"), ("metrics", "/v1/metrics")])
def test_no_protocol_given_is_otlp_http_to_the_signal_path(receiver: Receiver, signal: str, path: str,
                                                           sender_cleanup: list) -> None:
    """The specification's default: http/protobuf, the signal's path appended to the endpoint (a base URL)."""
    settings = settings_for(receiver, None, signal)
    assert (settings.protocol, settings.url) == ("http/protobuf", f"http://127.0.0.1:{receiver.http_port}{path}")
    sender = build(settings, sender_cleanup)
    assert isinstance(sender, HttpSender)
    body = trace_request() if signal == "traces" else metrics_request()
    assert sender.send(body, 1).ok
    got = receiver.requests if signal == "traces" else receiver.metric_requests
    assert [r.SerializeToString() for r in got] == [body]
    assert len(receiver.http_peers) == 1  # over HTTP, to the signal's own path
    assert (receiver.metric_requests if signal == "traces" else receiver.requests) == []


def test_otlp_http_sent_to_a_grpc_port_says_so_at_once(receiver: Receiver, sender_cleanup: list) -> None:
    """A gRPC server answers an HTTP/1.1 POST with HTTP/2 frames: the error says what happened and how to fix
    it, and no retry is spent on a port that will not change its protocol."""
    settings = settings_for(receiver, None, endpoint=f"http://127.0.0.1:{receiver.port}", timeout_s=30)
    result = build(settings, sender_cleanup).send(trace_request(), 1)
    assert result == SendResult(False, error=GRPC_PORT_HINT)
    assert "4318" in GRPC_PORT_HINT and "grpc" in GRPC_PORT_HINT
    assert receiver.attempts == 0 and receiver.requests == []  # the gRPC service never saw a request


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_metrics_request_goes_to_the_metrics_service(receiver: Receiver, protocol: str, sender_cleanup: list) -> None:
    sender = build(settings_for(receiver, protocol, "metrics", scheme="http", host="localhost"), sender_cleanup)
    assert sender.send(metrics_request(), 1).ok
    assert [r.SerializeToString() for r in receiver.metric_requests] == [metrics_request()]
    assert receiver.requests == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_headers_from_environment_and_from_config(receiver: Receiver, protocol: str, sender_cleanup: list) -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "X-Tenant=t1,api-key=a%20b%3D"}
    assert build(settings_for(receiver, protocol, env=env), sender_cleanup).send(trace_request(), 1).ok
    assert receiver.headers[0]["x-tenant"] == "t1" and receiver.headers[0]["api-key"] == "a b="
    configured = settings_for(receiver, protocol, env=env, headers=(("X-From-Config", "yes"),))
    assert build(configured, sender_cleanup).send(trace_request(), 1).ok
    assert receiver.headers[1]["x-from-config"] == "yes" and "x-tenant" not in receiver.headers[1]


def test_http_connection_is_kept_alive_and_reused(receiver: Receiver, sender_cleanup: list) -> None:
    sender = build(settings_for(receiver, "http/protobuf"), sender_cleanup)
    for _ in range(3):
        assert sender.send(trace_request(), 1).ok
    assert len(receiver.http_peers) == 3 and len(set(receiver.http_peers)) == 1


def test_http_reconnects_after_the_server_dropped_the_connection(receiver: Receiver, sender_cleanup: list) -> None:
    sender = build(settings_for(receiver, "http/protobuf", timeout_s=30), sender_cleanup)
    assert sender.send(trace_request(), 1).ok
    receiver.stop()  # closes the kept-alive connection's server side, then a new receiver takes the same port
    again = start_receiver(port=0, http_port=receiver.http_port)
    try:
        assert sender.send(trace_request(), 1).ok
        assert len(again.requests) == 1
    finally:
        again.stop()


# ---- compression on the wire ----

@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_http_compression_is_on_the_wire(receiver: Receiver, compression: str, sender_cleanup: list) -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression} if compression == "gzip" else {}
    cfg = {} if compression == "gzip" else {"compression": compression}
    body = trace_request(attribute="x" * 100_000)
    assert build(settings_for(receiver, "http/protobuf", env=env, **cfg), sender_cleanup).send(body, 1).ok
    assert receiver.headers[0]["content-encoding"] == compression
    assert int(receiver.headers[0]["content-length"]) < len(body) // 10
    assert receiver.requests[0].SerializeToString() == body


class CountingProxy:
    """A TCP relay that counts the bytes a client sends upstream: what actually crossed the wire."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port, self.sent, self._lock = upstream_port, 0, threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(65536):
                if count:
                    with self._lock:
                        self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_grpc_compression_is_on_the_wire(receiver: Receiver, compression: str, sender_cleanup: list) -> None:
    proxy = CountingProxy(receiver.port)
    try:
        body = trace_request(attribute="x" * 200_000)
        # deflate is the config's own: the variable takes the specification's gzip and none only
        how = {"compression": compression} if compression == "deflate" else {
            "env": {"OTEL_EXPORTER_OTLP_COMPRESSION": compression}}
        sender = build(settings_for(receiver, "grpc", endpoint=f"http://127.0.0.1:{proxy.port}", **how),
                       sender_cleanup)
        assert sender.send(body, 1).ok
        assert receiver.requests[0].SerializeToString() == body
        sender.shutdown()
        if compression == "none":
            assert proxy.sent > len(body)
        else:
            assert proxy.sent < len(body) // 10
    finally:
        proxy.close()


# ---- TLS and mTLS ----

@pytest.mark.parametrize("protocol,host", [("grpc", "localhost"), ("http/protobuf", "127.0.0.1"),
                                           ("grpc", "127.0.0.1"), ("http/protobuf", "localhost")])
def test_tls_with_a_ca_certificate(tls_receiver: Receiver, certs: dict[str, str], protocol: str, host: str,
                                   sender_cleanup: list) -> None:
    settings = settings_for(tls_receiver, protocol, scheme="https", host=host, certificate=certs["ca.pem"])
    assert settings.tls
    assert build(settings, sender_cleanup).send(trace_request(), 1).ok
    assert len(tls_receiver.requests) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tls_server_is_not_trusted_without_its_ca(tls_receiver: Receiver, protocol: str, sender_cleanup: list) -> None:
    settings = settings_for(tls_receiver, protocol, scheme="https", host="localhost", timeout_s=2)
    result = build(settings, sender_cleanup).send(trace_request(), 1)
    assert not result.ok and result.error and "\n" not in result.error
    assert tls_receiver.requests == []


def test_grpc_scheme_less_endpoint_is_tls_unless_insecure(tls_receiver: Receiver, receiver: Receiver,
                                                          certs: dict[str, str], sender_cleanup: list) -> None:
    secure = settings_for(tls_receiver, "grpc", endpoint=f"localhost:{tls_receiver.port}", certificate=certs["ca.pem"])
    assert build(secure, sender_cleanup).send(trace_request(), 1).ok
    plain = settings_for(receiver, "grpc", endpoint=f"127.0.0.1:{receiver.port}",
                         env={"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"})
    assert build(plain, sender_cleanup).send(trace_request(), 1).ok
    assert len(tls_receiver.requests) == len(receiver.requests) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mtls_with_client_key_and_certificate(mtls_receiver: Receiver, certs: dict[str, str], protocol: str,
                                              sender_cleanup: list) -> None:
    env = {"OTEL_EXPORTER_OTLP_CLIENT_KEY": certs["client.key"],
           "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certs["client.pem"]}
    settings = settings_for(mtls_receiver, protocol, env=env, scheme="https", host="localhost",
                            certificate=certs["ca.pem"])
    assert build(settings, sender_cleanup).send(trace_request(), 1).ok
    assert len(mtls_receiver.requests) == 1
    without = settings_for(mtls_receiver, protocol, scheme="https", host="localhost", certificate=certs["ca.pem"],
                           timeout_s=2)
    result = build(without, sender_cleanup).send(trace_request(), 1)
    assert not result.ok and result.error and "\n" not in result.error
    assert len(mtls_receiver.requests) == 1


def test_http_tls_files_that_are_not_pem_are_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    with pytest.raises(OtlpConfigError) as info:  # parsed with the settings, before any sender is built
        resolve_settings(OtlpConfig(protocol="http/protobuf", endpoint="https://localhost:4318",
                                    certificate=str(bogus)), "traces", {})
    assert str(info.value) == f"certificate: {bogus}: no PEM CA certificate in the file (a file that holds " \
                              "-----BEGIN CERTIFICATE-----)"


# ---- failures and retries ----

@pytest.mark.parametrize("protocol,failures,retry_after", [("grpc", 1, None), ("http/protobuf", 2, 1),
                                                           ("http/protobuf", 1, None)])
def test_retry_then_success(receiver: Receiver, protocol: str, failures: int, retry_after: float | None,
                            sender_cleanup: list) -> None:
    receiver.fail_next(failures, retry_after=retry_after)
    result = build(settings_for(receiver, protocol, timeout_s=30), sender_cleanup).send(trace_request(), 1)
    assert result == SendResult(True)
    assert receiver.attempts == failures + 1 and len(receiver.requests) == 1


@pytest.mark.parametrize("protocol,error", [("grpc", "UNAVAILABLE: receiver told to fail"),
                                            ("http/protobuf", "HTTP 503")])
def test_retries_stop_at_the_deadline(receiver: Receiver, protocol: str, error: str, sender_cleanup: list) -> None:
    receiver.fail_next(1000)
    result = build(settings_for(receiver, protocol, timeout_s=2.5), sender_cleanup).send(trace_request(), 1)
    assert result == SendResult(False, error=error)
    assert receiver.attempts >= 1 and receiver.requests == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_non_retryable_failure_returns_after_one_attempt(receiver: Receiver, protocol: str,
                                                         sender_cleanup: list) -> None:
    result = build(settings_for(receiver, protocol, timeout_s=30), sender_cleanup).send(b"\xff not protobuf", 1)
    assert not result.ok and result.error and "\n" not in result.error
    if protocol == "grpc":
        assert result.error.startswith("INTERNAL:")  # the server could not deserialize the request
    else:
        assert result.error.startswith("HTTP 400: ") and len(result.error) <= len("HTTP 400: ") + 200
        assert receiver.attempts == 1


def test_http_404_is_not_retried(receiver: Receiver, sender_cleanup: list) -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}/not/otlp"}
    settings = resolve_settings(OtlpConfig(protocol="http/protobuf", timeout_s=30), "traces", env)
    result = build(settings, sender_cleanup).send(trace_request(), 1)
    assert not result.ok and result.error and result.error.startswith("HTTP 404") and "\n" not in result.error
    assert len(receiver.http_peers) == 1


@pytest.mark.parametrize("protocol,error", [("grpc", "UNAVAILABLE"), ("http/protobuf", "connection error")])
def test_nothing_listening(protocol: str, error: str, sender_cleanup: list) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        settings = resolve_settings(OtlpConfig(protocol=protocol, endpoint=f"http://127.0.0.1:{port}", timeout_s=1.5),
                                    "traces", {})
        result = build(settings, sender_cleanup).send(trace_request(), 1)
    assert not result.ok and result.error and result.error.startswith(error) and "\n" not in result.error


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shutdown_aborts_a_retry_wait(receiver: Receiver, protocol: str) -> None:
    receiver.fail_next(1000, retry_after=30)
    sender = build_sender(settings_for(receiver, protocol, timeout_s=120))
    results: list[SendResult] = []
    worker = threading.Thread(target=lambda: results.append(sender.send(trace_request(), 1)), daemon=True)
    worker.start()
    receiver.wait_for_attempts(1)
    sender.shutdown()
    worker.join(10)  # generous, only against a hang: without shutdown() retries would go on for up to 120 s
    assert not worker.is_alive()
    assert len(results) == 1 and not results[0].ok and "shut down" in (results[0].error or "")
    attempts = receiver.attempts
    later = sender.send(trace_request(), 1)
    assert not later.ok and "shut down" in (later.error or "") and receiver.attempts == attempts


# ---- partial success ----

@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("signal", ["traces", "metrics"])
def test_partial_success_is_counted(receiver: Receiver, protocol: str, signal: str, sender_cleanup: list) -> None:
    receiver.partial_success = (2, "two items\nwere dropped")
    body = trace_request() if signal == "traces" else metrics_request()
    result = build(settings_for(receiver, protocol, signal), sender_cleanup).send(body, 3)
    assert result == SendResult(True, rejected=2, error="two items were dropped")
    assert receiver.attempts == 1  # a partial success is never retried


# ---- OTLP/JSON file ----

def test_json_file_sender_writes_one_line_per_request_with_hex_ids(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    sender = OtlpJsonFileSender(str(path), "traces")
    assert sender.send(trace_request("a"), 1) == SendResult(True)
    assert sender.send(trace_request("b"), 1) == SendResult(True)
    lines = path.read_text().splitlines()  # flushed: readable before shutdown
    assert len(lines) == 2
    span = json.loads(lines[0])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert (span["traceId"], span["spanId"], span["parentSpanId"]) == (TRACE_ID.hex(), SPAN_ID.hex(), PARENT_ID.hex())
    assert span["links"][0] == {"traceId": TRACE_ID.hex(), "spanId": PARENT_ID.hex()}
    assert span["kind"] == Span.SPAN_KIND_INTERNAL and span["name"] == "a"  # OTLP/JSON: enums as integers
    assert not sender.send(b"\xff not protobuf", 1).ok
    sender.shutdown()
    assert sender.send(trace_request(), 1) == SendResult(False, error="sender is shut down")
    assert len(path.read_text().splitlines()) == 2


def test_json_file_sender_metrics_and_threads(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    sender = OtlpJsonFileSender(str(path), "metrics")
    threads = [threading.Thread(target=lambda: [sender.send(metrics_request(), 1) for _ in range(25)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sender.shutdown()
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(docs) == 100
    exemplar = docs[0]["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0]["exemplars"][0]
    assert (exemplar["traceId"], exemplar["spanId"]) == (TRACE_ID.hex(), SPAN_ID.hex())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_json_file_sender_reports_write_errors() -> None:
    sender = OtlpJsonFileSender("/dev/full", "traces")
    result = sender.send(trace_request(), 1)
    assert not result.ok and result.error and "/dev/full" in result.error and "\n" not in result.error
    sender.shutdown()

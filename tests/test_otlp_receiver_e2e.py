"""OTLP export over real sockets: encoder -> OtlpTraceSink -> sender -> tests/otlp_receiver.py (gRPC and HTTP).
No protocol given is OTLP/HTTP (the specification's default), which the cases with protocol None exercise.

The production path and the SDK-object oracle (tests/oracle_spans.py, encoded by the SDK) both go
through the same sender, and the receiver must see the same trace from either.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from retsnoop_otel.capture.model import Call, RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.capture.sampling import ALWAYS, threshold
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.export.otlp_sink import OtlpTraceSink
from retsnoop_otel.export.resource import build_resource
from retsnoop_otel.export.semconv import SCHEMA_URL
from retsnoop_otel.export.senders import build_sender
from retsnoop_otel.export.span_encoder import EncodedTrace, SpanEncoder, WorkloadEnvelopes, make_envelope
from retsnoop_otel.runtime.config import AGENT_NAMES
from retsnoop_otel.runtime.settings import otlp_settings
from tests.fakes import EINVAL, OFFSET
from tests.oracle_spans import sdk_request, session_to_spans
from tests.otlp_receiver import load_spans, start_receiver

REPO = Path(__file__).resolve().parent.parent
FUNCS = {
    0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
    1: TracedFunc(1, "map_create", 0, RetKind.INT32, False),
    2: TracedFunc(2, "security_bpf", 0, RetKind.INT32, False),
}


def session():
    """A failing session as a probe set keeps it: always (threshold 0)."""
    create = Call(1, 1, 2_000, 8_000, EINVAL, children=[Call(2, 2, 2_100, 2_200, 0)])
    return Session(tid=7, pid=7, comm="simfail", proc_comm="simfail", start_ns=1_000, end_ns=9_000, is_err=True,
                   chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 6_000)], kstack=[0xFFFFFFFF81000000],
                   calls=[Call(0, 0, 1_000, 9_000, EINVAL, children=[create])], sampling_threshold=ALWAYS)


RANDOMNESS = 0xD0_1234_5678_9ABC  # >= th:c, as a 1-in-4 decision that kept the session drew it


def sampled_success():
    """A successful session kept by 1-in-4 probability sampling."""
    return Session(tid=7, pid=7, comm="simfail", proc_comm="simfail", start_ns=1_000, end_ns=9_000, is_err=False,
                   chain=[], kstack=[], calls=[Call(0, 0, 1_000, 9_000, 3, children=[Call(1, 1, 2_000, 8_000, 0)])],
                   sampling_threshold=threshold(0.25), trace_randomness=RANDOMNESS)


@pytest.fixture
def receiver_proc(tmp_path):
    out = tmp_path / "received.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    proc = subprocess.Popen([sys.executable, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0",
                             "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline().split() if ready else []
        assert line[:1] == ["READY"] and line[2:3] == ["HTTP"], f"receiver did not start: {line}"
        yield proc, int(line[1]), int(line[3]), out
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def wait_spans(path, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = load_spans(path) if path.exists() else []
        if len(spans) >= count:
            return spans
        time.sleep(0.05)
    raise AssertionError(f"expected {count} spans in {path}, got {len(spans)}")


def check_trace(spans, service="retsnoop-otel"):
    assert len({s["trace_id"] for s in spans}) == 1
    by_name = {s["name"]: s for s in spans}
    root, create, sec = by_name["__x64_sys_bpf"], by_name["map_create"], by_name["security_bpf"]
    assert root["parent_span_id"] == ""
    assert create["parent_span_id"] == root["span_id"] and sec["parent_span_id"] == create["span_id"]
    for failing in (root, create):
        assert failing["attributes"]["error.type"] == "EINVAL"
        assert failing["status_code"] == "STATUS_CODE_ERROR" and failing["status_message"] == "-EINVAL"
        assert failing["attributes"]["retsnoop.return_value"] == -22
    assert "error.type" not in sec["attributes"] and sec["status_code"] == "STATUS_CODE_UNSET"
    assert (root["start_ns"], root["end_ns"]) == (OFFSET + 1_000, OFFSET + 9_000)
    assert root["attributes"]["thread.id"] == 7 and root["attributes"]["process.executable.name"] == "simfail"
    assert all(s["kind"] == "SPAN_KIND_INTERNAL" for s in spans)
    assert root["scope"]["name"] == "retsnoop_otel"
    assert root["resource"]["service.name"] == service and root["resource"]["os.type"] == "linux"
    # conventions on the wire: schema URLs on resource and scope, errors kept at 100% (th:0)
    assert all(s["resource_schema_url"] == s["scope_schema_url"] == SCHEMA_URL for s in spans)
    assert all(s["trace_state"] == "ot=th:0" for s in spans)


def make_sink(port, protocol, environ=None, timeout_s=10, **kw):
    cfg = OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol, timeout_s=timeout_s)
    return OtlpTraceSink(build_sender(otlp_settings(cfg, "traces", AGENT_NAMES.otlp, environ or {})), **kw)


def encoder(resource):
    return SpanEncoder(FUNCS, make_envelope(resource.attributes, resource.schema_url))


def one_session(path, resource):
    """One session's spans the production way, or the oracle's SDK spans encoded by the SDK (same sender)."""
    if path == "fast":
        return encoder(resource).encode(session(), OFFSET)
    request = sdk_request(session_to_spans(session(), FUNCS, OFFSET, resource))
    spans = request.resource_spans[0].scope_spans[0]
    envelope = make_envelope(resource.attributes, resource.schema_url)
    return EncodedTrace(envelope, [b"\x12" + _len(s.SerializeToString()) for s in spans.spans])


def _len(payload: bytes) -> bytes:
    from retsnoop_otel.export.protowire import varint
    return varint(len(payload)) + payload


@pytest.mark.parametrize("path", ["fast", "sdk"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", None])
def test_export_to_subprocess_receiver(receiver_proc, protocol, path, monkeypatch):
    proxies = [v for v in os.environ if v.lower().endswith("_proxy")]  # the exporters must reach 127.0.0.1
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", *proxies):
        monkeypatch.delenv(var, raising=False)
    proc, grpc_port, http_port, out = receiver_proc
    port = grpc_port if protocol == "grpc" else http_port
    sink = make_sink(port, protocol)
    assert sink.submit(one_session(path, build_resource({})))
    assert sink.flush(15)
    sink.shutdown(5)
    assert sink.stats().spans_exported == 3 and sink.stats().export_errors == 0
    check_trace(wait_spans(out, 3))


@pytest.mark.parametrize("service_per_session", [True, False])
def test_sessions_arrive_under_their_own_service(receiver_proc, monkeypatch, service_per_session):
    """The default (exporter.service_name_from: workload): a session's resource names the traced process's
    service (here its executable, `simfail`; the application's own service.name and the container's name come
    first, tests/unit/test_service_name.py), without retsnoop-otel's service.version; `agent`: ours."""
    proxies = [v for v in os.environ if v.lower().endswith("_proxy")]
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", *proxies):
        monkeypatch.delenv(var, raising=False)
    proc, _grpc_port, http_port, out = receiver_proc
    sink = make_sink(http_port, None)  # the default protocol: OTLP/HTTP
    resource = build_resource({})
    sess = session()
    sess.exe_name = "simfail"
    enc = SpanEncoder(FUNCS, make_envelope(resource.attributes, resource.schema_url),
                      service_per_session=service_per_session,
                      workloads=WorkloadEnvelopes(resource.attributes, resource.schema_url))
    assert sink.submit(enc.encode(sess, OFFSET)) and sink.flush(15)
    sink.shutdown(5)
    spans = wait_spans(out, 3)
    assert {s["resource"]["service.name"] for s in spans} == {"simfail" if service_per_session else "retsnoop-otel"}
    assert all(("service.version" in s["resource"]) != service_per_session for s in spans)
    assert {s["scope"]["name"] for s in spans} == {"retsnoop_otel"}  # the tracer, named as the instrumentation


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_fast_path_batches_and_standard_settings(receiver_proc, protocol, monkeypatch):
    """Many sessions in few requests; gzip from OTEL_EXPORTER_OTLP_TRACES_COMPRESSION still applies."""
    proxies = [v for v in os.environ if v.lower().endswith("_proxy")]
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", *proxies):
        monkeypatch.delenv(var, raising=False)
    proc, grpc_port, http_port, out = receiver_proc
    port = grpc_port if protocol == "grpc" else http_port
    sink = make_sink(port, protocol, {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"}, max_batch_spans=12)
    enc = encoder(build_resource({"OTEL_SERVICE_NAME": "fast-path"}))  # the run's environment, as RuntimeDeps has it
    for _ in range(10):
        assert sink.submit(enc.encode(session(), OFFSET))
    assert sink.flush(15)
    sink.shutdown(5)
    assert sink.stats().spans_exported == 30 and sink.stats().export_errors == 0
    spans = wait_spans(out, 30)
    requests = [line for line in out.read_text().splitlines() if line.strip()]
    assert len(requests) == 3  # 12 + 12 + 6 spans: whole sessions batched together
    traces = {s["trace_id"] for s in spans}
    assert len(traces) == 10
    for trace_id in traces:
        check_trace([s for s in spans if s["trace_id"] == trace_id], service="fast-path")


def test_in_process_receiver_and_export_failure(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    receiver = start_receiver(http_port=0)
    try:
        sink = make_sink(receiver.port, "grpc")
        for path in ("sdk", "fast"):
            sink.submit(one_session(path, build_resource({})))
        assert sink.flush(15)
        sink.shutdown(5)
        spans = receiver.wait_for_spans(6)
        assert len({s["trace_id"] for s in spans}) == 2  # one trace per session
        check_trace([s for s in spans if s["trace_id"] == spans[0]["trace_id"]])
        dead_port = receiver.port
    finally:
        receiver.stop()
    # nothing listens any more: the export fails, is counted, and the caller never blocks
    sink = make_sink(dead_port, "grpc", timeout_s=1)
    t0 = time.perf_counter()
    sink.submit(one_session("fast", build_resource({})))
    assert time.perf_counter() - t0 < 0.1
    assert sink.flush(15)
    sink.shutdown(2)
    stats = sink.stats()
    assert stats.export_errors == 1 and stats.spans_dropped == {"export_failed": 3} and stats.spans_exported == 0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_sampled_success_carries_its_threshold_and_randomness(protocol):
    """1-in-4: every span says th:c, and the trace id's low 56 bits are the randomness the decision used,
    through both the production encoder and the SDK oracle."""
    receiver = start_receiver(http_port=0)
    try:
        sink = make_sink(receiver.port if protocol == "grpc" else receiver.http_port, protocol)
        resource = build_resource({})
        sink.submit(encoder(resource).encode(sampled_success(), OFFSET))
        request = sdk_request(session_to_spans(sampled_success(), FUNCS, OFFSET, resource))
        sdk_spans = request.resource_spans[0].scope_spans[0].spans
        sink.submit(EncodedTrace(make_envelope(resource.attributes, resource.schema_url),
                                 [b"\x12" + _len(s.SerializeToString()) for s in sdk_spans]))
        assert sink.flush(15)
        sink.shutdown(5)
        spans = receiver.wait_for_spans(4)
    finally:
        receiver.stop()
    assert {s["trace_state"] for s in spans} == {"ot=th:c"}
    assert len({s["trace_id"] for s in spans}) == 2
    assert {int(s["trace_id"], 16) & ((1 << 56) - 1) for s in spans} == {RANDOMNESS}
    assert {s["resource_schema_url"] for s in spans} == {SCHEMA_URL}


def test_receiver_accepts_otlp_json_and_rejects_other_paths():
    receiver = start_receiver(http_port=0)
    try:
        body = json.dumps({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "curl"}}]},
            "scopeSpans": [{"spans": [{
                "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "probe",
                "startTimeUnixNano": "1", "endTimeUnixNano": "2",
                "attributes": [{"key": "n", "value": {"intValue": "-5"}}]}]}]}]}).encode()
        url = f"http://127.0.0.1:{receiver.http_port}"
        req = urllib.request.Request(url + "/v1/traces", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
        (span,) = receiver.wait_for_spans(1)
        assert span["name"] == "probe" and span["attributes"] == {"n": -5}
        assert span["resource"]["service.name"] == "curl"
        # OTLP/JSON ids are hex (not protobuf-JSON base64): the raw bytes must survive the round trip
        assert (span["trace_id"], span["span_id"]) == ("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(urllib.request.Request(url + "/v1/logs", b"", method="POST"), timeout=5)
        assert info.value.code == 404
        with pytest.raises(TimeoutError, match="expected 2 spans, received 1"):
            receiver.wait_for_spans(2, timeout=0.2)
    finally:
        receiver.stop()

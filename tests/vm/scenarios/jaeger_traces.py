"""Guest side of issue 43 points 1-2: kernel traces as a real Jaeger holds them, behind the Collector pipeline.

Jaeger v2 runs in the guest with the shipped config/collector.yaml (tests/peers/jaeger.py: OTLP in, memory_limiter,
tail sampling that keeps every trace with an error, batch, the in-memory store; the agents' OTLP metrics out
through the prometheus exporter). The agent exports its traces (OTLP/HTTP) and its metrics (metrics.otlp,
OTLP/gRPC) there; one probe set in calls mode with an injected kretprobe, so that spans nest several levels deep
and one carries an event. Then simfail fails a bpf() call, and a Python service with the OTel SDK and the
publisher fails its requests in the kernel, exporting its own spans to the same Jaeger. What Jaeger returns from
its query API (the one its UI reads) is stored as it came, and so are the agent's /metrics and the Collector's
prometheus exporter, scraped at the same moment. Host-side assertions: tests/vm/test_jaeger_traces.py.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

from tests.otlp_json import PYTHON_EXE
from tests.peers.jaeger import Jaeger
from tests.vm.guest_batch import budget

PY = sys.executable
METRICS_PORT = 9482
SERVICE = "users-service"
CONFIG = """
probe_sets:
  - name: bpf_calls
    entry: ["*sys_bpf"]
    allow: [map_create, array_map_alloc_check]
    mode: calls
    inject: ["kretprobe:array_map_alloc_check"]
exporter:
  otlp:
    endpoint: {traces}
metrics:
  listen: "127.0.0.1:{metrics_port}"
  otlp:
    endpoint: http://{grpc}
    protocol: grpc
  otlp_interval: 2
logging:
  format: json
  level: debug
"""


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.read().decode()


def _wait_metric(url: str, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = _get(url)
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(2)


def _requests_in_jaeger(jaeger: Jaeger, service_out: str) -> list[dict]:
    """What Jaeger holds under each request's own trace id (the service prints them): evidence for a failure, which
    of the requests lost its kernel chain, its own spans or both."""
    out = []
    for line in service_out.splitlines():
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if "trace_id" not in req:
            continue
        trace = jaeger.trace(req["trace_id"]) or {}
        names = sorted({s["operationName"] for s in trace.get("spans", [])})
        out.append({"request": req["request"], "trace_id": req["trace_id"], "tid": req["tid"], "names": names})
    return out


@budget(400)
def scenario_jaeger_traces(ctx) -> dict:
    r: dict = {}
    jaeger = Jaeger(decision_wait="3s")
    agent = None
    try:
        cfg = Path(ctx.tmpdir) / "agent.yaml"
        cfg.write_text(CONFIG.format(traces=jaeger.otlp_http, grpc=jaeger.otlp_grpc, metrics_port=METRICS_PORT))
        agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg)])
        agent.wait_for_line(r"agent started", timeout=900)
        rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 300)
        r["simfail"] = {"rc": rc, "out": out, "err": err}
        # 6 s apart: the agent locates the service's thread context after its first failing call (its ELF files read
        # in 10 ms turns between polls); with 3 s, beside the host tests, one run ended with one of three joined
        # (the cause is not established: this gives the locate more slack, the outcome asserted is the same)
        service = ctx.spawn([PY, "-m", "tests.otel_service", "--requests", "3", "--interval", "6", "--endpoint",
                             jaeger.otlp_grpc],
                            env={"OTEL_PYTHON_CONTEXT": "retsnoop_thread_ctx", "OTEL_SERVICE_NAME": SERVICE})
        r["service_rc"] = service.wait(900)
        r["service_out"] = service.output()
        tags = {"error.type": "EINVAL"}
        r["kernel_url"] = jaeger.search_url(PYTHON_EXE, tags)
        r["kernel"] = jaeger.wait_find(PYTHON_EXE, tags, 1, 300)
        r["app_url"] = jaeger.search_url(SERVICE, tags)
        # every request's trace holds the kernel chain once the process was located (its first may not)
        deadline = time.monotonic() + 300
        while True:
            r["app"] = jaeger.find(SERVICE, tags)
            joined = [t for t in r["app"] if any(s["operationName"] == "__x64_sys_bpf" for s in t["spans"])]
            if len(joined) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(2)
        r["requests"] = _requests_in_jaeger(jaeger, r["service_out"])
        r["services"] = jaeger.services()
        # the same families twice: the agent's own /metrics, and its metrics.otlp push through the Collector
        r["agent_metrics"] = _get(f"http://127.0.0.1:{METRICS_PORT}/metrics")
        time.sleep(5)  # two more pushes at otlp_interval 2 s: the Collector holds values at least this new
        r["collector_metrics"] = _wait_metric(jaeger.prometheus, "retsnoop_function_errors_total", 120)
        r["agent_metrics_after"] = _get(f"http://127.0.0.1:{METRICS_PORT}/metrics")
    finally:
        if agent is not None:
            r["agent_rc"] = agent.terminate(timeout=300)
            log = agent.output()
            r["agent_log"] = log[-10000:]
            r["appctx_log"] = [line for line in log.splitlines() if "thread context" in line or "published" in line]
        r["jaeger_rc"] = jaeger.stop()
    return r

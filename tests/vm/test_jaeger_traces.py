"""Issue 43 points 1-2 on a real kernel: what Jaeger holds of the agent's kernel traces, found through the query API
its UI reads, behind the shipped Collector pipeline; and the agent's OTLP metrics through the Collector's prometheus
exporter, under the names and labels of its own /metrics. Guest side: tests/vm/scenarios/jaeger_traces.py."""

from __future__ import annotations

import re

import pytest

from tests.otlp_json import PYTHON_EXE
from tests.peers.jaeger import Span, spans_of

pytestmark = [pytest.mark.vm, pytest.mark.kernels("newest")]

CHAIN = ["__x64_sys_bpf", "__sys_bpf", "map_create", "array_map_alloc_check"]


def _kernel_trace(r: dict) -> list[Span]:
    """The simfail trace: the one whose root is the syscall and whose spans reach array_map_alloc_check."""
    for trace in r["kernel"]:
        spans = spans_of(trace)
        if any(s.name == "array_map_alloc_check" for s in spans):
            return spans
    raise AssertionError(f"no kernel trace of array_map_alloc_check in {r['kernel_url']}: {r['kernel']}")


def test_the_kernel_trace_is_found_by_service_and_error_type(vm_batch) -> None:
    r = vm_batch["jaeger_traces"]
    assert r["simfail"]["rc"] == 0, r["simfail"]
    assert PYTHON_EXE in r["services"] and "users-service" in r["services"], r["services"]
    assert r["kernel_url"].startswith("http://127.0.0.1:") and "/api/traces?service=" in r["kernel_url"]
    spans = _kernel_trace(r)
    assert len({s.trace_id for s in spans}) == 1


def test_the_span_tree_nests_the_error_chain_within_its_parents(vm_batch) -> None:
    spans = _kernel_trace(vm_batch["jaeger_traces"])
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if not s.parent_id]
    assert root.name == "__x64_sys_bpf"
    leaf = next(s for s in spans if s.name == "array_map_alloc_check")
    path = [leaf]
    while path[-1].parent_id:
        parent = by_id[path[-1].parent_id]
        child = path[-1]
        assert parent.start_us <= child.start_us and child.start_us + child.duration_us <= \
            parent.start_us + parent.duration_us + 1, (parent, child)  # microsecond rounding
        path.append(parent)
    assert [s.name for s in reversed(path)] == CHAIN


def test_status_and_attributes_of_the_failing_spans(vm_batch) -> None:
    spans = _kernel_trace(vm_batch["jaeger_traces"])
    for s in spans:
        if s.name in CHAIN and s.name != "map_create" or s.name == "map_create" and s.tags.get("error.type"):
            assert s.tags["error.type"] == "EINVAL", s
            assert s.tags["otel.status_code"] == "ERROR" and s.tags["error"] is True, s
            assert s.tags["code.function.name"] == s.name
            assert s.tags["retsnoop.return_value"] == -22
    root = next(s for s in spans if not s.parent_id)
    assert root.tags["process.executable.name"] == PYTHON_EXE
    assert isinstance(root.tags["thread.id"], int) and isinstance(root.tags["process.pid"], int)
    assert not re.search(r"0xffff[0-9a-f]{12}", str(spans))  # no kernel address leaves the host by default


def test_the_resource_says_which_host_and_kernel(vm_batch) -> None:
    root = next(s for s in _kernel_trace(vm_batch["jaeger_traces"]) if not s.parent_id)
    assert root.service == PYTHON_EXE
    res = root.resource
    assert res["os.type"] == "linux" and res["os.version"].startswith(vm_batch.series + ".")
    assert res["host.name"] and res["host.arch"] == "amd64" and res["telemetry.sdk.name"] == "retsnoop-otel"
    assert re.fullmatch(r"[0-9a-f-]{36}", res["service.instance.id"])


def test_the_injected_probe_is_an_event_of_its_span(vm_batch) -> None:
    spans = _kernel_trace(vm_batch["jaeger_traces"])
    events = [(s.name, e) for s in spans for e in s.events]
    assert events, spans
    name, event = events[0]
    assert event["fields"]["event"] == "kretprobe:array_map_alloc_check", event
    assert event["fields"]["retsnoop.probe.kind"] == "kretprobe" and event["fields"]["ret"] == -22, event
    assert name in CHAIN


def test_the_services_trace_holds_its_spans_and_the_kernel_chain(vm_batch) -> None:
    """One trace id in Jaeger: the service's request and load_user spans (its own SDK's export) and, under
    load_user, the kernel chain the agent exported."""
    r = vm_batch["jaeger_traces"]
    assert r["service_rc"] == 0, r["service_out"]
    joined = []
    for trace in r["app"]:
        spans = spans_of(trace)
        names = {s.name for s in spans}
        if {"GET /users/{id}", "load_user", "__x64_sys_bpf"} <= names:
            joined.append(spans)
    assert len(joined) >= 2, {"found by service and tags": [sorted({s.name for s in spans_of(t)}) for t in r["app"]],
                              "by the requests' trace ids": r.get("requests"), "service": r["service_out"],
                              "agent's thread-context log": r.get("appctx_log")}
    for spans in joined:
        by_id = {s.span_id: s for s in spans}
        kernel_root = next(s for s in spans if s.name == "__x64_sys_bpf")
        parent = by_id[kernel_root.parent_id]
        assert parent.name == "load_user" and parent.service == "users-service"
        assert parent.tags["error.type"] == "EINVAL"
        assert kernel_root.resource["telemetry.sdk.name"] == "retsnoop-otel"
        assert parent.resource.get("telemetry.sdk.name") == "opentelemetry"


def _series(text: str) -> dict[tuple[str, frozenset], float]:
    """retsnoop_* samples by (name, labels), without the labels the Collector adds (job, instance, otel_scope_*)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(retsnoop_[a-z_]+)(?:\{(.*)\})? (\S+)(?: \S+)?$", line)
        if not m:
            continue
        labels = frozenset((k, v) for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")
                           if k not in ("job", "instance") and not k.startswith("otel_scope_"))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def test_the_collector_exports_the_agents_metrics_under_the_same_names_and_labels(vm_batch) -> None:
    r = vm_batch["jaeger_traces"]
    agent, collector = _series(r["agent_metrics_after"]), _series(r["collector_metrics"])
    families = ("retsnoop_function_calls_total", "retsnoop_function_errors_total", "retsnoop_sessions_total",
                "retsnoop_session_duration_seconds_count", "retsnoop_function_duration_seconds_bucket")
    for family in families:
        mine = {k for k in agent if k[0] == family}
        theirs = {k for k in collector if k[0] == family}
        assert mine and mine == theirs, (family, sorted(mine ^ theirs)[:10])
    einval = ("retsnoop_function_errors_total", frozenset({("probe_set", "bpf_calls"),
                                                           ("function", "array_map_alloc_check"),
                                                           ("error_type", "EINVAL")}))
    assert agent[einval] >= 4 and collector[einval] == agent[einval], (agent.get(einval), collector.get(einval))
    # the Collector names the agent: job from service.name, instance from service.instance.id
    assert re.search(r'^retsnoop_function_errors_total\{.*job="retsnoop-otel".*\}', r["collector_metrics"], re.M)

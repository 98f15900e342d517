"""Issue 5 on real kernels: the agent with two probe sets, a real OTLP/gRPC receiver, reload and stop.

Guest side: tests/vm/scenarios/agent.py (scenario agent_two_probe_sets).
"""

from __future__ import annotations

import json
import re

import pytest

from retsnoop_otel.export.semconv import SCHEMA_URL
from tests.otlp_json import PYTHON_EXE, assert_nested, root_span
from tests.otlp_json import spans as otlp_spans

pytestmark = pytest.mark.vm


def _traces(r: dict) -> dict[str, list[dict]]:
    traces: dict[str, list[dict]] = {}
    for s in otlp_spans(r["otlp"]):
        traces.setdefault(s["traceId"], []).append(s)
    return traces


def test_check_resolves_both_probe_sets(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    assert r["check"]["rc"] == 0, r["check"]
    out = r["check"]["out"]
    assert "configuration is valid (2 probe sets)" in out
    assert re.search(r"probe set 'bpf_errors' \(mode stack, attach_mode auto -> \w+, success sessions: none\)", out)
    assert "probe set 'prog_load' (mode calls" in out and "success sessions: probability 1" in out
    assert "array_map_alloc_check" in out and "bpf_check" in out


def test_agent_attaches_and_is_healthy(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    assert r["progs_while_attached"], r["agent_output"][-3000:]
    code, body = r["healthz"]
    health = json.loads(body)
    assert code == 200 and health["status"] == "ok"
    assert [p["name"] for p in health["probe_sets"]] == ["bpf_errors", "prog_load"]
    assert health["attached_functions"] >= 4


def test_one_error_trace_per_failing_call_with_nested_einval(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    assert r["simfail1"]["rc"] == 0 and r["simfail2"]["rc"] == 0
    assert r["roots_after_simfail1"].count(["__x64_sys_bpf", "EINVAL"]) == 1, r["roots_after_simfail1"]
    errors = [t for t in _traces(r).values() if root_span(t)["attrs"].get("error.type") == "EINVAL"]
    assert len(errors) == 2  # one per bpf-bad-map-max-entries-array run (before and after the reload)
    first = min(errors, key=lambda t: int(root_span(t)["startTimeUnixNano"]))
    root = root_span(first)
    assert root["name"] == "__x64_sys_bpf" and root["status"]["code"] == "STATUS_CODE_ERROR"
    assert root["attrs"]["process.executable.name"] == PYTHON_EXE
    # timestamps fall inside the wall-clock window of the simfail process
    assert r["simfail1"]["start_ns"] <= int(root["startTimeUnixNano"]) <= int(root["endTimeUnixNano"]) \
        <= r["simfail1"]["end_ns"]
    leaf = [s for s in first if s["name"] == "array_map_alloc_check"]
    assert len(leaf) == 1 and leaf[0]["attrs"]["error.type"] == "EINVAL"
    assert leaf[0]["status"]["code"] == "STATUS_CODE_ERROR"
    assert_nested(first)
    assert {s.get("traceState") for s in first} == {"ot=th:0"}  # error sessions are always kept


def test_prog_load_success_is_a_calls_trace(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    loads = [t for t in _traces(r).values() if root_span(t)["name"] == "bpf_prog_load"]
    assert loads, r["roots_after_simfail1"]
    for trace in loads:
        root = root_span(trace)
        assert root["attrs"]["process.executable.name"] == PYTHON_EXE  # the comms filter kept bpftool out
        assert root["status"].get("code", "STATUS_CODE_UNSET") == "STATUS_CODE_UNSET"
        assert root["attrs"]["retsnoop.return_value"] >= 0 and "error.type" not in root["attrs"]
        assert_nested(trace)
        assert {s.get("traceState") for s in trace} == {"ot=th:0"}  # success_probability 1
    names = {s["name"] for t in loads for s in t}
    assert "bpf_check" in names, names
    child = next(s for t in loads for s in t if s["name"] == "bpf_check")
    assert child["parentSpanId"] and child["attrs"]["retsnoop.return_value"] == 0
    assert "retsnoop.start_estimated" not in child["attrs"]  # real per-call records, not the error chain


def test_resource_and_scope_name_the_semantic_conventions_schema(vm_batch) -> None:
    requests = vm_batch["agent_two_probe_sets"]["otlp"]
    groups = [rs for req in requests for rs in req.get("resourceSpans", [])]
    assert groups and all(rs.get("schemaUrl") == SCHEMA_URL for rs in groups)
    assert all(ss.get("schemaUrl") == SCHEMA_URL for rs in groups for ss in rs.get("scopeSpans", []))


def test_metrics_with_probe_set_labels_and_self_metrics(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    code, text = r["metrics"]
    assert code == 200
    assert re.search(r'^retsnoop_function_errors_total\{error_type="EINVAL",function="array_map_alloc_check",'
                     r'probe_set="bpf_errors"\} [1-9]', text, re.M), text
    assert re.search(r'^retsnoop_attached_functions\{mode="\w+",probe_set="prog_load"\} [1-9]', text, re.M)
    assert re.search(r"^retsnoop_agent_up 1\.0$", text, re.M)
    assert re.search(r'^retsnoop_config_reloads_total\{result="failure"\} 0\.0$', text, re.M)
    ctype, om = r["openmetrics"]
    assert ctype.startswith("application/openmetrics-text") and om.endswith("# EOF\n")
    assert re.search(r'^retsnoop_config_reloads_total\{result="failure"\} 1\.0$', r["metrics_after_reload"], re.M)


def test_broken_reload_keeps_the_old_config_running(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    out = r["agent_output"]
    failed = [json.loads(x) for x in out.splitlines() if '"config reload failed' in x]
    assert len(failed) == 1 and "bogus_key: unknown key" in failed[0]["error"]
    assert sorted(r["progs_after_reload"]) == sorted(r["progs_while_attached"])
    assert r["roots_after_reload"].count(["__x64_sys_bpf", "EINVAL"]) == 2


def test_sigterm_and_sigkill_leave_nothing_attached(vm_batch) -> None:
    r = vm_batch["agent_two_probe_sets"]
    assert r["agent_rc"] == 0, r["agent_output"][-3000:]
    assert '"detached"' in r["agent_output"] and '"exporters flushed"' in r["agent_output"]
    assert r["progs_after_sigterm"] == []
    assert r["progs_before_sigkill"]
    assert r["sigkill_rc"] == -9
    assert r["progs_after_sigkill"] == []


def test_source_location_attributes_where_dwarf_is_configured(vm_batch) -> None:
    """6.1 boots with its DWARF vmlinux in the agent config: spans say where each function is defined."""
    r = vm_batch["agent_two_probe_sets"]
    spans = otlp_spans(r["otlp"])
    leaf = [s for s in spans if s["name"] == "array_map_alloc_check"]
    assert leaf
    for s in leaf:
        if vm_batch.series == "6.1":
            assert s["attrs"]["code.file.path"] == "kernel/bpf/arraymap.c", s["attrs"]
            assert s["attrs"]["code.line.number"] > 0
        else:
            assert "code.file.path" not in s["attrs"]  # kallsyms only: no source location


def test_the_same_over_http_protobuf(vm_batch) -> None:
    h = vm_batch["agent_two_probe_sets"]["http"]
    assert h["simfail"]["rc"] == 0, h["simfail"]
    traces = _traces(h)
    errors = [t for t in traces.values() if root_span(t)["attrs"].get("error.type") == "EINVAL"]
    assert len(errors) == 1, h["roots"]
    root = root_span(errors[0])
    assert root["name"] == "__x64_sys_bpf" and root["status"]["code"] == "STATUS_CODE_ERROR"
    assert h["simfail"]["start_ns"] <= int(root["startTimeUnixNano"]) <= int(root["endTimeUnixNano"]) \
        <= h["simfail"]["end_ns"]
    assert [s["attrs"]["error.type"] for s in errors[0] if s["name"] == "array_map_alloc_check"] == ["EINVAL"]
    assert_nested(errors[0])
    loads = [t for t in traces.values() if root_span(t)["name"] == "bpf_prog_load"]
    assert loads and "bpf_check" in {s["name"] for t in loads for s in t}
    for trace in loads:
        assert_nested(trace)
    assert h["agent_rc"] == 0 and h["progs_after_sigterm"] == []

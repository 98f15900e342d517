"""Issue 11 on real kernels: kernel sessions inside the application's trace, user stacks, bad cases, cost.

Guest side: tests/vm/scenarios/app_context.py (scenario app_context). What the receiver got is read
from the protobuf JSON mapping (ids in base64).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.otlp_json import spans as otlp_spans

pytestmark = pytest.mark.vm
ROUND = re.compile(r"round (\d+) tid=(\d+) trace=([0-9a-f]{32}) span=([0-9a-f]{16}) ret=(-?\d+)")





def _kernel_roots(r: dict) -> list[dict]:
    """Root spans of the `app` probe set's sessions (the cost probe sets see only cost_writer)."""
    return [s for s in otlp_spans(r["otlp"]) if s["name"] == "__x64_sys_bpf"
            and s["attrs"]["process.executable.name"] != "cost_writer"]


def _by_tid(roots: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for s in roots:
        out.setdefault(s["attrs"]["thread.id"], []).append(s)
    return out


def _ids(lines: list[str]) -> dict[int, tuple[str, str]]:
    return {int(m[2]): (m[3], m[4]) for m in map(ROUND.match, lines) if m}


def test_writers_running_at_start_join_their_threads_traces(vm_batch) -> None:
    r = vm_batch["app_context"]
    assert r["publishing_at_start"] >= 6, r["agent_output"][-3000:]
    roots = _by_tid(_kernel_roots(r))
    ids = _ids(r["before"]["two"]["rounds"])
    assert len(ids) == 2 and len({t for t, _ in ids.values()}) == 2
    for tid, (trace, span) in ids.items():
        (root,) = roots[tid]
        # the kernel chain is in the application's trace, under its span (a remote parent)
        assert root["trace"] == trace and root["parent"] == span and root.get("flags") == 0x300, root
        assert "retsnoop.app.context" not in root["attrs"] and not root.get("links")
        # the whole chain below it: __x64_sys_bpf -> __sys_bpf -> array_map_alloc_check, all in that trace
        chain, parent = [], root["id"]
        while children := [s for s in otlp_spans(r["otlp"]) if s["parent"] == parent]:
            (child,) = children
            assert child["trace"] == trace, child
            chain.append(child["name"])
            parent = child["id"]
        assert chain and chain[-1] == "array_map_alloc_check", chain


def test_user_stack_names_the_writers_functions_in_order(vm_batch) -> None:
    r = vm_batch["app_context"]
    tid = next(iter(_ids(r["before"]["two"]["rounds"])))
    (root,) = _by_tid(_kernel_roots(r))[tid]
    frames = root["attrs"]["retsnoop.user_stacktrace"].splitlines()
    names = [f.split("+")[0] for f in frames]
    # innermost first: libc's syscall() (no frame pointer: its caller make_failing_call is not seen),
    # then the writer's functions with their source lines (-g), up to the thread start
    assert names.index("handle_request") < names.index("worker") < names.index("start_thread"), frames
    line = next(f for f in frames if f.startswith("handle_request+"))
    assert re.search(r"\(.*ctx_writer\.c:\d+\) \[writer_exe\]$", line), line


@pytest.mark.parametrize("name,status", [("invalid", "invalid"), ("null", "no_record"), ("badptr", "fault"),
                                         ("pagedout", "fault")])
def test_unusable_contexts_leave_the_session_in_its_own_trace(vm_batch, name, status) -> None:
    r = vm_batch["app_context"]
    (tid,) = _ids(r["before"][name]["rounds"])
    (root,) = _by_tid(_kernel_roots(r))[tid]
    assert root["parent"] is None and not root.get("links"), root
    assert root["attrs"]["retsnoop.app.context"] == status
    assert root["attrs"]["error.type"] == "EINVAL" or root["status"].get("code") == "STATUS_CODE_ERROR"


def test_a_corrupt_record_size_is_cut_and_still_joins(vm_batch) -> None:
    r = vm_batch["app_context"]
    ((tid, (trace, span)),) = _ids(r["before"]["bigsize"]["rounds"]).items()
    (root,) = _by_tid(_kernel_roots(r))[tid]
    assert root["trace"] == trace and root["parent"] == span
    assert root["attrs"]["retsnoop.app.attributes_cut"] is True


def test_a_process_started_after_the_agent_is_linked_from_its_next_session_at_the_latest(vm_batch) -> None:
    """Its first call comes right after it started: it is linked if the agent located the process from its exec
    by then (tests/vm/test_app_exec.py waits for that), else it makes the kernel side ask and stays unlinked;
    once the agent has located the variable, every thread's session joins its own trace."""
    r = vm_batch["app_context"]
    roots = _by_tid(_kernel_roots(r))
    first, second = _ids(r["after"]["round1"]), _ids(r["after"]["round2"])
    assert r["publishing_after"] >= 8 and set(first) == set(second) and len(second) == 2
    for tid, (trace, span) in second.items():
        s1, s2 = sorted(roots[tid], key=lambda s: int(s["startTimeUnixNano"]))
        trace1, span1 = first[tid]
        assert (s1["trace"], s1["parent"]) == (trace1, span1) or (s1["parent"] is None and s1["trace"] != trace1)
        assert s2["trace"] == trace and s2["parent"] == span


def test_short_lived_processes_still_export_their_sessions(vm_batch) -> None:
    r = vm_batch["app_context"]
    assert all(x["rc"] == 0 for x in r["short_lived"]), r["short_lived"]
    tids = [t for x in r["short_lived"] for t in _ids(x["out"].splitlines())]
    roots = _by_tid(_kernel_roots(r))
    assert len(tids) == 3 and all(len(roots.get(t, [])) == 1 for t in tids)


def test_python_service_spans_parent_the_kernel_chain(vm_batch) -> None:
    """The kernel root span's parent is a `load_user` span the service itself exported (the real SDK)."""
    r = vm_batch["app_context"]
    assert r["service_rc"] == 0, r["service_output"][-3000:]
    requests = [json.loads(x) for x in r["service_output"].splitlines() if x.startswith('{"request"')]
    assert len(requests) == 4
    spans = otlp_spans(r["otlp"])
    app_spans = {s["id"]: s for s in spans if s["resource"].get("service.name") == "users-service"
                 and s["scope"] != "retsnoop_otel"}  # the service's own; its kernel spans share its service
    assert {s["name"] for s in app_spans.values()} == {"GET /users/{id}", "load_user"}
    joined = [s for s in _kernel_roots(r) if s["parent"] in app_spans]
    assert len(joined) >= 2, "the service's later requests must be joined"
    for root in joined:
        parent = app_spans[root["parent"]]
        assert parent["name"] == "load_user" and parent["trace"] == root["trace"]
        assert root["attrs"]["retsnoop.app.service.name"] == "users-service"
        # found under the service's own name in Jaeger/Tempo (exporter.service_name_from: workload, the default)
        assert root["resource"]["service.name"] == "users-service" and "service.version" not in root["resource"]
        req = next(q for q in requests if q["span_id"] == parent["id"])
        assert root["attrs"]["retsnoop.app.user.id"] == str(1000 + req["request"])
        assert root["attrs"]["thread.id"] == req["tid"]


def test_outcomes_are_counted_without_a_log_storm_and_nothing_stays_attached(vm_batch) -> None:
    r = vm_batch["app_context"]
    m = r["metrics"]

    def outcome(name: str) -> float:
        found = re.search(rf'^retsnoop_app_context_sessions_total{{outcome="{name}"}} (\S+)$', m, re.M)
        return float(found.group(1)) if found else 0.0
    assert outcome("fault") == 2 and outcome("invalid") == 1 and outcome("no_record") == 1
    assert outcome("linked") >= 2 + 1 + 2 + 2
    assert "retsnoop_app_context_check_errors_total" in m
    warnings = [line for line in r["agent_output"].splitlines() if '"level": "warning"' in line]
    assert len(warnings) <= 6, warnings
    assert r["agent_rc"] == 0 and r["progs_after_stop"] == []


def _bpf_seconds(metrics: str) -> dict[str, float]:
    """BPF run time per probe set (entry and exit programs together, not the watcher's hooks), from kernel bpf_stats."""
    run_s: dict[str, float] = {}
    for m in re.finditer(r'^retsnoop_bpf_program_run_seconds_total\{(?![^}]*program="app_(?:exec|publish\w*)")[^}]*'
                         r'probe_set="(\w+)"[^}]*\} (\S+)$', metrics, re.M):
        run_s[m[1]] = run_s.get(m[1], 0.0) + float(m[2])
    return run_s


def test_cost_of_the_context_read_is_measured_side_by_side(vm_batch) -> None:
    """The same calls through three probe sets; the figures go to the README (no timing assertion here).

    Every bpf() call in the guest runs all three sets' programs (the comm filter sits inside them), so
    the figure is each set's extra BPF time over `plain`, per reported session of the writer.
    """
    r = vm_batch["app_context"]
    run_s = _bpf_seconds(r["metrics"])
    assert {"plain", "context", "context_ustack"} <= set(run_s), r["metrics"][-3000:]
    errors: dict[str, float] = {}  # one series per entry function: summed per probe set
    for m in re.finditer(r'^retsnoop_sessions_total\{(?=[^}]*outcome="error")[^}]*probe_set="(\w+)"[^}]*\} (\S+)$',
                         r["metrics"], re.M):
        errors[m[1]] = errors.get(m[1], 0.0) + float(m[2])
    assert all(errors[k] == r["cost_rounds"] for k in ("plain", "context", "context_ustack")), errors
    extra = {k: (run_s[k] - run_s["plain"]) / r["cost_rounds"] * 1e9 for k in ("context", "context_ustack")}
    print(f"\n[{vm_batch.release}] BPF ms per set: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in run_s.items())
          + f"; extra ns per reported session over plain: context {extra['context']:.0f}, "
          f"context+ustack {extra['context_ustack']:.0f}")

"""Issue 35 points 1-2 on real kernels: an application's handle_request(), the bpf() syscall it makes and the
kernel chain with the error, in one session, as text (-T and the stack), --json and OTLP spans at a real receiver;
the syscall's exit tracepoint (-J) inside that session, after the syscall returned.
Attached with uprobe.session on the newest kernel, uprobe.multi on 6.12 (no uprobe.session before 6.13); 5.10 has
no BPF cookies and refuses user functions in one line.

Guest side: tests/vm/scenarios/user_funcs.py (scenario user_funcs).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.otlp_json import attributes
from tests.otlp_json import spans as otlp_spans

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12", "newest")]
KERNEL_CHAIN = ["__x64_sys_bpf", "__sys_bpf", "map_create", "array_map_alloc_check"]


def _attached(vm_batch) -> dict:
    r = vm_batch["user_funcs"]
    assert r["dry_run"]["rc"] == 0, r["dry_run"]
    return r


def test_a_kernel_without_bpf_cookies_refuses_user_functions_in_one_line(vm_batch_510) -> None:
    r = vm_batch_510["user_funcs"]
    out = r["dry_run"]["out"] + r["dry_run"]["err"]
    assert r["dry_run"]["rc"] != 0 and "calls" not in r, r["dry_run"]
    lines = [line for line in out.splitlines() if line.startswith("retsnoop-otel: ")]
    assert len(lines) == 1 and "need BPF cookies" in lines[0] and "5.15" in lines[0], out


def test_the_user_attach_mode_is_the_kernels_cheapest_and_said_in_dry_run(vm_batch) -> None:
    r = _attached(vm_batch)
    out = r["dry_run"]["out"] + r["dry_run"]["err"]
    want = "uprobe.session" if vm_batch.at_least(6, 13) else "uprobe.multi"
    assert f"Would attach 3 user-space functions (1 entry) with {want}" in out, out
    assert re.search(r"^    handle_request \[u:\S+/user_app\]\s+errors: errno  \(\S+user_app\.c:\d+\)$", out, re.M), out
    assert re.search(r"^    find_handler \[u:\S+/user_app\]\s+errors: null", out, re.M), out


def test_one_session_holds_the_application_function_the_syscall_and_the_kernel_chain(vm_batch) -> None:
    r = _attached(vm_batch)
    run = r["calls"]
    assert run["started"] and run["workload"]["rc"] == 0, run["output"][-3000:]
    assert run["workload"]["out"].count("-> -22") == 2, run["workload"]
    out = run["output"]
    # the calls table: the application function holds the syscall and the kernel chain, in call order
    table = re.search(r"^→ handle_request \[user_app\]\n(.*?)^← handle_request \[user_app\]\s+\[-EINVAL\]",
                      out, re.M | re.S)
    assert table, out[-4000:]
    body = table.group(1)
    assert re.search(r"^    ↔ parse_request \[user_app\]\s+\[0\]", body, re.M), body
    assert re.search(r"^    ↔ find_handler \[user_app\]\s+\[0x[0-9a-f]+\]", body, re.M), body
    names = [m.group(2) for m in re.finditer(r"^( *)[→↔] (\S+)", body, re.M)]
    assert names[-len(KERNEL_CHAIN):] == KERNEL_CHAIN, body
    assert re.search(r"^ {16}↔ array_map_alloc_check\s+\[-EINVAL\]", body, re.M), body
    # the syscall's exit tracepoint fires after __x64_sys_bpf returned, still inside handle_request (-J)
    assert re.search(r"^    ← __x64_sys_bpf\s+\[-EINVAL\].*\n    ◎ tp:syscalls:sys_exit_bpf  __syscall_nr=321  ret=-22",
                     body, re.M), body
    # the stack (-E): the application function above the kernel's frames, with its source line
    stack = out[out.index("← handle_request"):]
    user_row = re.search(r"^\s+\d+us \[-EINVAL\]\s+handle_request \[user_app\]\s+\(\S*user_app\.c:\d+\)$", stack, re.M)
    sys_row = re.search(r"^\s+\d+us \[-EINVAL\]\s+__x64_sys_bpf\+0x[0-9a-f]+", stack, re.M)
    assert user_row and sys_row and user_row.start() < sys_row.start(), stack[:3000]
    assert re.search(r"^!\s+\d+us \[-EINVAL\]\s+array_map_alloc_check", stack, re.M), stack[:3000]
    assert run["rc"] == 0 and run["progs_while_attached"] and run["progs_after"] == []


def test_the_tree_is_one_otlp_trace_across_the_boundary(vm_batch) -> None:
    r = _attached(vm_batch)
    spans = otlp_spans(r["otlp"])
    roots = [s for s in spans if s["name"] == "handle_request" and not s.get("parentSpanId")]
    assert len(roots) == 2, [(s["name"], s.get("parentSpanId")) for s in spans]
    for root in roots:
        assert root["attrs"]["error.type"] == "EINVAL" and root["status"]["code"] == "STATUS_CODE_ERROR"
        assert root["attrs"]["retsnoop.binary"] == r["app_path"]
        assert root["attrs"]["code.file.path"].endswith("user_app.c") and root["attrs"]["code.line.number"] > 0
        trace = {s["spanId"]: s for s in spans if s["traceId"] == root["traceId"]}
        leaf = next(s for s in trace.values() if s["name"] == "array_map_alloc_check")
        assert leaf["attrs"]["error.type"] == "EINVAL"
        chain = []
        node = leaf
        while node.get("parentSpanId"):
            chain.append(node["name"])
            parent = trace[node["parentSpanId"]]
            assert int(parent["startTimeUnixNano"]) <= int(node["startTimeUnixNano"])
            assert int(node["endTimeUnixNano"]) <= int(parent["endTimeUnixNano"])
            node = parent
        assert node is root and chain[::-1] == KERNEL_CHAIN, chain
        siblings = sorted(s["name"] for s in trace.values() if s.get("parentSpanId") == root["spanId"])
        assert siblings == ["__x64_sys_bpf", "find_handler", "parse_request"], siblings
        (event,) = [e for e in root.get("events", []) if e["name"] == "tp:syscalls:sys_exit_bpf"]
        assert attributes(event["attributes"]) == {"retsnoop.probe.kind": "tp", "__syscall_nr": 321, "ret": -22}


def test_json_sessions_hold_the_chain_from_the_application_function_down(vm_batch) -> None:
    r = _attached(vm_batch)
    run = r["json"]
    objs = [json.loads(line) for line in run["output"].splitlines() if line.startswith("{")]
    sessions = [o for o in objs if "origins" not in o]  # the origin table at stop is no session
    assert len(sessions) == 2, run["output"][-3000:]
    for s in sessions:
        chain = s["chain"]
        assert [c["function"] for c in chain] == ["handle_request", *KERNEL_CHAIN], chain
        assert chain[0]["binary"] == r["app_path"] and re.search(r"user_app\.c:\d+$", chain[0]["source"])
        assert all(c["error"] == "EINVAL" for c in chain), chain
        assert s["exe"] == "user_app"

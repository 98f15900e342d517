"""Issue 33 point 6 on real kernels: a process started after the agent has its first failing request's kernel chain
under its own span. The agent finds it from its exec (the raw tracepoint sched_process_exec) and checks it again as
its libraries load, before any session of it ran.

Guest side: tests/vm/scenarios/app_exec.py (scenario app_exec). The oldest supported kernel (the publish hooks at
syscall tracepoints) and the newest (folded into kprobe.session's link of entry functions).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.otlp_json import spans as otlp_spans

pytestmark = [pytest.mark.vm, pytest.mark.kernels("oldest", "newest")]
ROUND = re.compile(r"round (\d+) tid=(\d+) trace=([0-9a-f]{32}) span=([0-9a-f]{16}) ret=(-?\d+)")


def _roots(r: dict) -> list[dict]:
    return [s for s in otlp_spans(r["otlp"]) if s["name"] == "__x64_sys_bpf"]


def test_a_writer_started_after_the_agent_is_located_from_its_exec_before_its_first_call(vm_batch) -> None:
    r = vm_batch["app_exec"]
    ids = {int(m[2]): (m[3], m[4]) for m in map(ROUND.match, r["writer_rounds"]) if m}
    assert len(ids) == 2
    roots = {s["attrs"]["thread.id"]: s for s in _roots(r) if s["attrs"]["process.pid"] == r["writer_pid"]}
    assert set(roots) == set(ids), roots
    for tid, (trace, span) in ids.items():  # the first call of each thread, in its own trace, under its span
        root = roots[tid]
        assert root["trace"] == trace and root["parent"] == span, root
        assert "retsnoop.app.context" not in root["attrs"]
    watch = r["writer_watch"]  # found by the exec hook, not by a session of it
    assert watch is not None and watch["outcome"] == "located", (watch, r["agent_output"][-3000:])


def test_a_python_service_started_after_the_agent_joins_from_its_first_request(vm_batch) -> None:
    """Nothing waits for the agent here: the service loads the publisher's library while it imports (after its exec)
    and makes its first failing request once its SDK is set up (90 ms later on this host, a second or two under
    emulation); its publish record has the agent check it at once."""
    r = vm_batch["app_exec"]
    assert r["service_rc"] == 0, r["service_output"][-3000:]
    requests = [json.loads(x) for x in r["service_output"].splitlines() if x.startswith('{"request"')]
    assert len(requests) == 3
    spans = otlp_spans(r["otlp"])
    load_user = {s["id"]: s for s in spans if s["name"] == "load_user"
                 and s["resource"].get("service.name") == "orders-service"}
    assert len(load_user) == 3
    roots = [s for s in _roots(r) if s["attrs"]["process.pid"] == r["service_pid"]]
    by_parent = {s["parent"]: s for s in roots}
    for req in requests:  # the first request included
        root = by_parent.get(req["span_id"])
        assert root is not None, (req, [(s["parent"], s["trace"]) for s in roots])
        assert root["trace"] == req["trace_id"] == load_user[req["span_id"]]["trace"]
        assert root["attrs"]["retsnoop.app.user.id"] == str(1000 + req["request"])
        assert root["resource"]["service.name"] == "orders-service"
    assert r["service_watch"] is not None and r["service_watch"]["outcome"] == "located", r["service_watch"]
    # its memfd_create("OTEL_CTX") reached the agent (bpf/appctx.bpf.h app_publish): it was checked then, not
    # up to a second later at its next timed check, a second its first request may not leave
    assert [p for p in r["published"] if p["pid"] == r["service_pid"]], (r["published"], r["agent_output"][-3000:])
    # and a mapping named OTEL_CTX by prctl(PR_SET_VMA) reached it too (the kprobe program's other syscall, by its
    # cookie, where the publish hooks are kprobes)
    assert [p for p in r["published"] if p["pid"] == r["vma_namer_pid"]], (r["published"], r["agent_output"][-3000:])
    # the default mode on the newest kernel (kprobe.session) proves it: the publish hooks are members of that mode's
    # link of entry functions there (no program of their own: the two records above came through the mode's entry
    # program), which leave other syscalls alone and add no link to detach (kernel/app_hooks.py folded); syscall
    # tracepoints on 5.10 (no kprobe.multi)
    assert r["publish_prog_types"] == ([] if vm_batch.at_least(5, 18) else ["tracepoint"]), \
        (r["publish_prog_types"], r["agent_output"][-3000:])


def test_the_exec_hook_follows_the_probe_sets_filters_and_is_detached_at_stop(vm_batch) -> None:
    r = vm_batch["app_exec"]
    watched = {w["pid"] for w in r["watches"]}
    assert r["bystander_pid"] not in watched and {r["writer_pid"], r["service_pid"]} <= watched
    assert any('outcome="located"' in line and not line.endswith(" 0.0") for line in r["exec_watch_metric"]), \
        r["exec_watch_metric"]
    assert r["agent_rc"] == 0 and r["progs_after_stop"] == []
    print(f"\n[{vm_batch.release}] watches ended: " + "; ".join(
        f"pid {w['pid']} {w['outcome']} after {w['after_exec_s']} s, {w['checks']} checks" for w in r["watches"]))

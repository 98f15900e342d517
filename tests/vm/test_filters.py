"""Issue 3 filters on real kernels: each filter keeps what it should and drops what it should.

Guest side: tests/vm/scenarios/filters.py. Every workload process is matched to the tracer's --json
sessions by pid; each process is designed so that exactly one filter decides its fate.
"""

from __future__ import annotations

import errno

import pytest

pytestmark = pytest.mark.vm


def _by_pid(sessions: list[dict], pid: int) -> list[dict]:
    return [s for s in sessions if s["pid"] == pid]


def _errors(session: dict) -> set[str]:
    return {c["error"] for c in session["chain"] if c["error"]}


def _chain_result(session: dict, function: str) -> str | None:
    return next((c["error"] for c in session["chain"] if c["function"] == function), None)


def _case_errnos(workload: dict) -> list[int]:
    assert workload["rc"] == 0, workload["output"]
    return [r["errno"] for r in workload["results"]]


def _tracer_clean(r: dict) -> None:
    assert r["tracer"]["rc"] == 0, r["tracer"]["output"][-3000:]
    assert "Traceback" not in r["tracer"]["output"]
    assert r["tracer"]["progs_after"] == []


def test_comm_allow_deny_and_errno_allow(vm_batch) -> None:
    r = vm_batch["filter_comm_errors"]
    w = r["workload"]
    # the workload really produced the errors the filters have to sort out
    assert _case_errnos(w["sfa"]) == [errno.E2BIG, errno.EINVAL]
    assert _case_errnos(w["sfb"]) == [errno.EINVAL]
    assert _case_errnos(w["sfc"]) == [errno.EINVAL]
    sessions = r["sessions"]
    kept = _by_pid(sessions, w["sfa"]["pid"])
    # -n sfa keeps sfa's EINVAL session; -x EINVAL drops sfa's E2BIG one
    assert len(kept) == 1, sessions
    assert (kept[0]["comm"], kept[0]["proc_comm"]) == ("sfa", "sfa")
    assert kept[0]["is_err"] and _errors(kept[0]) == {"EINVAL"}
    assert _chain_result(kept[0], "array_map_alloc_check") == "EINVAL"
    # -N sfb wins over -n sfb; sfc is not in the -n set
    assert _by_pid(sessions, w["sfb"]["pid"]) == []
    assert _by_pid(sessions, w["sfc"]["pid"]) == []
    assert all(s["comm"] == "sfa" and "E2BIG" not in _errors(s) for s in sessions), sessions
    _tracer_clean(r)


def test_pid_allow_and_errno_deny(vm_batch) -> None:
    r = vm_batch["filter_pid_errors"]
    assert _case_errnos(r["target"]) == [errno.E2BIG, errno.EINVAL]
    assert _case_errnos(r["other"]) == [errno.EINVAL]
    sessions = r["sessions"]
    kept = _by_pid(sessions, r["target"]["pid"])
    # -p keeps the target's EINVAL session; -X -E2BIG drops its E2BIG session
    assert len(kept) == 1, sessions
    assert _errors(kept[0]) == {"EINVAL"} and _chain_result(kept[0], "array_map_alloc_check") == "EINVAL"
    # -p drops the other process (and everything else in the guest)
    assert _by_pid(sessions, r["other"]["pid"]) == []
    assert {s["pid"] for s in sessions} == {r["target"]["pid"]}
    _tracer_clean(r)


def test_min_duration_success_no_pid_and_cgroup(vm_batch) -> None:
    r = vm_batch["filter_duration_pid_cgroup"]
    assert r["in_cgroup"] == {"keep": True, "short": True, "denied": True} and r["nested"]
    w = r["workload"]
    for name in ("keep", "short", "denied", "outside"):
        assert _case_errnos(w[name]) == [0], name
    sessions = r["sessions"]
    kept = _by_pid(sessions, w["keep"]["pid"])
    # -S keeps a successful session; -L 500 keeps the 1 s sleep; --cgroup keeps a task in a cgroup below
    assert len(kept) == 1, sessions
    entry = kept[0]["chain"][0]
    assert entry["function"].endswith(("sys_clock_nanosleep", "sys_nanosleep")), kept
    assert not kept[0]["is_err"] and entry["error"] is None and entry["result"] == "0"
    assert entry["latency_ns"] >= 500_000_000
    assert kept[0]["end_ns"] - kept[0]["start_ns"] >= 500_000_000
    # -L drops the 1 ms sleep, -P the 1 s sleep of the denied pid, --cgroup the sleeper outside
    assert _by_pid(sessions, w["short"]["pid"]) == []
    assert _by_pid(sessions, w["denied"]["pid"]) == []
    assert _by_pid(sessions, w["outside"]["pid"]) == []
    assert {s["pid"] for s in sessions} == {w["keep"]["pid"]}
    _tracer_clean(r)

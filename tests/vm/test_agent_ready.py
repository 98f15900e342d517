"""Issue 49: once the agent answers on its port (its first /metrics or /healthz answer), once it logs "config
reloaded", and once `trace` prints "Receiving data...", every failing call is counted in the kernel and exported,
in every attach mode the kernel has, from processes born before and after it (tests/vm/scenarios/agent_ready.py)."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12", "newest")]

FAILS = {"htab_map_alloc_check": 3, "array_map_alloc_check": 2}  # one run of the workload


def _value(metrics: str, family: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        name, _, rest = line.partition("{")
        if name == family and rest.startswith(want + "}"):
            return float(rest.rsplit(" ", 1)[1])
    raise AssertionError(f"no {family}{{{want}}} in:\n{metrics[:4000]}")


def _sets(r: dict) -> list[str]:
    return ["maps", *(f"maps_{m}" for m in r["modes"])]


def _check_counts(metrics: str, sets: list[str], runs: int) -> None:
    for ps in sets:
        assert _value(metrics, "retsnoop_sessions_total", probe_set=ps, entry_function="__x64_sys_bpf",
                      outcome="error") == 5 * runs, ps
        for func, n in FAILS.items():
            assert _value(metrics, "retsnoop_function_errors_total", probe_set=ps, function=func,
                          error_type="EINVAL") == n * runs, (ps, func)


def test_the_kernels_modes_each_have_a_probe_set(vm_batch) -> None:
    modes = vm_batch["agent_ready"]["modes"]
    assert {"fentry", "kprobe", "kprobe_multi", "kprobe_session"} <= set(modes), modes
    if vm_batch.at_least(7, 0):
        assert {"fsession", "fsession_multi"} <= set(modes), modes


def test_calls_right_after_the_first_answer_are_counted_and_exported(vm_batch) -> None:
    r = vm_batch["agent_ready"]
    calls = re.findall(r"^call (\w+) (-?\d+) (\d+) (\d+)$", r["start_workload"], re.M)
    assert [(k, res, err) for k, res, err, _ in calls] == [("htab", "-1", "22")] * 3 + [("array", "-1", "22")] * 2
    assert len({pid for *_, pid in calls}) == 2  # the waiter (born before the agent) and its child (born after)
    assert r["first_healthz"]["status"] == 200 and r["first_healthz"]["body"]["attached_functions"] > 0
    sets = _sets(r)
    _check_counts(r["start_metrics"], sets, runs=1)
    assert r["start_spans"] == {"roots": 5 * len(sets), "leaves": {f: n * len(sets) for f, n in FAILS.items()}}


def test_calls_right_after_a_reload_are_counted_once_and_counters_go_on(vm_batch) -> None:
    r = vm_batch["agent_ready"]
    assert r["reload_workload"]["rc"] == 0, r["reload_workload"]
    sets = _sets(r)
    _check_counts(r["reload_metrics"], sets, runs=2)  # carried over the reload: never down, nothing twice
    assert r["reload_spans"] == {"roots": 10 * len(sets),
                                 "leaves": {f: 2 * n * len(sets) for f, n in FAILS.items()}}
    assert r["agent_rc"] == 0, r["agent_log"][-3000:]


def test_trace_captures_calls_right_after_receiving_data(vm_batch) -> None:
    r = vm_batch["agent_ready"]
    out = r["trace_output"]
    assert "Receiving data..." in out
    assert len(re.findall(r"^call \w+ -1 22 \d+$", r["trace_workload"], re.M)) == 5
    assert out.count("TID/PID") == 5, out[-5000:]
    assert len(re.findall(r"^!.*\]\s+htab_map_alloc_check$", out, re.M)) == 3, out[-5000:]
    assert len(re.findall(r"^!.*\]\s+array_map_alloc_check$", out, re.M)) == 2, out[-5000:]

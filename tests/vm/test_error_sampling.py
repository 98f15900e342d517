"""Issue 46 point 2 on 6.12: failing sessions sampled for export (sampling.errors), origin counts exact.

Guest side: tests/vm/scenarios/error_sampling.py.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12")]


def test_sampled_error_sessions_keep_the_origin_counts_exact(vm_batch) -> None:
    """sampling.errors 0.1 (with 1% of the successes), in the agent: the origin series count every failing call
    (70 and 50: at 0.1, 7 and 5 failures would export none of an origin half the time), about one failing session
    in ten is exported, each with its probability as tracestate th (threshold of 0.1: e666) and its randomness in the
    trace id, the others are counted as sampled out; the origin series' exemplars point at exported traces."""
    from retsnoop_otel.capture.sampling import threshold

    r = vm_batch["error_sampling"]
    assert r["workload"][:2] == [0, "{'ok': 300, 'array_failed': 70, 'hash_failed': 50}"], r["workload"]
    lines = r["metrics"]
    for origin, n in (("array_map_alloc_check", 70), ("htab_map_alloc_check", 50)):
        assert f'retsnoop_error_origins_total{{entry="__x64_sys_bpf",error_type="EINVAL",origin="{origin}",' \
               f'probe_set="origins"}} {n}.0' in lines, lines
    for lost in ("retsnoop_error_origins_dropped_total", "retsnoop_sessions_dropped_total",
                 "retsnoop_records_lost_total"):
        assert f'{lost}{{probe_set="origins"}} 0.0' in lines, lines
    errors = [s for s in r["roots"] if s["error"]]
    assert 1 <= len(errors) < 60, r["roots"]  # 12 expected (binomial, sd 3.3); all 120 is what 1.0 exports
    assert len(errors) + r["sampled_error"] == 120, (len(errors), r["sampled_error"])
    assert f'retsnoop_sessions_not_exported_total{{probe_set="origins",reason="sampled_error"}} ' \
           f'{r["sampled_error"]}.0' in lines, lines
    assert {s["state"] for s in errors} == {"ot=th:e666"}, errors
    assert all(int(s["trace"], 16) & ((1 << 56) - 1) >= threshold(0.1) for s in errors), errors
    assert {s["origin"] for s in errors} <= {"array_map_alloc_check", "htab_map_alloc_check"}, errors
    successes = [s for s in r["roots"] if not s["error"]]
    assert {s["state"] for s in successes} <= {"ot=th:fd70a"}, successes  # 1%: 3 expected of 300
    exported = {s["trace"]: s["origin"] for s in errors}
    assert r["exemplars"] and all(exported.get(t) == o for o, t in r["exemplars"]), (r["exemplars"], exported)
    assert r["agent_rc"] == 0 and r["progs_after"] == [], r

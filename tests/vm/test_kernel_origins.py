"""Issue 46 point 1 on real kernels: failing sessions counted by error origin in the kernel, exactly.

Guest side: tests/vm/scenarios/kernel_origins.py. bpf() fails 7 times in array_map_alloc_check (BPF_MAP_CREATE,
max_entries 0 of an array) and 5 times in htab_map_alloc_check (of a hash map), among 300 successes sampled at 1%."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("oldest", "6.12", "newest")]

SERIES = [["__x64_sys_bpf", "array_map_alloc_check", "EINVAL", 7],
          ["__x64_sys_bpf", "htab_map_alloc_check", "EINVAL", 5]]
LOSSES = ("dropped_sessions", "incomplete_sessions", "dropped_records", "origins_dropped")


def test_two_origins_counted_exactly_in_the_kernel(vm_batch) -> None:
    main = vm_batch["error_origins"]["main"]
    assert main["workload"][:2] == [0, "{'ok': 300, 'array_failed': 7, 'hash_failed': 5}"], main["workload"]
    cs = main["capture_stats"]
    assert all(cs[k] == 0 for k in LOSSES), cs
    assert main["kernel"] == SERIES, main
    assert cs["sessions_started"] == 312 and cs["origins_dropped"] == 0, cs


def test_the_kernel_and_the_stack_view_name_the_same_origins(vm_batch) -> None:
    """Every failing session is reported (errors are not sampled): user space's origins, from the error chains it
    received, are the kernel's counts one by one; --json carries them."""
    main = vm_batch["error_origins"]["main"]
    assert main["reported"]["errors"] == 12, main["reported"]
    assert main["user"] == main["kernel"], main
    assert main["with_calls"] == 12 and main["oracle_mismatch"] == [], main
    assert main["json_origins"] == [["array_map_alloc_check", 7], ["htab_map_alloc_check", 5]], main["json_origins"]


def test_the_collector_serves_the_origin_series(vm_batch) -> None:
    lines = vm_batch["error_origins"]["main"]["metrics"]
    assert 'retsnoop_error_origins_total{entry="__x64_sys_bpf",error_type="EINVAL",origin="array_map_alloc_check",' \
        'probe_set="origins"} 7.0' in lines, lines
    assert 'retsnoop_error_origins_total{entry="__x64_sys_bpf",error_type="EINVAL",origin="htab_map_alloc_check",' \
        'probe_set="origins"} 5.0' in lines, lines
    assert 'retsnoop_error_origins_dropped_total{probe_set="origins"} 0.0' in lines, lines


def test_every_attach_mode_of_the_kernel_counts_origins(vm_batch) -> None:
    """Each mode's programs pass the verifier with the counting in them, and count the same (5.10 offers only its
    default mode, which the tests above ran)."""
    modes = vm_batch["error_origins"]["modes"]
    assert modes or vm_batch.series == "5.10", "no other attach mode on this kernel"
    want = [["__x64_sys_bpf", "array_map_alloc_check", "EINVAL", 3],
            ["__x64_sys_bpf", "htab_map_alloc_check", "EINVAL", 2]]
    bad = {m: r.get("error") or r["kernel"] for m, r in modes.items() if r.get("error") or r["kernel"] != want}
    assert not bad, bad


def test_trace_prints_the_kernels_origin_table_at_stop(vm_batch) -> None:
    """-x E2BIG keeps every session out of the output; the table still counts them (the kernel's counts)."""
    r = vm_batch["trace_origin_table"]
    assert r["workload"][:2] == [0, "{'ok': 0, 'array_failed': 3, 'hash_failed': 2}"], r["workload"]
    assert r["tracer"]["rc"] == 0 and r["tracer"]["progs_after"] == [], r["tail"]
    assert r["session_origins"] == [], r["tail"]
    assert r["table"] == [{"origins": [
        {"count": 3, "error": "EINVAL", "origin": "array_map_alloc_check", "entry": "__x64_sys_bpf", "share": 0.6},
        {"count": 2, "error": "EINVAL", "origin": "htab_map_alloc_check", "entry": "__x64_sys_bpf", "share": 0.4},
    ]}], r["tail"]


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

"""Issue 46 point 1 on real kernels: failing sessions counted by error origin in the kernel, exactly.

Guest side: tests/vm/scenarios/kernel_origins.py. bpf() fails 7 times in array_map_alloc_check (BPF_MAP_CREATE,
max_entries 0 of an array) and 5 times in htab_map_alloc_check (of a hash map), among 300 successes sampled at 1%."""

from __future__ import annotations

from itertools import pairwise

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
    assert [w[:2] for w in r["workload"]] == [[0, "{'ok': 0, 'array_failed': 3, 'hash_failed': 2}"],
                                              [0, "{'ok': 0, 'array_failed': 2, 'hash_failed': 1}"]], r["workload"]
    assert r["tracer"]["rc"] == 0 and r["tracer"]["progs_after"] == [], r["tail"]
    assert r["session_origins"] == [], r["tail"]
    assert r["table"] == [{"origins": [
        {"count": 5, "error": "EINVAL", "origin": "array_map_alloc_check", "entry": "__x64_sys_bpf", "share": 0.625},
        {"count": 3, "error": "EINVAL", "origin": "htab_map_alloc_check", "entry": "__x64_sys_bpf", "share": 0.375},
    ]}], r["tail"]


def test_trace_origins_interval_tables_add_up_to_the_runs(vm_batch) -> None:
    """--origins-interval 1: one object per interval, back to back, the last one ending at the stop; the two rounds
    of failing calls land in different intervals, and the intervals' counts add up to the run's table."""
    r = vm_batch["trace_origin_table"]
    intervals, table = r["intervals"], r["table"]
    assert sum(bool(o["origins"]) for o in intervals) >= 2, intervals
    assert all(b["start_ns"] == a["end_ns"] for a, b in pairwise(intervals)), intervals
    assert all(0 < o["seconds"] and o["end_ns"] > o["start_ns"] for o in intervals), intervals
    summed: dict = {}
    for o in intervals:
        for row in o["origins"]:
            key = (row["entry"], row["origin"], row["error"])
            summed[key] = summed.get(key, 0) + row["count"]
    assert len(table) == 1 and summed == {(row["entry"], row["origin"], row["error"]): row["count"]
                                          for row in table[0]["origins"]}, (intervals, table)


def test_trace_origins_only_counts_every_failing_call_without_sessions(vm_batch) -> None:
    """--syscalls --origins-only (kretprobe.multi, Linux 5.18+): the table at stop counts the failing bpf() calls
    exactly, 20 successes not at all, and no session is printed; 5.10 says in one line that it lacks kprobe.multi."""
    r = vm_batch["trace_origins_only"]
    if vm_batch.series == "5.10":
        assert r["refused"] and r["rc"] == 1 and r["progs_after"] == [], r["output"]
        (line,) = [x for x in r["output"].splitlines() if x.startswith("retsnoop-otel: ")]
        assert "has no kprobe_multi (Linux 5.18+ needed), so --origins-only (kretprobe.multi) cannot be used" in line, \
            line
        return
    assert not r["refused"], r["output"]
    assert r["workload"][:2] == [0, "{'ok': 20, 'array_failed': 3, 'hash_failed': 2}"], r["workload"]
    assert r["tracer"]["rc"] == 0 and r["tracer"]["progs_after"] == [], r["tail"]
    (table,) = r["lines"]  # the workload's other failing syscalls (Python's start looks for files) are there too
    rows = [row for row in table["origins"] if row["entry"] == "__x64_sys_bpf"]
    assert [(row["origin"], row["error"], row["count"]) for row in rows] == [
        ("array_map_alloc_check", "EINVAL", 3), ("htab_map_alloc_check", "EINVAL", 2)], table

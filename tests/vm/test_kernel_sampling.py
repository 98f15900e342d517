"""In-kernel sampling on real kernels (6.1: kprobes, 6.12: kprobe.session, the default modes): successful
sessions the sampler drops send no record at all; the error session arrives complete, its held calls in
one batch."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm


def test_dropped_successes_send_nothing_and_the_error_arrives_whole(vm_batch) -> None:
    r = vm_batch["kernel_sampling"]
    assert r["mode"] == ("kprobe_session" if vm_batch.at_least(6, 10) else "kprobe")
    assert r["workload"][0] == 0, r["workload"]
    cs = r["capture_stats"]
    assert cs["sessions_started"] == 21 and cs["sampled_out"] == 20 and cs["sessions_reported"] == 1, cs
    assert r["records"] == {"SessionStartRec": 1, "FuncBatchRec": 1, "SessionEndRec": 1}, r["records"]
    (s,) = r["sessions"]
    einval, einval32 = (1 << 64) - 22, (1 << 32) - 22  # int functions return in 32 bits
    assert s["is_err"] and s["sampling"] == 0 and s["dropped"] == 0
    assert s["calls"] == [["__x64_sys_bpf", einval, [["map_create", einval32, [["array_map_alloc_check", einval32,
                                                                                 []]]]]]]


def test_the_kernel_stack_is_taken_at_the_error_unless_switched_off(vm_batch) -> None:
    """Mode metrics switches it off: nothing reports it, and it is a failing call's most expensive step."""
    r = vm_batch["kernel_sampling"]
    assert len(r["kstack_frames"]) == 1 and r["kstack_frames"][0] >= 3, r["kstack_frames"]
    assert r["kstack_frames_off"] == [0]
    assert r["chain_off"] == [["__x64_sys_bpf", "map_create", "array_map_alloc_check"]]

"""--lbr's kernel side on real kernels: the snapshot taken at the deepest failing return travels with the
session in every attach mode (QEMU has no LBR, so the kernel's answer is -ENOENT)."""

from __future__ import annotations

import errno

import pytest

pytestmark = pytest.mark.vm


def test_snapshot_taken_at_the_deepest_failing_exit(vm_batch) -> None:
    r = vm_batch["lbr_kernel_path"]
    assert r["snapshot_feature"], "bpf_get_branch_snapshot should exist on 6.1 and 6.12"
    want = {"fentry", "kprobe"} | ({"kprobe_multi", "kprobe_session"} if vm_batch.at_least(6, 10) else set())
    assert set(r["modes"]) == want
    for mode, res in r["modes"].items():
        assert res["simfail_rc"] == 0, (mode, res)
        # '*sys_bpf' also matches __sys_bpf (traced, between the two)
        failing = [s for s in res["sessions"] if s["chain"][0] == "__x64_sys_bpf"
                   and s["chain"][-1] == "array_map_alloc_check"]
        assert len(failing) == 1, (mode, res["sessions"])
        lbr = failing[0]["lbr"]
        assert lbr == {"func": "array_map_alloc_check", "depth": len(failing[0]["chain"]) - 1,
                       "error": errno.ENOENT, "branches": 0, "at_chain_end": True}, (mode, lbr)
        assert failing[0]["text"] == ("[LBR] failed to capture branch records: -ENOENT "
                                      "(this CPU keeps no last branch records)\n")

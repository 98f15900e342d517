"""The VM harness delivers what later VM tests assume, on every kernel."""

from __future__ import annotations

import signal

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("all")]


def test_kernel_matches_series(vm_batch) -> None:
    smoke = vm_batch["smoke"]
    assert smoke["uname_rc"] == 0
    assert smoke["series"] == vm_batch.series
    # the pinned kernel, or the suite's newest where the pinned one left the archive (fetch-kernel says so)
    assert smoke["release"].startswith(vm_batch.series + ".") or "is gone from" in vm_batch.log, smoke["release"]
    assert vm_batch.release == smoke["release"]


def test_btf_and_tracefs(vm_batch) -> None:
    smoke = vm_batch["smoke"]
    assert smoke["btf_vmlinux"]
    assert smoke["tracefs_mounted"] and smoke["debugfs_mounted"]
    assert smoke.get("filter_functions", 0) > 10_000, smoke.get("filter_functions_error")


def test_the_guest_reads_the_repo_through_a_cached_mount(vm_batch) -> None:
    """tests/vm/run mounts the repo (and Python, the kernel cache) from a cached 9p export: uncached, every
    Python start spends seconds on stat round trips through QEMU and the batches take half again as long."""
    options = vm_batch["smoke"]["repo_mount_options"].split(",")
    # 6.12 lists the mode as cache=0xf, 6.1 by name (loose); the root's uncached mount lists neither
    assert any(o.startswith("cache=") or o in ("loose", "fscache", "mmap") for o in options), options


def test_bpf_prog_ids_sees_a_loaded_program(vm_batch) -> None:
    smoke = vm_batch["smoke"]
    [probe] = smoke["probe_listed"]
    assert probe["type"] == "socket_filter" and probe["id"] > 0
    assert smoke["probe_listed_after_close"] == []


def test_loopback_tcp_and_sigterm(vm_batch) -> None:
    tcp = vm_batch["smoke"]["tcp"]
    assert tcp["reply"] == "PING"
    assert tcp["server_rc"] == -signal.SIGTERM  # terminate() sends SIGTERM, not SIGINT


def test_dwarf_vmlinux_only_with_dbg(vm_batch_61, vm_batch_newest) -> None:
    assert vm_batch_61["smoke"]["vmlinux_exists"]
    assert vm_batch_61["smoke"]["vmlinux"].endswith("vmlinux-" + vm_batch_61.release)
    assert vm_batch_newest["smoke"]["vmlinux"] is None


def test_batch_summary_times(vm_batch) -> None:
    status = vm_batch.statuses["smoke"]
    assert status["status"] == "ok"
    assert 0 < status["seconds"] < status["budget_s"]

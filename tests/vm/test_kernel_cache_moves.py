"""The kernel's symbols cached at another boot are moved to this one, not read again, on every kernel (the cache
across boots of issue 48): the kernel's text by the KASLR offset read from the head of kallsyms, each module by its
base in /proc/modules, checked by its build-id."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("all")]


def test_symbols_cached_at_another_boot_are_moved_and_match_kallsyms(vm_batch) -> None:
    r = vm_batch["kernel_cache_moves"]
    assert r["first"] == "", r  # read: the cache was empty
    assert r["rewritten"]["anchor"] in ("_text", "_stext"), r["rewritten"]
    assert r["symbols_source"] == "cached at another boot, moved", r
    assert r["symbols_same"] and r["symbols_count"] > 20_000, r["symbols_differ"]
    # the guest's modules moved too, each recognised by its build-id (Debian builds them with one)
    assert r["modprobe"][0] == 0 and "dummy" in r["modules_loaded"], r["modprobe"]
    assert set(r["rewritten"]["modules"]) == set(r["modules_loaded"]), r
    assert len(r["rewritten"]["build_ids"]) == len(r["rewritten"]["modules"]), r["rewritten"]
    assert set(r["symbols_modules"]) <= set(r["modules_loaded"]), r["symbols_modules"]

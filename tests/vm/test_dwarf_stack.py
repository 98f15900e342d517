"""The deepest error chain with source lines and inlines (6.1 + DWARF), kallsyms only on 6.12."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.vm


def _sessions(output: str) -> list[str]:
    """Split tracer output into session blocks (header line + rows)."""
    output = output.split("\nDetaching...", 1)[0]  # the last block ends where the exit summary and -v phases start
    blocks = re.split(r"(?m)^(?=\d\d:\d\d:\d\d\.\d{6} -> )", output)
    return [b for b in blocks if re.match(r"\d\d:\d\d:\d\d\.\d{6} -> ", b)]


def _block_with(output: str, errno: str) -> str:
    found = [b for b in _sessions(output) if re.search(rf"\[-{errno}\]\s+array_map_alloc_check", b)]
    assert found, output[-4000:]
    return found[-1]


def test_percpu_case_full_chain_with_dwarf_61(vm_batch_61) -> None:
    r = vm_batch_61["dwarf_stack"]
    assert r["rc"] == 0, r["output"][-3000:]
    block = _block_with(r["output"], "E2BIG")
    lines = block.splitlines()
    # frames above the entry function: how we got here, with kernel-tree source locations
    assert any(re.search(r"entry_SYSCALL_64_after_hwframe\+0x[0-9a-f]+\s+\(arch/x86/entry/entry_64\.S:\d+\)", x)
               for x in lines), block
    assert any(re.search(r"do_syscall_64\+0x[0-9a-f]+\s+\(arch/x86/entry/common\.c:\d+\)", x) for x in lines), block
    # every traced level carries the errno; the error starts in array_map_alloc_check on 6.1.192
    assert re.search(r"\d+us \[-E2BIG\]\s+__x64_sys_bpf\+0x[0-9a-f]+\s+\(kernel/bpf/syscall\.c:\d+\)", block), block
    assert re.search(r"\d+us \[-E2BIG\]\s+__sys_bpf\+0x[0-9a-f]+\s+\(kernel/bpf/syscall\.c:\d+\)", block), block
    # Debian's 6.1.192 keeps map_create out of line (the article's kernel inlined it into __sys_bpf);
    # find_and_alloc_map is inlined into it, and the error starts in array_map_alloc_check
    assert re.search(r"\d+us \[-E2BIG\]\s+map_create\+0x[0-9a-f]+\s+\(kernel/bpf/syscall\.c:\d+\)", block), block
    assert re.search(r"^\s+\. find_and_alloc_map\s+\(kernel/bpf/syscall\.c:\d+\)", block, re.M), block
    assert re.search(r"^!\s+\d+us \[-E2BIG\]\s+array_map_alloc_check\s+\(kernel/bpf/arraymap\.c:\d+\)$", block,
                     re.M), block
    # no build-directory prefixes
    assert "debian/build" not in block and "/build/" not in block
    assert r["progs_after"] == []


def test_max_entries_case_einval_with_dwarf_61(vm_batch_61) -> None:
    block = _block_with(vm_batch_61["dwarf_stack"]["output"], "EINVAL")
    assert re.search(r"^!\s+\d+us \[-EINVAL\]\s+array_map_alloc_check\s+\(kernel/bpf/arraymap\.c:\d+\)$", block,
                     re.M), block


def test_same_captures_kallsyms_only_newest(vm_batch_newest) -> None:
    r = vm_batch_newest["dwarf_stack"]
    assert r["rc"] == 0
    e2big = _block_with(r["output"], "E2BIG")
    einval = _block_with(r["output"], "EINVAL")
    for block in (e2big, einval):
        assert re.search(r"\[-E(2BIG|INVAL)\]\s+__x64_sys_bpf\+0x[0-9a-f]+$", block, re.M), block
        assert "(" not in block.split("\n", 1)[1].replace("(python/python)", ""), "no source lines without DWARF"
    assert r["progs_after"] == []


def test_symbolization_levels_61(vm_batch_61) -> None:
    r = vm_batch_61["dwarf_levels"]
    assert r["vmlinux"]
    s, sn = r["s"], r["sn"]
    assert s["simfail_rc"] == 0 and sn["simfail_rc"] == 0 and s["rc"] == 0 and sn["rc"] == 0
    # -s: source lines, but no inlined-frame rows
    block = _block_with(s["output"], "EINVAL")
    assert re.search(r"\[-EINVAL\]\s+map_create\+0x[0-9a-f]+\s+\(kernel/bpf/syscall\.c:\d+\)", block), block
    assert not re.search(r"^\s+\. ", block, re.M), block
    # -sn: kallsyms names only, even with the DWARF vmlinux given by -k
    block = _block_with(sn["output"], "EINVAL")
    assert re.search(r"\[-EINVAL\]\s+map_create\+0x[0-9a-f]+$", block, re.M), block
    assert "(" not in block.split("\n", 1)[1].replace("(python/python)", ""), block

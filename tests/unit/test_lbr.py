"""LBR view from recorded branch records, with real 6.1.192 kernel addresses (tests/fixtures/lbr_61)."""

from __future__ import annotations

import pytest

from retsnoop_otel.kernel.lbr import BRANCH_KERNEL, BRANCH_TYPES, LbrError, parse_specs
from retsnoop_otel.render.lbr import render_lbr
from retsnoop_otel.runtime.environment import lbr_refusal
from tests.fakes import AMAC, AMAC_SIZE, LBR_RECORDS


def test_relevant_records_oldest_first(lbr_sym):
    text = render_lbr(LBR_RECORDS, lbr_sym, AMAC, AMAC_SIZE)
    assert text.splitlines() == [
        "[#05] _copy_from_user+0x2f        ->  __sys_bpf+0xcc",
        "[#04] security_bpf+0x3e           ->  __sys_bpf+0xe5",
        "[#03] array_map_alloc_check+0x1d  ->  array_map_alloc_check+0x6f",
        "[#02] array_map_alloc_check+0x74  ->  0xffffffff80f00000",
    ]


def test_max_count_keeps_records_nearest_the_cut(lbr_sym):
    lines = render_lbr(LBR_RECORDS, lbr_sym, AMAC, AMAC_SIZE, max_count=2).splitlines()
    assert [line[:5] for line in lines] == ["[#03]", "[#02]"]


def test_unfiltered_when_nothing_relevant(lbr_sym):
    text = render_lbr(LBR_RECORDS[:2], lbr_sym, AMAC, AMAC_SIZE)
    assert text.splitlines()[0].startswith("[#01] kprobe_perf_func+0x67")
    assert text.splitlines()[-1] == "[LBR] No relevant LBR data were captured, showing unfiltered LBR stack!"


def test_specs():
    assert parse_specs([]) == BRANCH_TYPES["any_return"] | BRANCH_KERNEL
    assert parse_specs(["any", "cond"]) == BRANCH_TYPES["any"] | BRANCH_TYPES["cond"] | BRANCH_KERNEL
    assert parse_specs(["0x20"]) == 0x20 | BRANCH_KERNEL
    with pytest.raises(LbrError, match="unknown --lbr value 'sideways'"):
        parse_specs(["sideways"])


def test_no_lbr_is_one_clear_sentence():
    exc = lbr_refusal("--lbr", "the CPU or hypervisor exposes no LBR to this kernel (ENOENT)")
    assert "run without --lbr" in str(exc) and "\n" not in str(exc) and exc.exit_code == 1
    named = lbr_refusal("lbr", "x", "deep")
    assert str(named).startswith("probe set 'deep': lbr needs last branch records") and "without lbr" in str(named)

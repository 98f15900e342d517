"""LBR view from recorded branch records, with real 6.1.192 kernel addresses (tests/fixtures/lbr_61)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retsnoop_otel.capture.model import Branch
from retsnoop_otel.kernel.lbr import BRANCH_KERNEL, BRANCH_TYPES, LbrError, parse_specs
from retsnoop_otel.render.lbr import render_lbr
from retsnoop_otel.runtime.environment import lbr_refusal
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import KallsymsSymbolizer

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "lbr_61"
AMAC = 0xffffffff812363b0  # array_map_alloc_check in Debian's 6.1.192 (System.map)
AMAC_SIZE = 0xffffffff81236470 - AMAC
SYS_BPF = 0xffffffff8120ec70
TRAMP = 0xffffffff80f00000  # below _stext, no symbol: printed as an address


@pytest.fixture(scope="module")
def sym() -> KallsymsSymbolizer:
    return KallsymsSymbolizer(Kallsyms.load(str(ROOT)))


# newest first, as bpf_get_branch_snapshot returns them
RECORDS = [
    Branch(0xffffffff811f2e80 + 0x20, 0xffffffff811f5930 + 0x59),  # trace_call_bpf -> kprobe_perf_func: wasted
    Branch(0xffffffff811f5930 + 0x67, 0xffffffff811f2e80),  # kprobe_perf_func -> trace_call_bpf: wasted
    Branch(AMAC + 0x74, TRAMP),  # return from the deepest traced function: the cut
    Branch(AMAC + 0x1d, AMAC + 0x6f),  # the jump to `return -EINVAL`
    Branch(0xffffffff8144d5a0 + 0x3e, SYS_BPF + 0xe5),  # security_bpf returns
    Branch(0xffffffff8153daa0 + 0x2f, SYS_BPF + 0xcc),  # _copy_from_user returns
]


def test_relevant_records_oldest_first(sym):
    text = render_lbr(RECORDS, sym, AMAC, AMAC_SIZE)
    assert text.splitlines() == [
        "[#05] _copy_from_user+0x2f        ->  __sys_bpf+0xcc",
        "[#04] security_bpf+0x3e           ->  __sys_bpf+0xe5",
        "[#03] array_map_alloc_check+0x1d  ->  array_map_alloc_check+0x6f",
        "[#02] array_map_alloc_check+0x74  ->  0xffffffff80f00000",
    ]


def test_max_count_keeps_records_nearest_the_cut(sym):
    lines = render_lbr(RECORDS, sym, AMAC, AMAC_SIZE, max_count=2).splitlines()
    assert [line[:5] for line in lines] == ["[#03]", "[#02]"]


def test_unfiltered_when_nothing_relevant(sym):
    text = render_lbr(RECORDS[:2], sym, AMAC, AMAC_SIZE)
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

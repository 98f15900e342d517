"""retsnoop's -C keys that change how sessions are written (issue 35 point 4): stacks.unfiltered,
stacks.emit-addrs and stacks.dec-offs on the stack and LBR views, args.fmt-mode on the -T table and under
the stack. Recorded sessions: the kretprobe stack of the article's example (test_render.py) and the 6.1
LBR records (tests/fakes.py)."""

from __future__ import annotations

import re

import pytest

from retsnoop_otel.capture.model import ArgValue, Call, RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.render.calls import render_calls
from retsnoop_otel.render.console import session_text
from retsnoop_otel.render.lbr import render_lbr
from retsnoop_otel.render.stack import StackLayouts, render_stack
from retsnoop_otel.runtime.config import StackFormat
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import KallsymsSymbolizer
from tests.fakes import AMAC, AMAC_SIZE, LBR_RECORDS
from tests.unit.test_render import (
    KRETPROBE_FRAMES,
    NEG,
    OFFSET,
    ROOT,
    addr,
    funcs_for,
    seed1_session,
    seed1_symbolizer,
)


@pytest.fixture(scope="module")
def ksyms() -> Kallsyms:
    return Kallsyms.load(str(ROOT))


ADDRS = StackFormat(emit_addrs=True)
ALL = StackFormat(unfiltered=True, emit_addrs=True)


def _seed(ksyms: Kallsyms):
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32),
                              ("array_map_alloc", RetKind.POINTER)])
    chain = [StackEntry(0, NEG - 12, 73_000), StackEntry(1, NEG - 12, 70_000), StackEntry(2, NEG - 12, 50_000)]
    return funcs, seed1_session(ksyms, chain)


def _body(text: str) -> list[str]:
    return text.split("\n\n", 1)[1].rstrip("\n").splitlines()


def test_default_stack_is_unchanged_by_the_default_format(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    assert render_stack(session, funcs, sym, OFFSET, fmt=StackFormat()) == render_stack(session, funcs, sym, OFFSET)


def test_emit_addrs_puts_each_frames_address_first(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    rows = _body(render_stack(session, funcs, seed1_symbolizer(ksyms), OFFSET, fmt=ADDRS))
    sys_bpf = addr(ksyms, "__sys_bpf", 0x38b)
    assert rows[3] == f"    73us [-ENOMEM]   {addr(ksyms, '__x64_sys_bpf', 0x1a):016x} __x64_sys_bpf+0x1a" \
                      "                   (kernel/bpf/syscall.c:5067)"
    assert rows[4].startswith(f"    70us [-ENOMEM]   {sys_bpf:016x} __sys_bpf+0x38b ")
    # inlined frames and '!' rows (no frame, so no address) line up under the symbols
    assert rows[5].startswith("                    " + " " * 18 + ". map_create ")
    assert rows[7] == "!   50us [-ENOMEM]  " + " " * 18 + "array_map_alloc"
    assert not any("~" in r for r in rows)  # nothing the filter drops is shown without stacks.unfiltered


def test_unfiltered_keeps_the_tracers_frames_marked_with_emit_addrs(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    rows = _body(render_stack(session, funcs, sym, OFFSET, fmt=ALL))
    tracer = [r for r in rows if "~" in r]
    assert len(tracer) == len(KRETPROBE_FRAMES)
    # outermost first, so the innermost (the BPF program) is last among them, right above the '!' rows
    assert re.search(r"~[0-9a-f]{16} bpf_prog_e5d01ee9a8b6fa01_rs_kretprobe\+0x4a", tracer[-1]), tracer
    assert "__kretprobe_trampoline+0x2a" in tracer[0]
    # the chain still lands on the real frames
    assert re.search(r"^    70us \[-ENOMEM\]   [0-9a-f]{16} __sys_bpf\+0x38b", rows[4])
    plain = _body(render_stack(session, funcs, sym, OFFSET, fmt=StackFormat(unfiltered=True)))
    assert "bpf_get_stack+0x1c" in "\n".join(plain) and "~" not in "\n".join(plain)


def test_unfiltered_fentry_site_is_not_taken_for_the_traced_function(ksyms: Kallsyms) -> None:
    """fexit's 'f+0x5, trampoline, f+0x1c': with stacks.unfiltered f+0x5 is shown (marked), and the chain's
    duration stays on f+0x1c."""
    funcs = funcs_for(ksyms, [("__x64_sys_bpf", RetKind.SIGNED)])
    kstack = [addr(ksyms, "__sys_bpf", 0xca0), addr(ksyms, "__x64_sys_bpf", 0x1c),
              addr(ksyms, "bpf_trampoline_6442491234", 0x6f, "bpf"), addr(ksyms, "__x64_sys_bpf", 0x5),
              addr(ksyms, "do_syscall_64", 0x2d)]
    session = Session(1, 1, "t", "t", 0, 1, True, [StackEntry(0, NEG - 22, 5_000)], kstack)
    rows = _body(render_stack(session, funcs, KallsymsSymbolizer(ksyms), 0, fmt=ALL))
    assert [r.split()[-1] for r in rows] == ["do_syscall_64+0x2d", "__x64_sys_bpf+0x5",
                                             "bpf_trampoline_6442491234+0x6f", "__x64_sys_bpf+0x1c", "__sys_bpf+0xca0"]
    assert [r[20] for r in rows] == [" ", "~", "~", " ", " "], rows
    assert rows[3].startswith("     5us [-EINVAL]  ") and not rows[1].strip().startswith("5us")


def test_dec_offs(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    rows = _body(render_stack(session, funcs, seed1_symbolizer(ksyms), OFFSET, fmt=StackFormat(dec_offs=True)))
    assert "__x64_sys_bpf+26 " in rows[3] and "__sys_bpf+907 " in rows[4] and "+0x" not in "".join(rows)


def test_layouts_keep_the_console_format(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    layouts = StackLayouts(funcs, sym, fmt=ALL)
    assert render_stack(session, funcs, sym, OFFSET, layouts) == render_stack(session, funcs, sym, OFFSET, fmt=ALL)


def test_lbr_formats(lbr_sym) -> None:
    relevant = render_lbr(LBR_RECORDS, lbr_sym, AMAC, AMAC_SIZE).splitlines()
    everything = render_lbr(LBR_RECORDS, lbr_sym, AMAC, AMAC_SIZE, fmt=StackFormat(unfiltered=True)).splitlines()
    # the records newer than the deepest function's (the relevance cut's) are kept, oldest first as ever
    assert [line[:5] for line in relevant] == ["[#05]", "[#04]", "[#03]", "[#02]"]
    assert [line[:5] for line in everything] == ["[#05]", "[#04]", "[#03]", "[#02]", "[#01]", "[#00]"]
    assert [line.split() for line in everything[:4]] == [line.split() for line in relevant]
    addrs = render_lbr(LBR_RECORDS, lbr_sym, AMAC, AMAC_SIZE, fmt=ADDRS).splitlines()
    b = LBR_RECORDS[2]
    assert re.match(rf"\[#02\] {b.src:016x} array_map_alloc_check\+0x74 +->  {b.dst:016x} 0x{b.dst:x}$",
                    addrs[-1]), addrs
    dec = render_lbr(LBR_RECORDS, lbr_sym, AMAC, AMAC_SIZE, fmt=StackFormat(dec_offs=True)).splitlines()
    assert dec[0].startswith("[#05] _copy_from_user+47 ") and "__sys_bpf+204" in dec[0]


FUNCS = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
         1: TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False)}
ARGS = {0: ["cmd=0", "uattr=0x7ffc"], 1: ["attr=&{map_type=2,key_size=4}"]}


def _fmt(mode: str):
    def fmt(func_id: int, values):
        sep = "=" if mode == "compact" else " = "
        out = [a.replace("=", sep, 1) for a in ARGS[func_id]]
        return [a.replace("&{map_type=2,key_size=4}", "&{\n    map_type=2,\n    key_size=4,\n}") for a in out] \
            if mode == "verbose" else out
    return fmt


def _calls_session() -> Session:
    leaf = Call(1, 1, 100, 2_100, NEG - 22, args=(ArgValue(1),))
    root = Call(0, 0, 0, 5_000, NEG - 22, children=[leaf], args=(ArgValue(0), ArgValue(0x7ffc)))
    return Session(5, 5, "simfail", "simfail", 0, 5_000, True, [StackEntry(0, NEG - 22, 5_000),
                                                                  StackEntry(1, NEG - 22, 2_000)], [], calls=[root])


def test_compact_arguments_fill_the_context_column() -> None:
    lines = render_calls(_calls_session(), FUNCS, _fmt("compact"), "compact").splitlines()
    assert re.match(r"^FUNCTION CALLS +RESULT +DURATION  CONTEXT$", lines[0]) and lines[1].endswith("  -------" +
                                                                                                     "-" * 22)
    col = lines[0].index("CONTEXT")
    assert lines[2].startswith("→ __x64_sys_bpf ") and lines[2][col:] == "cmd=0 uattr=0x7ffc"
    assert lines[3].startswith("    ↔ array_map_alloc_check") and lines[3][col:] == "attr=&{map_type=2,key_size=4}"
    assert re.match(r"^← __x64_sys_bpf +\[-EINVAL\] +5\.000us$", lines[4])
    assert "›" not in "".join(lines)
    assert "CONTEXT" not in render_calls(_calls_session(), FUNCS)  # no -A: no column


def test_multiline_and_verbose_arguments_go_under_their_call() -> None:
    lines = render_calls(_calls_session(), FUNCS, _fmt("multiline"), "multiline").splitlines()
    assert "CONTEXT" not in lines[0]
    assert lines[3:5] == ["  › cmd = 0", "  › uattr = 0x7ffc"]
    assert lines[5].startswith("    ↔ array_map_alloc_check") and lines[6] == "      › attr = &{map_type=2,key_size=4}"
    verbose = render_calls(_calls_session(), FUNCS, _fmt("verbose"), "verbose").splitlines()
    assert verbose[6:10] == ["      › attr = &{", "            map_type=2,", "            key_size=4,", "        }"]


def test_session_text_carries_the_formats(ksyms: Kallsyms) -> None:
    funcs, session = _seed(ksyms)
    sym = seed1_symbolizer(ksyms)
    text = session_text(session, funcs, sym, OFFSET, calls_view=False, stacks=ALL)
    assert text == render_stack(session, funcs, sym, OFFSET, fmt=ALL)
    calls = session_text(_calls_session(), FUNCS, KallsymsSymbolizer(ksyms), 0, calls_view=True, call_stack=True,
                         fmt_args=_fmt("multiline"), stacks=ADDRS, args_mode="multiline")
    assert "  › uattr = 0x7ffc" in calls.splitlines() and "CONTEXT" not in calls
    stack = session_text(_calls_session(), FUNCS, KallsymsSymbolizer(ksyms), 0, calls_view=False,
                         fmt_args=_fmt("multiline"), args_mode="multiline")
    assert stack.rstrip("\n").splitlines()[-5:] == [
        "  __x64_sys_bpf:", "    › cmd = 0", "    › uattr = 0x7ffc",
        "  array_map_alloc_check:", "    › attr = &{map_type=2,key_size=4}"]
    compact = session_text(_calls_session(), FUNCS, KallsymsSymbolizer(ksyms), 0, calls_view=False,
                           fmt_args=_fmt("compact"))
    assert "  › __x64_sys_bpf(cmd=0, uattr=0x7ffc)" in compact.splitlines()

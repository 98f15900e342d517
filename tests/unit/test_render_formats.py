"""retsnoop's -C keys that change how sessions are written (issue 35 point 4): stacks.unfiltered,
stacks.emit-addrs and stacks.dec-offs on the LBR view (the stack view's: test_render.py), args.fmt-mode on
the -T table and under the stack. Recorded data: the 6.1 LBR records (tests/fakes.py), hand-built calls."""

from __future__ import annotations

import re

from retsnoop_otel.capture.model import ArgValue, Call, RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.render.calls import render_calls
from retsnoop_otel.render.console import session_text
from retsnoop_otel.render.formats import StackFormat
from retsnoop_otel.render.lbr import render_lbr
from tests.fakes import AMAC, AMAC_SIZE, LBR_RECORDS

NEG = 1 << 64  # raw 64-bit register value of a negative return: NEG - 22 is -EINVAL
ADDRS = StackFormat(emit_addrs=True)


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


def test_session_text_carries_the_args_mode(lbr_sym) -> None:
    calls = session_text(_calls_session(), FUNCS, lbr_sym, 0, calls_view=True, call_stack=True,
                         fmt_args=_fmt("multiline"), args_mode="multiline")
    assert "  › uattr = 0x7ffc" in calls.splitlines() and "CONTEXT" not in calls
    assert "CONTEXT" in session_text(_calls_session(), FUNCS, lbr_sym, 0, calls_view=True, fmt_args=_fmt("compact"))
    stack = session_text(_calls_session(), FUNCS, lbr_sym, 0, calls_view=False,
                         fmt_args=_fmt("multiline"), args_mode="multiline")
    assert stack.rstrip("\n").splitlines()[-5:] == [
        "  __x64_sys_bpf:", "    › cmd = 0", "    › uattr = 0x7ffc",
        "  array_map_alloc_check:", "    › attr = &{map_type=2,key_size=4}"]
    compact = session_text(_calls_session(), FUNCS, lbr_sym, 0, calls_view=False, fmt_args=_fmt("compact"))
    assert "  › __x64_sys_bpf(cmd=0, uattr=0x7ffc)" in compact.splitlines()

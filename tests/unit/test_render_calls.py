"""The -T table from a hand-built session, in retsnoop's layout."""

from __future__ import annotations

from retsnoop_otel.capture.model import Call, RetKind, Session, TracedFunc
from retsnoop_otel.render.calls import render_calls

FUNCS = {0: TracedFunc(0, "bpf_prog_load", 0, RetKind.INT32, True),
         1: TracedFunc(1, "bpf_prog_alloc", 0, RetKind.POINTER, False),
         2: TracedFunc(2, "bpf_prog_alloc_no_stats", 0, RetKind.POINTER, False),
         3: TracedFunc(3, "bpf_prog_kallsyms_add", 0, RetKind.VOID, False),
         4: TracedFunc(4, "bpf_ksym_add", 0, RetKind.VOID, False)}
PTR = 0xffffc9000031e000


def _session(dropped=0, missing=0):
    leaf = Call(2, 2, 1000, 6539, PTR)
    alloc = Call(1, 1, 500, 10765, PTR, children=[leaf])
    ksym = Call(4, 2, 20000, 22046, 0, missing_before=missing)
    kall = Call(3, 1, 19000, 25104, 0, children=[ksym])
    root = Call(0, 0, 0, 374697, 5, children=[alloc, kall])
    return Session(1, 1, "simfail", "simfail", 0, 374697, False, [], [], calls=[root], dropped_records=dropped)


def test_layout():
    text = render_calls(_session(), FUNCS)
    assert text.splitlines() == [
        "FUNCTION CALLS                                    RESULT                 DURATION",
        "-----------------------------------------------   --------------------  ---------",
        "→ bpf_prog_load",
        "    → bpf_prog_alloc",
        "        ↔ bpf_prog_alloc_no_stats                 [0xffffc9000031e000]    5.539us",
        "    ← bpf_prog_alloc                              [0xffffc9000031e000]   10.265us",
        "    → bpf_prog_kallsyms_add",
        "        ↔ bpf_ksym_add                            [void]                  2.046us",
        "    ← bpf_prog_kallsyms_add                       [void]                  6.104us",
        "← bpf_prog_load                                   [5]                   374.697us",
    ]


def test_gaps_are_marked():
    text = render_calls(_session(dropped=5, missing=2), FUNCS)
    assert "        ‼ ... missing 2 records ..." in text.splitlines()
    assert text.splitlines()[-1] == "‼ ... missing 3 records ..."

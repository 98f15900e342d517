"""Issue 4 -T acceptance on real kernels: a successful bpf_prog_load as retsnoop's call table, and
forced record loss with a tiny ring buffer. Guest side: tests/vm/scenarios/calls_prog_load.py.
"""

from __future__ import annotations

import re

import pytest

from retsnoop_otel.render.calls import MAX_INDENT_LEVELS

pytestmark = pytest.mark.vm

ROW = re.compile(r"^(?P<indent> *)(?P<mark>[→←↔]) (?P<name>\S+)(?:\s+\[(?P<res>[^\]]*)\])?(?:\s+(?P<us>[\d.]+)us)?$")


def _tables(output: str) -> list[list[str]]:
    """Each call table's rows (between the dashes line and the blank line that ends it)."""
    tables, rows, inside = [], [], False
    for line in output.splitlines():
        if line.startswith("FUNCTION CALLS"):
            rows, inside = [], False
            continue
        if line.startswith("-----"):
            inside = True
            continue
        if inside and not line.strip():
            tables.append(rows)
            inside = False
            continue
        if inside:
            rows.append(line)
    return tables


def _tree(rows: list[str]) -> list[dict]:
    """Calls with their duration and children, from → / ← / ↔ rows (4 spaces per level)."""
    roots: list[dict] = []
    stack: list[dict] = []
    for row in rows:
        m = ROW.match(row)
        if not m:
            continue
        depth = len(m["indent"]) // 4
        if depth >= MAX_INDENT_LEVELS:  # indentation stops growing there: such rows are ambiguous
            continue
        if m["mark"] in "→↔":
            node = {"name": m["name"], "depth": depth, "children": [], "us": None, "res": None}
            del stack[depth:]
            (stack[-1]["children"] if stack else roots).append(node)
            if m["mark"] == "↔":
                node["us"], node["res"] = float(m["us"]), m["res"]
            else:
                stack.append(node)
        else:
            del stack[depth + 1:]
            node = stack.pop()
            assert node["name"] == m["name"], row
            node["us"], node["res"] = float(m["us"]), m["res"]
    return roots


def _prog_load_table(r: dict) -> tuple[list[str], dict]:
    for rows in _tables(r["output"]):
        first = next((x for x in rows if ROW.match(x)), "")
        if first.strip() == "→ bpf_prog_load":
            return rows, _tree(rows)[0]
    raise AssertionError(r["output"][-5000:])


def _check_durations(node: dict) -> int:
    """A parent lasts at least as long as its children together; returns the number of calls checked."""
    n = 1
    if node["children"]:
        assert node["us"] + 0.002 >= sum(c["us"] for c in node["children"]), node["name"]
        n += sum(_check_durations(c) for c in node["children"])
    return n


def test_successful_prog_load_call_trace(vm_batch) -> None:
    r = vm_batch["calls_prog_load"]
    assert r["simfail"]["rc"] == 0, r["simfail"]
    rows, root = _prog_load_table(r)
    calls = [x for x in rows if ROW.match(x)]
    assert calls[0] == "→ bpf_prog_load"
    last = ROW.match(calls[-1])
    assert last["mark"] == "←" and last["name"] == "bpf_prog_load" and not last["indent"]
    assert re.fullmatch(r"\d+", last["res"]) and int(last["res"]) >= 3, last["res"]  # a new file descriptor
    assert "bpf_check" in {c["name"] for c in root["children"]}, [c["name"] for c in root["children"]]
    checked = _check_durations(root)
    if vm_batch.series == "6.1":  # the ':kernel/bpf/*.c' set: the verifier's inner calls are there too
        assert checked >= 50, checked
    assert r["rc"] == 0 and r["progs_after"] == []


def test_tiny_ring_buffer_marks_the_gap_and_counts_it(vm_batch_newest) -> None:
    r = vm_batch_newest["calls_record_loss"]
    assert r["ran"] and r["simfail"]["rc"] == 0
    # every session of this run starts at bpf_prog_load (the only entry function); its first 64 records,
    # held in the kernel until its end, can be lost as one batch, so the table may open with the gap
    tables = [rows for rows in _tables(r["output"]) if any("missing" in x for x in rows)]
    assert tables, r["output"][-5000:]
    rows = tables[0]
    gaps = [int(m.group(1)) for x in rows if (m := re.search(r"‼ \.\.\. missing (\d+) records", x))]
    assert gaps and all(g > 0 for g in gaps), "\n".join(rows[:80])
    summary = re.search(r"LOST RECORDS: (\d+)", r["output"])
    assert summary and int(summary.group(1)) >= sum(gaps), r["output"][-2000:]
    assert r["rc"] == 0 and r["progs_after"] == []

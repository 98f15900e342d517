"""Chrome trace-event JSON: complete events, correct nesting, required fields."""

from __future__ import annotations

import json

from retsnoop_otel.capture.model import Call, RetKind, Session, TracedFunc
from retsnoop_otel.render.trace_json import TraceJsonWriter

FUNCS = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
         1: TracedFunc(1, "map_create", 0, RetKind.INT32, False),
         2: TracedFunc(2, "array_map_alloc_check", 0, RetKind.INT32, False)}
EINVAL = (1 << 64) - 22


def _session():
    leaf = Call(2, 2, 3000, 4000, EINVAL)
    mid = Call(1, 1, 2000, 9000, EINVAL, children=[leaf])
    root = Call(0, 0, 1000, 10000, EINVAL, children=[mid])
    return Session(7, 7, "simfail", "simfail", 1000, 10000, True, [], [], calls=[root])


def test_chrome_trace_json(tmp_path):
    path = tmp_path / "t.json"
    w = TraceJsonWriter(str(path))
    w.add(_session(), FUNCS, 1_000_000)
    w.add(_session(), FUNCS, 1_000_000)
    w.flush()
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 6
    assert [e["ph"] for e in events].count("M") == 2  # names emitted once per thread
    for e in complete:
        for key in ("name", "ph", "ts", "dur", "pid", "tid"):
            assert key in e
        assert isinstance(e["ts"], float) and e["dur"] >= 0
    root, mid, leaf = complete[:3]
    assert root["ts"] <= mid["ts"] and mid["ts"] + mid["dur"] <= root["ts"] + root["dur"]
    assert mid["ts"] <= leaf["ts"] and leaf["ts"] + leaf["dur"] <= mid["ts"] + mid["dur"]
    assert leaf["args"]["result"] == "-EINVAL" and leaf["args"]["error"] == "EINVAL"
    assert root["ts"] == (1000 + 1_000_000) / 1000


def test_file_is_valid_json_after_every_flush_and_appends(tmp_path):
    """Flushing rewrites only the closing brackets: the document parses after each session and keeps all."""
    path = tmp_path / "t.json"
    w = TraceJsonWriter(str(path))
    assert json.loads(path.read_text())["traceEvents"] == []
    sizes = []
    for n in range(1, 4):
        w.add(_session(), FUNCS, 0)
        w.flush()
        events = json.loads(path.read_text())["traceEvents"]
        assert len([e for e in events if e["ph"] == "X"]) == 3 * n
        sizes.append(path.stat().st_size)
    assert sizes[2] - sizes[1] == sizes[1] - sizes[0]  # appended, not rewritten with duplicates
    w.close()
    w.close()  # idempotent
    assert len(json.loads(path.read_text())["traceEvents"]) == 2 + 9

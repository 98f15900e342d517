"""Chrome trace-event / Perfetto JSON for -T sessions: one complete ("X") event per traced call."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .model import Call, Session, TracedFunc, error_type, format_result


def _events(call: Call, session: Session, funcs: Mapping[int, TracedFunc], offset_ns: int,
            end_ns: int) -> Iterator[dict[str, Any]]:
    func = funcs.get(call.func_id)
    end = call.end_ns if call.end_ns is not None else end_ns
    args: dict[str, Any] = {"depth": call.depth}
    if func is not None and call.end_ns is not None:
        args["result"] = format_result(call.result, func.ret)
        if err := error_type(call.result or 0, func.ret):
            args["error"] = err
    else:
        args["incomplete"] = True
    if call.missing_before:
        args["missing_records_before"] = call.missing_before
    yield {"name": func.name if func else f"func#{call.func_id}", "cat": "kernel", "ph": "X",
           "ts": (call.start_ns + offset_ns) / 1000, "dur": max(0, end - call.start_ns) / 1000,
           "pid": session.pid, "tid": session.tid, "args": args}
    for child in call.children:
        yield from _events(child, session, funcs, offset_ns, end)


def trace_events(sessions: Iterable[Session], funcs: Mapping[int, TracedFunc], offset_ns: int) -> list[dict]:
    out: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    for s in sessions:
        if (s.pid, s.tid) not in named:
            named.add((s.pid, s.tid))
            out.append({"name": "process_name", "ph": "M", "pid": s.pid, "tid": s.tid, "args": {"name": s.proc_comm}})
            out.append({"name": "thread_name", "ph": "M", "pid": s.pid, "tid": s.tid, "args": {"name": s.comm}})
        for call in s.calls:
            out.extend(_events(call, s, funcs, offset_ns, s.end_ns))
    return out


class TraceJsonWriter:
    """Collects -T sessions and writes one JSON document (written again on every flush)."""

    def __init__(self, path: str, funcs: Mapping[int, TracedFunc], offset_ns: int) -> None:
        self.path = path
        self.funcs = funcs
        self.offset_ns = offset_ns
        self.events: list[dict[str, Any]] = []
        self._named: set[tuple[int, int]] = set()

    def add(self, session: Session) -> None:
        for ev in trace_events([session], self.funcs, self.offset_ns):
            if ev["ph"] == "M":
                key = (ev["pid"], ev["tid"], ev["name"])
                if key in self._named:  # type: ignore[comparison-overlap]
                    continue
                self._named.add(key)  # type: ignore[arg-type]
            self.events.append(ev)

    def flush(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ns"}, fh)
        os.replace(tmp, self.path)

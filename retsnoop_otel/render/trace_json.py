"""Chrome trace-event / Perfetto JSON for -T sessions: one complete ("X") event per traced call, one instant ("i")
event per injected probe (-J)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from retsnoop_otel.capture.model import Call, Session, TracedFunc, error_type, format_result


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
    if func is not None and func.binary is not None:
        args["binary"] = func.binary
        if func.source:
            args["source"] = func.source
    user = func is not None and func.binary is not None
    yield {"name": func.name if func else f"func#{call.func_id}", "cat": "user" if user else "kernel", "ph": "X",
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
        for hit in s.probes:
            out.append({"name": hit.spec, "cat": "probe", "ph": "i", "s": "t", "ts": (hit.ts + offset_ns) / 1000,
                        "pid": s.pid, "tid": s.tid,
                        "args": {"kind": hit.kind, "depth": hit.depth, **{f.name: f.value for f in hit.fields}}})
    return out


class TraceJsonWriter:
    """Appends -T sessions to one JSON document that stays valid after every flush.

    The closing brackets are written after the last event and overwritten by the next flush, so a
    long run costs O(events) in total and the file can be opened in Perfetto at any moment. A write that fails (a
    full disk) is kept in `error` and ends the writing, never raised where the write happened: the run decides
    what it means (runtime/sinks.py: the trace stops and says it in one line).
    """

    _HEAD = '{"displayTimeUnit":"ns","traceEvents":[\n'
    _TAIL = "\n]}\n"

    def __init__(self, path: str) -> None:
        self.path = path
        self.error: OSError | None = None
        self.written = 0
        self._pending: list[dict[str, Any]] = []
        self._named: set[tuple[int, int, str]] = set()
        self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the writer's life
        self._fh.write(self._HEAD)
        self._body_end = self._fh.tell()
        self.flush()

    def add(self, session: Session, funcs: Mapping[int, TracedFunc], offset_ns: int) -> None:
        for ev in trace_events([session], funcs, offset_ns):
            if ev["ph"] == "M":
                key = (ev["pid"], ev["tid"], ev["name"])
                if key in self._named:
                    continue
                self._named.add(key)
            self._pending.append(ev)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def flush(self) -> None:
        if self._fh.closed or self.error is not None:
            self._pending.clear()
            return
        try:
            self._write_pending()
        except OSError as exc:
            self.error = exc
            self._pending.clear()

    def _write_pending(self) -> None:
        fh = self._fh
        fh.seek(self._body_end)
        fh.truncate()
        for ev in self._pending:
            fh.write((",\n" if self.written else "") + json.dumps(ev, separators=(",", ":")))
            self.written += 1
        self._pending.clear()
        self._body_end = fh.tell()
        fh.write(self._TAIL)
        fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            try:
                self._fh.close()
            except OSError as exc:  # its buffer's last write failed
                self.error = self.error or exc

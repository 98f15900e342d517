"""retsnoop's function call trace table (-T): → entry, ← exit, ↔ a leaf collapsed into one row."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from .model import Call, Session, TracedFunc, format_result

MAX_INDENT_LEVELS = 20


def _rows(call: Call, funcs: Mapping[int, TracedFunc], depth: int) -> Iterator[tuple[str, str, str]]:
    indent = "    " * min(depth, MAX_INDENT_LEVELS)
    if call.missing_before:
        yield f"{indent}‼ ... missing {call.missing_before} records ...", "", ""
    func = funcs.get(call.func_id)
    name = func.name if func else f"<func #{call.func_id}>"
    result = f"[{format_result(call.result, func.ret)}]" if func and call.end_ns is not None else ""
    duration = f"{call.duration_ns / 1000:.3f}us" if call.duration_ns is not None else ""
    if not call.children:
        marker = "↔" if call.end_ns is not None else "→"
        yield f"{indent}{marker} {name}", result, duration
        return
    yield f"{indent}→ {name}", "", ""
    for child in call.children:
        yield from _rows(child, funcs, depth + 1)
    if call.end_ns is not None:
        yield f"{indent}← {name}", result, duration
    else:
        yield f"{indent}‼ ... {name} did not return before the session ended ...", "", ""


def render_calls(session: Session, funcs: Mapping[int, TracedFunc]) -> str:
    rows = [row for call in session.calls for row in _rows(call, funcs, 0)]
    if session.calls and session.dropped_records:
        counted = sum(c.missing_before for c in _walk(session.calls))
        if session.dropped_records > counted:
            rows.append((f"‼ ... missing {session.dropped_records - counted} records ...", "", ""))
    w_name = max([47, *(len(r[0]) for r in rows)])
    w_res = max([20, *(len(r[1]) for r in rows)])
    w_dur = max([9, *(len(r[2]) for r in rows)])
    lines = [f"{'FUNCTION CALLS':<{w_name}}   {'RESULT':<{w_res}}  {'DURATION':>{w_dur}}",
             f"{'-' * w_name}   {'-' * w_res}  {'-' * w_dur}"]
    for name, result, duration in rows:
        lines.append(f"{name:<{w_name}}   {result:<{w_res}}  {duration:>{w_dur}}".rstrip())
    return "\n".join(lines) + "\n"


def _walk(calls: list[Call]) -> Iterator[Call]:
    for c in calls:
        yield c
        yield from _walk(c.children)

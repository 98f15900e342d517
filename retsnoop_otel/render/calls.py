"""retsnoop's function call trace table (-T): → entry, ← exit, ↔ a leaf collapsed into one row."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from retsnoop_otel.capture.inject import ProbeHit
from retsnoop_otel.capture.model import ArgValue, Call, Session, TracedFunc, format_result

ArgsFormatter = Callable[[int, "tuple[ArgValue, ...] | None"], list[str]]

MAX_INDENT_LEVELS = 20


def _arg_lines(indent: str, args: list[str]) -> Iterator[tuple[str, str, str, str]]:
    """multiline and verbose: each argument on lines of its own under its call, `›` first; a verbose value's
    further lines (a struct's members) indented under it."""
    for a in args:
        first, *more = a.split("\n")
        yield f"{indent}  › {first}", "", "", ""
        yield from ((f"{indent}    {line}", "", "", "") for line in more)


def _in_order(calls: list[Call], probes: list[ProbeHit]) -> list[Call | ProbeHit]:
    """Calls and the injected probes that fired between them, as they happened (by record sequence)."""
    if not probes:
        return list(calls)
    return sorted([*calls, *probes], key=lambda item: item.seq)


def _probe_rows(hit: ProbeHit, depth: int) -> Iterator[tuple[str, str, str, str]]:
    """retsnoop's ◎ row: the probe's spec, then its fields (a tracepoint's by name)."""
    indent = "    " * min(depth, MAX_INDENT_LEVELS)
    if hit.missing_before:
        yield f"{indent}‼ ... missing {hit.missing_before} records ...", "", "", ""
    fields = hit.text()
    yield f"{indent}◎ {hit.spec}" + (f"  {fields}" if fields else ""), "", "", ""


def _rows(call: Call | ProbeHit, funcs: Mapping[int, TracedFunc], depth: int, fmt_args: ArgsFormatter | None = None,
          compact: bool = True) -> Iterator[tuple[str, str, str, str]]:
    """(function, result, duration, context) rows: `compact` puts the arguments in the context cell of the
    call's first row, else on lines of their own under it. An injected probe is one ◎ row."""
    if isinstance(call, ProbeHit):
        yield from _probe_rows(call, depth)
        return
    indent = "    " * min(depth, MAX_INDENT_LEVELS)
    if call.missing_before:
        yield f"{indent}‼ ... missing {call.missing_before} records ...", "", "", ""
    func = funcs.get(call.func_id)
    name = func.label if func else f"<func #{call.func_id}>"
    result = f"[{format_result(call.result, func.ret)}]" if func and call.end_ns is not None else ""
    duration = f"{call.duration_ns / 1000:.3f}us" if call.duration_ns is not None else ""
    args = fmt_args(call.func_id, call.args) if fmt_args and call.args else []
    context = " ".join(args) if compact else ""
    if not call.children and not call.probes:
        marker = "↔" if call.end_ns is not None else "→"
        yield f"{indent}{marker} {name}", result, duration, context
        if not compact:
            yield from _arg_lines(indent, args)
        return
    yield f"{indent}→ {name}", "", "", context
    if not compact:
        yield from _arg_lines(indent, args)
    for child in _in_order(call.children, call.probes):
        yield from _rows(child, funcs, depth + 1, fmt_args, compact)
    if call.end_ns is not None:
        yield f"{indent}← {name}", result, duration, ""
    else:
        yield f"{indent}‼ ... {name} did not return before the session ended ...", "", "", ""


def render_calls(session: Session, funcs: Mapping[int, TracedFunc], fmt_args: ArgsFormatter | None = None,
                 args_mode: str = "compact") -> str:
    """The table; with `fmt_args` (-A) in args.fmt-mode `args_mode`: compact adds retsnoop's CONTEXT column,
    multiline and verbose put each argument under its call."""
    compact = args_mode == "compact"
    top = _in_order(session.calls, [h for h in session.probes if not h.in_call])
    rows = [row for call in top for row in _rows(call, funcs, 0, fmt_args, compact)]
    if session.calls and session.dropped_records:
        counted = sum(c.missing_before for c in _walk(session.calls)) + sum(h.missing_before for h in session.probes)
        if session.dropped_records > counted:
            rows.append((f"‼ ... missing {session.dropped_records - counted} records ...", "", "", ""))
    if session.calls_cut:
        rows.append((f"‼ ... {session.calls_cut} more calls not shown (per-session cap) ...", "", "", ""))
    context = fmt_args is not None and compact
    w_name = max([47, *(len(r[0]) for r in rows if r[1] or r[2] or r[3])])
    w_res = max([20, *(len(r[1]) for r in rows)])
    w_dur = max([9, *(len(r[2]) for r in rows)])
    head = f"{'FUNCTION CALLS':<{w_name}}   {'RESULT':<{w_res}}  {'DURATION':>{w_dur}}"
    rule = f"{'-' * w_name}   {'-' * w_res}  {'-' * w_dur}"
    if context:
        w_ctx = max([7, *(len(r[3]) for r in rows)])
        head, rule = f"{head}  CONTEXT", f"{rule}  {'-' * w_ctx}"
    lines = [head, rule]
    for name, result, duration, ctx in rows:
        line = f"{name:<{w_name}}   {result:<{w_res}}  {duration:>{w_dur}}"
        lines.append((f"{line}  {ctx}" if ctx else line).rstrip())
    return "\n".join(lines) + "\n"


def _walk(calls: list[Call]) -> Iterator[Call]:
    for c in calls:
        yield c
        yield from _walk(c.children)


def chain_calls(session: Session) -> list[Call | None]:
    """The Call behind each level of the error chain (the last matching call at each depth)."""
    out: list[Call | None] = []
    level_calls = session.calls
    for entry in session.chain:
        match = next((c for c in reversed(level_calls) if c.func_id == entry.func_id), None)
        out.append(match)
        level_calls = match.children if match else []
    return out


def render_chain_args(session: Session, funcs: Mapping[int, TracedFunc], fmt_args: ArgsFormatter,
                      args_mode: str = "compact") -> str:
    """-A in stack mode: the arguments of each function of the error chain, `› func(args)` in compact mode,
    else the function's name and each argument under it on lines of their own."""
    lines = []
    for entry, call in zip(session.chain, chain_calls(session), strict=True):
        if call is None or not call.args:
            continue
        func = funcs.get(entry.func_id)
        name = func.name if func else str(entry.func_id)
        parts = fmt_args(entry.func_id, call.args)
        if args_mode == "compact":
            lines.append(f"  › {name}({', '.join(parts)})")
            continue
        lines.append(f"  {name}:")
        lines.extend(row[0] for row in _arg_lines("  ", parts))
    return "".join(f"{line}\n" for line in lines) + ("\n" if lines else "")

"""One session as the text people read on a terminal (retsnoop's layouts) or as one JSON object.

retsnoop's order: the call table (-T), then the LBR block, then the stack (the default view, or
under the table with -E). -A adds each error-chain function's arguments under the stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.capture.model import AppContext, Session, TracedFunc, UserFrame, error_type, format_result
from retsnoop_otel.capture.origins import error_origin
from retsnoop_otel.render.calls import ArgsFormatter, render_calls, render_chain_args
from retsnoop_otel.render.formats import PLAIN_STACKS, StackFormat
from retsnoop_otel.render.lbr import render_session_lbr
from retsnoop_otel.render.stack import StackLayouts, render_header, render_stack
from retsnoop_otel.render.user_stack import user_stack_lines
from retsnoop_otel.symbols.symbolize import Symbolizer


def session_text(session: Session, funcs: Mapping[int, TracedFunc], symbolizer: Symbolizer, offset_ns: int, *,
                 calls_view: bool, call_stack: bool = False, fmt_args: ArgsFormatter | None = None,
                 lbr_max_count: int = 0, layouts: StackLayouts | None = None, stacks: StackFormat = PLAIN_STACKS,
                 args_mode: str = "compact") -> str:
    """`calls_view`: the -T table (with the stack under it when `call_stack`); else the stack view.
    `layouts`: the stack shapes already laid out for these `funcs` and `symbolizer` (render/stack.py), made
    with `stacks` (how stack and LBR rows are written); `args_mode`: args.fmt-mode of `fmt_args`'s text."""
    lbr = render_session_lbr(session, funcs, symbolizer, lbr_max_count, stacks) if session.lbr is not None else ""
    if not calls_view:
        text = render_stack(session, funcs, symbolizer, offset_ns, layouts, stacks)
        if lbr:
            head, _, rows = text.partition("\n\n")
            text = head + "\n\n" + lbr + "\n" + rows
        if fmt_args is not None and session.calls:
            text = text.rstrip("\n") + "\n\n" + render_chain_args(session, funcs, fmt_args, args_mode) + "\n"
        return text
    parts = [render_header(session, offset_ns) + "\n\n", render_calls(session, funcs, fmt_args, args_mode)]
    if lbr:
        parts.append("\n" + lbr)
    if call_stack:
        stack = render_stack(session, funcs, symbolizer, offset_ns, layouts, stacks)
        parts.append("\n" + stack.split("\n", 2)[2] if stack.count("\n") >= 2 else stack)
    else:
        user = user_stack_lines(session)
        parts.append("".join(f"\n{line}" for line in ["", *user]) + "\n\n" if user else "\n\n")
    return "".join(parts)


def session_json(session: Session, funcs: Mapping[int, TracedFunc], offset_ns: int) -> dict[str, Any]:
    """--json: one object per session, with wall-clock nanoseconds and the error chain."""
    chain = []
    for e in session.chain:
        f = funcs[e.func_id]
        chain.append({"function": f.name, "latency_ns": e.latency_ns,
                      "result": format_result(e.result if e.latency_ns is not None else None, f.ret),
                      "error": error_type(e.result, f.ret) if e.latency_ns is not None else None,
                      **({"binary": f.binary, "source": f.source} if f.binary is not None else {})})
    out: dict[str, Any] = {
        "tid": session.tid, "pid": session.pid, "comm": session.comm, "proc_comm": session.proc_comm,
        "start_ns": session.start_ns + offset_ns, "end_ns": session.end_ns + offset_ns,
        "is_err": session.is_err, "chain": chain, "dropped_records": session.dropped_records}
    if (origin := error_origin(session, funcs)) is not None:  # where the error started: the chain's '!' end
        out["origin"] = {"function": origin.name, "error": origin.error}
    if session.probes:
        out["probes"] = probes_json(session, funcs, offset_ns)
    if session.lbr is not None:
        out["lbr"] = _lbr_json(session, funcs)
    if session.exe_name:
        out["exe"] = session.exe_name
    if session.workload:
        w = session.workload
        fields = (("container_id", w.container_id), ("container_runtime", w.container_runtime), ("pod_uid", w.pod_uid),
                  ("pod_name", w.pod_name), ("namespace", w.namespace), ("container_name", w.container_name),
                  ("owners", dict(w.owners)), ("image_name", w.image_name), ("image_tags", list(w.image_tags)))
        out["workload"] = {k: v for k, v in fields if v}
    if session.app is not None:
        out["app"] = _app_json(session.app)
    if session.user_frames or session.ustack_error:
        out["user_stack"] = {"error": errno_name(session.ustack_error) or session.ustack_error} \
            if session.ustack_error else [_user_frame_json(f) for f in session.user_frames]
        if session.ustack_unsymbolized:
            out["user_stack_unsymbolized"] = session.ustack_unsymbolized
    return out


def probes_json(session: Session, funcs: Mapping[int, TracedFunc], offset_ns: int) -> list[dict[str, Any]]:
    """-J: each injected probe that fired, in order, with the function it fired in (the innermost open call)."""
    owner: dict[int, str] = {}
    stack = list(session.calls)
    while stack:
        call = stack.pop()
        stack.extend(call.children)
        func = funcs.get(call.func_id)
        for hit in call.probes:
            owner[id(hit)] = func.name if func else f"func#{call.func_id}"
    return [{"probe": h.spec, "kind": h.kind, "depth": h.depth, "ts_ns": h.ts + offset_ns,
             "function": owner.get(id(h)), "fields": {f.name: f.value for f in h.fields}} for h in session.probes]


def _app_json(app: AppContext) -> dict[str, object]:
    out: dict[str, object] = {"status": app.status}
    if app.usable:
        out.update(trace_id=f"{app.trace_id:032x}", span_id=f"{app.span_id:016x}", sampled=app.sampled,
                   attributes=dict(app.attributes))
    if app.service_name:
        out["service_name"] = app.service_name
    return out


def _user_frame_json(f: UserFrame) -> dict[str, object]:
    """Innermost first, as taken (like `chain` is outermost first: both in the order of the data)."""
    return {"address": f"0x{f.addr:x}", "function": f.function, "offset": f.offset, "module": f.module,
            "file": f.file, "line": f.line, "inlined": f.inlined}


def _lbr_json(session: Session, funcs: Mapping[int, TracedFunc]) -> dict[str, object]:
    """Raw branch pairs for scripts (this output stays on the host, like the text view)."""
    cap = session.lbr
    assert cap is not None
    func = funcs.get(cap.func_id)
    return {"function": func.name if func else None, "depth": cap.depth,
            "error": (errno_name(cap.error) or f"E{cap.error}") if cap.error else None,
            "branches": [{"from": f"0x{b.src:x}", "to": f"0x{b.dst:x}"} for b in cap.branches]}

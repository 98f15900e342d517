"""What a kernel session means as OpenTelemetry spans: names, attributes, statuses and timing.

The one place that decides the content of exported spans; span_encoder writes it as OTLP bytes and
the SDK-object oracle in tests/ builds the same spans from it, so the two cannot drift.

Timing of spans rebuilt from the error chain only (no per-call records): the kernel keeps each
level's latency but not its start time. An error travels upward as functions return, so each level
returns shortly before its caller does; such spans are therefore right-aligned with their parent's
end (start = parent end - latency, clamped to the parent's start) and marked
retsnoop.start_estimated=true. Durations are exact unless clamped.
"""

import enum
from collections.abc import Callable
from typing import Any, NamedTuple

from retsnoop_otel import __version__
from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.capture.frames import relevant, user_frame_text
from retsnoop_otel.capture.model import (
    AppContext,
    Call,
    FuncTable,
    LbrCapture,
    RetKind,
    Session,
    TracedFunc,
    error_type,
    format_result,
    lookup_func,
    signed_value,
)
from retsnoop_otel.capture.origins import error_origin
from retsnoop_otel.capture.sampling import trace_state
from retsnoop_otel.export.semconv import SCHEMA_URL

SCOPE_NAME = "retsnoop_otel"
SCOPE_VERSION = __version__
SCOPE_SCHEMA_URL = SCHEMA_URL  # the span attributes follow these conventions (ScopeSpans.schema_url)
DEFAULT_MAX_SPANS = 4096  # per trace; a session's deeper calls beyond this are counted, not sent
START_ESTIMATED = "retsnoop.start_estimated"
RECORDS_LOST = "retsnoop.records_lost_before"
UNKNOWN_ROOT_NAME = "unknown"
APP_PREFIX = "retsnoop.app."  # the application's thread-context attributes, under their own names
USER_STACK = "retsnoop.user_stacktrace"
ERROR_ORIGIN = "retsnoop.error.origin"  # root span of a failing session: the deepest function of its error chain
ATTRIBUTES_CUT = "retsnoop.attributes_cut"  # names of the attributes whose values the length limit cut

Attrs = dict[str, Any]
Locate = Callable[[int], "tuple[str, int] | None"]  # function address -> (file, line) of its definition
FormatArgs = Callable[[int, Any], list[str]]  # (function id, captured arguments) -> `name=value` strings


class StatusCode(enum.IntEnum):
    """opentelemetry.proto.trace.v1.Status.StatusCode."""

    UNSET = 0
    OK = 1
    ERROR = 2


class SpanStatus(NamedTuple):  # not a dataclass: dataclasses imports inspect, ast and dis at start
    code: StatusCode = StatusCode.UNSET
    message: str = ""


UNSET = SpanStatus()


def int64(value: int) -> int:
    """OTLP integer attributes are int64: wrap unsigned 64-bit values the way C would."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value & (1 << 63) else value


def limit_lengths(attrs: Attrs, limit: int | None) -> Attrs:
    """OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT on the attributes whose length the data decides (stacks, LBR
    records, arguments): strings, and each string of an array, cut to `limit` characters, as the SDKs do.
    The span says which ones were cut (ATTRIBUTES_CUT): a stack cut short must not read as the whole stack."""
    if limit is None:
        return attrs
    cut: list[str] = list(attrs.get(ATTRIBUTES_CUT, ()))  # already cut (the LBR records, before they moved here)
    for key, value in list(attrs.items()):
        if isinstance(value, str) and len(value) > limit:
            attrs[key] = value[:limit]
            cut.append(key)
        elif isinstance(value, list) and any(isinstance(v, str) and len(v) > limit for v in value):
            attrs[key] = [v[:limit] if isinstance(v, str) else v for v in value]
            cut.append(key)
    if cut:
        attrs[ATTRIBUTES_CUT] = list(dict.fromkeys(cut))
    return attrs


def func_attrs(func: TracedFunc, locate: Locate | None = None) -> Attrs:
    """The attributes every span of `func` carries, whatever it returned (source location with DWARF)."""
    attrs: Attrs = {"code.function.name": func.name, "retsnoop.return_kind": func.ret.value}
    if func.binary is not None:  # a user-space function: its line was read from its binary at discovery
        attrs["retsnoop.binary"] = func.binary
        if func.source:
            path, _, line = func.source.rpartition(":")
            attrs["code.file.path"], attrs["code.line.number"] = path, int(line)
    elif locate is not None and func.addr:
        where = locate(func.addr)
        if where is not None:
            attrs["code.file.path"], attrs["code.line.number"] = where
    if func.module:
        attrs["retsnoop.module"] = func.module
    return attrs


def return_attrs(kind: RetKind, raw: int | None, export_addresses: bool) -> tuple[Attrs, SpanStatus]:
    """Attributes + status for a return of `raw` (None: the exit was not seen) from a `kind` function."""
    if raw is None:
        return {"retsnoop.incomplete": True}, UNSET
    err = error_type(raw, kind)
    text = format_result(raw, kind)
    if kind is RetKind.POINTER and err is None and not export_addresses:
        # a valid kernel pointer reveals the KASLR offset: say only that it is valid
        return {"retsnoop.result": "non-NULL"}, UNSET
    attrs: Attrs = {"retsnoop.result": text}
    if kind is not RetKind.VOID:
        attrs["retsnoop.return_value"] = int64(signed_value(raw, kind))
    if err is None:
        return attrs, UNSET
    attrs["error.type"] = err
    return attrs, SpanStatus(StatusCode.ERROR, text)


def unknown_root() -> tuple[str, Attrs, SpanStatus]:
    """Name, attributes and status of a root span whose entry function is not known."""
    return UNKNOWN_ROOT_NAME, {"retsnoop.incomplete": True}, UNSET


def call_attrs(call: Call, format_args: FormatArgs | None, lbr_at: Call | None, lbr: Attrs) -> Attrs:
    """Attributes a call's span carries on top of its function's and result's (usually none)."""
    attrs: Attrs = {RECORDS_LOST: call.missing_before} if call.missing_before else {}
    if call.args and format_args is not None:
        attrs["retsnoop.args"] = format_args(call.func_id, call.args)
    if lbr and call is lbr_at:
        attrs.update(lbr)
    return attrs


def split_root(session: Session) -> tuple[list[Call], int | None]:
    """The calls shown under the root span, and the entry function's result (None: not known).

    The root span stands for the entry call itself, so when the call records start with it, its
    children become the root's children; the error chain supplies the result when no exit was seen.
    """
    top, entry_id = session.calls, session.entry_func_id
    raw: int | None = None
    known = False
    if len(top) == 1 and top[0].func_id == entry_id:
        raw, known = top[0].result, top[0].end_ns is not None
        top = top[0].children
    if not known and session.chain and session.chain[0].latency_ns is not None:
        raw, known = session.chain[0].result, True
    return top, raw if known else None


def session_attrs(session: Session, symbolize: Callable[[int], str] | None, export_addresses: bool) -> Attrs:
    """Root-span attributes describing the thread, process and kernel stack of the session."""
    attrs: Attrs = {
        "thread.id": session.tid,
        "thread.name": session.comm,
        "process.pid": session.pid,
        "process.executable.name": session.exe_name or session.proc_comm,
        "retsnoop.cpu": session.cpu,
    }
    if session.dropped_records > 0:
        attrs["retsnoop.dropped_records"] = session.dropped_records
    if session.calls_cut > 0:
        attrs["retsnoop.calls_cut"] = session.calls_cut
    if session.kstack and (symbolize is not None or export_addresses):
        if symbolize is None:
            frames = [f"0x{addr:016x}" for addr in session.kstack]
        elif export_addresses:
            frames = [f"0x{addr:016x} {symbolize(addr)}" for addr in session.kstack]
        else:
            frames = [no_address(symbolize(addr), addr) for addr in session.kstack]
        attrs["code.stacktrace"] = "\n".join(frames)
    attrs.update(app_attrs(session.app))
    if session.ustack_unsymbolized:  # only addresses: they reveal ASLR, and say little without the process's maps
        attrs["retsnoop.user_stack_unsymbolized"] = session.ustack_unsymbolized
        if export_addresses:
            attrs[USER_STACK] = "\n".join(f"0x{f.addr:016x}" for f in session.user_frames)
    elif session.user_frames:
        attrs[USER_STACK] = "\n".join(user_frame_text(f, export_addresses) for f in session.user_frames)
    elif session.ustack_error:
        attrs["retsnoop.user_stack_error"] = errno_name(session.ustack_error) or f"E{session.ustack_error}"
    return attrs


def origin_attrs(session: Session, funcs: FuncTable) -> Attrs:
    """The root span's retsnoop.error.origin: where a failing session's error started (the kernel counts it by the
    same rule in retsnoop_error_origins_total, so a trace and the series of its origin share the name)."""
    origin = error_origin(session, funcs)
    return {} if origin is None else {ERROR_ORIGIN: lookup_func(funcs, origin.func_id).name}


def app_attrs(app: AppContext | None) -> Attrs:
    """The application's side of the root span: its service and its record's attributes, or why the
    thread's context could not be used (no_record, invalid, fault)."""
    if app is None:
        return {}
    attrs: Attrs = {}
    if app.service_name:
        attrs[APP_PREFIX + "service.name"] = app.service_name
    if app.status != "ok":
        attrs[APP_PREFIX + "context"] = app.status
        return attrs
    attrs.update((APP_PREFIX + key, value) for key, value in app.attributes)
    if app.attrs_cut:
        attrs[APP_PREFIX + "attributes_cut"] = True
    return attrs


def app_parent(session: Session) -> tuple[AppContext | None, bool]:
    """The application context the root span refers to, and whether it joins its trace as a child.

    A sampled context is joined: the kernel chain nests under the application's span. An unsampled
    one is only linked, so that the application's sampling decision is not overridden for its trace.
    """
    app = session.app
    if app is None or not app.usable:
        return None, False
    return app, app.sampled


def sampling_state(session: Session, joined: bool) -> tuple[str, int | None]:
    """The spans' `tracestate` and the 56 low bits their trace id must carry (None: any).

    A trace of its own starts with our sampling decision, so its tracestate says the probability it
    was kept with (`ot=th:...`, OTel probability sampling), and its trace id carries the randomness
    the decision compared with that threshold, as consistent samplers downstream expect. A joined
    session belongs to the application's trace: the thread context holds no tracestate, so the
    probability of that trace is unknown, and the spans say nothing (the specification asks to erase
    a threshold that is not known) and keep the application's trace id as it is.
    """
    if joined:
        return "", None
    return trace_state(session.sampling_threshold), session.trace_randomness


def lbr_attrs(session: Session, funcs: FuncTable, symbolize: Callable[[int], str] | None,
              export_addresses: bool) -> Attrs:
    """--lbr: the branch records as `retsnoop.lbr` (relevant ones, oldest first), or why there are none."""
    cap = session.lbr
    if cap is None:
        return {}
    if cap.error:
        return {"retsnoop.lbr_error": errno_name(cap.error) or f"E{cap.error}"}
    entries = lbr_entries(cap, lookup_func(funcs, cap.func_id), symbolize, export_addresses)
    return {"retsnoop.lbr": entries} if entries else {}


def lbr_call(session: Session) -> Call | None:
    """The call whose exit took the session's LBR snapshot, found by depth and exit time."""
    cap = session.lbr
    if cap is None:
        return None
    level = session.calls
    for depth in range(cap.depth + 1):
        here = [c for c in level if c.depth == depth and c.start_ns <= cap.exit_ns
                and (c.end_ns is None or c.end_ns >= cap.exit_ns)]
        if not here:
            return None
        call = here[-1]
        if depth == cap.depth:
            return call if call.func_id == cap.func_id and call.end_ns == cap.exit_ns else None
        level = call.children
    return None


def no_address(frame: str, addr: int) -> str:
    """Symbolizers print the bare address when no symbol covers it; that would leak the KASLR offset."""
    return "[unknown]" if f"{addr:x}" in frame.lower() else frame


def count_calls(calls: list[Call]) -> int:
    total, stack = 0, list(calls)
    while stack:
        call = stack.pop()
        total += 1
        stack.extend(call.children)
    return total


def chain_span_times(parent_start: int, parent_end: int, latency_ns: int | None) -> tuple[int, int]:
    """Start and end of an error-chain span inside its parent (right-aligned; see the module doc)."""
    if latency_ns is None:
        return parent_start, parent_end
    return max(parent_start, parent_end - latency_ns), parent_end


def lbr_entries(cap: LbrCapture, func: TracedFunc | None, describe: Callable[[int], str] | None,
               export_addresses: bool) -> list[str]:
    """`from -> to` strings for the retsnoop.lbr span attribute: the relevant records, oldest first.

    Without a symbolizer only --export-addresses allows the raw addresses (they reveal KASLR); an
    address no symbol covers is shown as [unknown] unless addresses may be exported.
    """
    kept, _ = relevant(cap.branches, func.addr if func else 0, func.size if func else 0)

    def side(addr: int) -> str:
        if describe is None:
            return f"0x{addr:x}"
        text = describe(addr)
        if export_addresses:
            return text if text.startswith("0x") else f"0x{addr:x} {text}"
        return "[unknown]" if text.startswith("0x") else text

    if describe is None and not export_addresses:
        return []
    return [f"{side(b.src)} -> {side(b.dst)}" for b in reversed(kept)]

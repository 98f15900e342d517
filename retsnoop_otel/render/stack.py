"""retsnoop's stack view of one session: the kernel stack merged with the traced (error) call chain.

The kernel stack comes from bpf_get_stack() in the exit probe of the deepest traced function, so it
holds, innermost first: the probe machinery (BPF program, trampoline or kretprobe handlers), then
the callers of that function. Traced functions that were still running show up there as return
addresses inside them; the deepest one (its frame is gone once it returns) and any that already
returned do not, and are printed with the '!' mark, as retsnoop does.
"""

import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from retsnoop_otel.capture.model import Session, StackEntry, TracedFunc, format_result
from retsnoop_otel.render.formats import PLAIN_STACKS, StackFormat
from retsnoop_otel.render.user_stack import user_stack_lines
from retsnoop_otel.symbols.symbolize import Frame, Symbolizer

# Frames that belong to the tracer, not to the traced code: the BPF program and its trampoline,
# bpf_get_stack's own unwinding, and the kprobe/kretprobe/fprobe/ftrace delivery paths.
_TRACING_PREFIXES = (
    "bpf_prog_", "bpf_trampoline_", "bpf_get_stack", "get_perf_callchain", "perf_callchain_",
    "__bpf_prog_enter", "__bpf_prog_exit", "bpf_trace_run", "__bpf_trace_run", "trace_call_bpf",
    "kprobe_", "kretprobe_", "__kretprobe_", "pre_handler_kretprobe", "aggr_pre_handler",
    "trampoline_handler", "ftrace_", "arch_ftrace_", "rethook_", "arch_rethook_", "fprobe_", "__fprobe_",
    "exc_int3", "asm_exc_int3", "do_int3",
)
# With fexit, the traced function's own fentry call site (f+0x5, f+0x9 with endbr) sits right
# outside the trampoline frame; it is an artefact of the trampoline, not a caller.
_FENTRY_SITE_MAX = 0x10
_MIN_DURATION_WIDTH = 5


class _Row(NamedTuple):
    mark: str = " "
    duration: str = ""
    result: str = ""
    symbol: str = ""
    source: str = ""


def is_tracing_frame(name: str) -> bool:
    return name.startswith(_TRACING_PREFIXES)


def filter_kstack(kstack: Sequence[int], symbolizer: Symbolizer) -> list[tuple[int, list[Frame]]]:
    """Symbolized kernel frames with the tracer's own frames removed, innermost first (as captured)."""
    return [(addr, frames) for addr, frames, dropped in kstack_frames(kstack, symbolizer) if not dropped]


def kstack_frames(kstack: Sequence[int], symbolizer: Symbolizer) -> list[tuple[int, list[Frame], bool]]:
    """Every symbolized kernel frame, innermost first, each with whether it is the tracer's own (filter_kstack
    drops those; -C stacks.unfiltered=true shows them)."""
    out: list[tuple[int, list[Frame], bool]] = []
    after_trampoline = False
    for addr in kstack:
        if not addr:
            continue
        frames = symbolizer.frames(addr)
        if frames and is_tracing_frame(frames[0].name):
            after_trampoline = after_trampoline or frames[0].name.startswith("bpf_trampoline_")
            out.append((addr, frames, True))
            continue
        if after_trampoline and frames and frames[0].offset <= _FENTRY_SITE_MAX:
            after_trampoline = False
            out.append((addr, frames, True))
            continue
        after_trampoline = False
        out.append((addr, frames, False))
    return out


def _match_chain(kframes: list[tuple[int, list[Frame], bool]], func_ids: Sequence[int],
                 funcs: Mapping[int, TracedFunc]) -> list[int | None]:
    """For each chain function (outermost first) its kframes position, matching by function start address
    (never a frame of the tracer's: an fentry call site kept by stacks.unfiltered starts where its function does)."""
    starts = [addr - frames[0].offset if frames and not dropped else None for addr, frames, dropped in kframes]
    positions: list[int | None] = []
    cursor = 0
    for func_id in func_ids:
        func = funcs.get(func_id)
        pos = None
        if func is not None and func.binary is None:  # a user function's address is not a kernel one
            pos = next((i for i in range(cursor, len(starts)) if starts[i] == func.addr), None)
        if pos is not None:
            cursor = pos + 1
        positions.append(pos)
    return positions


_ADDR_WIDTH = 18  # '~' or ' ', 16 hex digits, a space: the address column of stacks.emit-addrs


def symbol_text(name: str, offset: int, fmt: StackFormat) -> str:
    """name+0xOFF, or name+OFF with stacks.dec-offs."""
    return f"{name}+{offset}" if fmt.dec_offs else f"{name}+0x{offset:x}"


def _frame_rows(addr: int, frames: list[Frame], fmt: StackFormat, dropped: bool = False) -> list[_Row]:
    lead = f"{'~' if dropped else ' '}{addr:016x} " if fmt.emit_addrs else ""
    if not frames:
        return [_Row(symbol=f"{lead}0x{addr:x}")]
    top = frames[0]
    rows = [_Row(symbol=lead + symbol_text(top.name, top.offset, fmt), source=_source(top))]
    pad = " " * _ADDR_WIDTH if fmt.emit_addrs else ""
    rows.extend(_Row(symbol=f"{pad}. {f.name}", source=_source(f)) for f in frames[1:])
    return rows


def _definition(func: TracedFunc | None, symbolizer: Symbolizer) -> str:
    """Where a function that already returned is defined (its entry address), when DWARF is at hand.

    retsnoop leaves '!' rows without a location; with DWARF we can still say which file the error
    started in, at no cost to the layout.
    """
    if func is None or not func.addr:
        return ""
    frames = symbolizer.frames(func.addr)
    return _source(frames[0]) if frames and frames[0].offset == 0 else ""


def _source(frame: Frame) -> str:
    return f"({frame.file}:{frame.line})" if frame.file else ""


def _entry_columns(entry: StackEntry, func: TracedFunc | None) -> tuple[str, str]:
    if entry.latency_ns is None:
        return "...", "[...]"
    if func is None:
        return f"{entry.latency_ns // 1000}us", f"[0x{entry.result:x}]"
    return f"{entry.latency_ns // 1000}us", f"[{format_result(entry.result, func.ret)}]"


class _Layout(NamedTuple):
    """A stack's rows with the chain's durations and results left out, and where each of those goes."""

    rows: tuple[_Row, ...]
    slots: tuple[tuple[int, int], ...]  # (row, chain position)


def _layout(kstack: Sequence[int], func_ids: Sequence[int], funcs: Mapping[int, TracedFunc],
            symbolizer: Symbolizer, fmt: StackFormat = PLAIN_STACKS) -> _Layout:
    """Rows outermost first: kernel frames above the chain, merged rows, then '!' rows for the rest."""
    kframes = [f for f in reversed(kstack_frames(kstack, symbolizer)) if fmt.unfiltered or not f[2]]
    positions = _match_chain(kframes, func_ids, funcs)
    rows: list[_Row] = []
    slots: list[tuple[int, int]] = []
    cursor = 0
    for i, func_id in enumerate(func_ids):
        pos = positions[i]
        func = funcs.get(func_id)
        if func is not None and func.binary is not None:  # user space: above every kernel frame, never in them
            slots.append((len(rows), i))
            rows.append(_Row(" ", "", "", func.label,
                             f"({func.source})" if func.source else ""))
            continue
        # A traced function missing from the stack sits below every kernel frame above the next
        # traced function that is there (or below all of them): those frames print first.
        stop = pos if pos is not None else next((p for p in positions[i + 1:] if p is not None), len(kframes))
        for addr, frames, dropped in kframes[cursor:stop]:
            rows.extend(_frame_rows(addr, frames, fmt, dropped))
        cursor = stop
        slots.append((len(rows), i))
        if pos is None:
            lead = " " * _ADDR_WIDTH if fmt.emit_addrs else ""
            rows.append(_Row("!", "", "", lead + (func.name if func else f"<func #{func_id}>"),
                             _definition(func, symbolizer)))
            continue
        addr, frames, dropped = kframes[pos]
        rows.extend(_frame_rows(addr, frames, fmt, dropped))
        cursor = pos + 1
    for addr, frames, dropped in kframes[cursor:]:
        rows.extend(_frame_rows(addr, frames, fmt, dropped))
    return _Layout(tuple(rows), tuple(slots))


class StackLayouts:
    """Layouts by (kernel stack, chain functions), for one probe set's functions and symbolizer.

    A syscall failing in a loop repeats one stack shape thousands of times; only the durations and
    results differ. Building the layout (symbolizing, dropping the tracer's frames, matching the chain)
    was almost half of the console's time per session (bench/console_cost.py), and on one CPU the
    reader's time is taken from the traced workload. Bounded: once full, new shapes are built and not
    kept (keeping thousands of distinct ones cost more in allocation than they saved).
    """

    def __init__(self, funcs: Mapping[int, TracedFunc], symbolizer: Symbolizer, limit: int = 512,
                 fmt: StackFormat = PLAIN_STACKS) -> None:
        self.funcs, self.symbolizer, self.limit, self.fmt = funcs, symbolizer, limit, fmt
        self._kept: dict[tuple[tuple[int, ...], tuple[int, ...]], _Layout] = {}

    def get(self, kstack: Sequence[int], func_ids: tuple[int, ...]) -> _Layout:
        key = (tuple(kstack), func_ids)
        layout = self._kept.get(key)
        if layout is None:
            layout = _layout(kstack, func_ids, self.funcs, self.symbolizer, self.fmt)
            if len(self._kept) < self.limit:
                self._kept[key] = layout
        return layout


def stack_rows(session: Session, funcs: Mapping[int, TracedFunc], symbolizer: Symbolizer,
               layouts: StackLayouts | None = None, fmt: StackFormat = PLAIN_STACKS) -> list[_Row]:
    """The session's rows: its stack shape's layout with the chain's durations and results filled in.
    `fmt` when there are no `layouts` (which have their own)."""
    func_ids = tuple(e.func_id for e in session.chain)
    layout = (layouts.get(session.kstack, func_ids) if layouts is not None
              else _layout(session.kstack, func_ids, funcs, symbolizer, fmt))
    rows = list(layout.rows)
    for row, i in layout.slots:
        entry = session.chain[i]
        duration, result = _entry_columns(entry, funcs.get(entry.func_id))
        rows[row] = rows[row]._replace(duration=duration, result=result)
    return rows


def format_rows(rows: Sequence[_Row]) -> list[str]:
    """Marks, right-aligned duration, left-aligned result and symbol columns, then the source."""
    dur_w = max([_MIN_DURATION_WIDTH, *(len(r.duration) for r in rows)])
    res_w = max([0, *(len(r.result) for r in rows)])
    sym_w = max([0, *(len(r.symbol) for r in rows if r.source)])
    out = []
    for r in rows:
        line = f"{r.mark}  {r.duration:>{dur_w}} {r.result:<{res_w}}  {r.symbol:<{sym_w}}  {r.source}"
        out.append(line.rstrip())
    return out


def format_ts(wall_ns: int) -> str:
    """HH:MM:SS.uuuuuu in local time."""
    return time.strftime("%H:%M:%S", time.localtime(wall_ns // 1_000_000_000)) + \
        f".{wall_ns // 1000 % 1_000_000:06d}"


def render_header(session: Session, offset_ns: int) -> str:
    """retsnoop's header line, plus the application's trace and span ids when its thread published them."""
    app = session.app
    ids = f" trace_id={app.trace_id:032x} span_id={app.span_id:016x}" if app is not None and app.usable else ""
    return (f"{format_ts(session.start_ns + offset_ns)} -> {format_ts(session.end_ns + offset_ns)} "
            f"TID/PID {session.tid}/{session.pid} ({session.comm}/{session.proc_comm}){ids}:")


def render_stack(session: Session, funcs: Mapping[int, TracedFunc], symbolizer: Symbolizer,
                 offset_ns: int, layouts: StackLayouts | None = None, fmt: StackFormat = PLAIN_STACKS) -> str:
    """One session in retsnoop's stack format; `offset_ns` converts boot-clock times to wall clock.
    `layouts`: kept stack shapes of these `funcs` and `symbolizer` (a console's, across sessions, made with
    the console's `fmt`); `fmt`: how rows are written when there are none."""
    lines = format_rows(stack_rows(session, funcs, symbolizer, layouts, fmt))
    user = user_stack_lines(session)
    if user:
        lines += ["", *user]
    return render_header(session, offset_ns) + "\n\n" + "".join(line + "\n" for line in lines) + "\n\n"

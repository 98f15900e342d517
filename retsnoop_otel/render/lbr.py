"""retsnoop's LBR view of captured branch records (which branches to record: kernel/lbr.py).

Pure: it turns (from, to) address pairs into `[#NN] from -> to` rows, dropping the records wasted
inside the tracing machinery after the deepest traced function returned.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.capture.frames import relevant
from retsnoop_otel.capture.model import Branch, Session, TracedFunc
from retsnoop_otel.render.formats import PLAIN_STACKS, StackFormat
from retsnoop_otel.render.stack import symbol_text
from retsnoop_otel.symbols.symbolize import Frame, Symbolizer


def _side(frames: list[Frame], addr: int, fmt: StackFormat) -> list[tuple[str, str]]:
    """(symbol, source) cells of one end of a record: the function, then its inlined frames; with
    stacks.emit-addrs the address leads the first, and the others are indented past it."""
    lead = f"{addr:016x} " if fmt.emit_addrs else ""
    if not frames:
        return [(f"{lead}0x{addr:x}", "")]
    out = []
    for i, f in enumerate(frames):
        name = lead + symbol_text(f.name, f.offset, fmt) if i == 0 else \
            " " * len(lead) + (f". {f.name}" if f.inlined else f.name)
        src = f"({f.file}:{f.line})" if f.file and f.line else ""
        out.append((name, src))
    return out


def render_lbr(records: Sequence[Branch], symbolizer: Symbolizer, func_addr: int, func_size: int,
               max_count: int = 0, fmt: StackFormat = PLAIN_STACKS) -> str:
    """The LBR block, oldest record first, numbered as captured (#00 = newest). stacks.unfiltered keeps
    the records newer than the deepest traced function's (the relevance cut)."""
    kept, filtered = relevant(records, func_addr, func_size)
    if fmt.unfiltered:
        kept = list(records)
    first = len(records) - len(kept)
    numbered = list(enumerate(kept, start=first))
    if max_count > 0:
        numbered = numbered[:max_count]  # the records nearest to the cut are the relevant ones
    rows: list[tuple[str, str, str, str, str]] = []
    for idx, b in reversed(numbered):
        src = _side(symbolizer.frames(b.src), b.src, fmt)
        dst = _side(symbolizer.frames(b.dst), b.dst, fmt)
        for j in range(max(len(src), len(dst))):
            s = src[j] if j < len(src) else ("", "")
            d = dst[j] if j < len(dst) else ("", "")
            rows.append((f"[#{idx:02d}]" if j == 0 else "", *s, "->" if j == 0 else "", *d))
    widths = [max((len(r[k]) for r in rows), default=0) for k in range(6)]
    lines = []
    for r in rows:
        left = " ".join(f"{r[k]:<{widths[k]}}" for k in range(3) if widths[k])
        right = " ".join(f"{r[k]:<{widths[k]}}" for k in (4, 5) if widths[k])
        lines.append(f"{left}  {r[3]:<2}  {right}".rstrip())
    if not filtered and records:
        lines.append("[LBR] No relevant LBR data were captured, showing unfiltered LBR stack!")
    return "\n".join(lines) + ("\n" if lines else "")


def render_session_lbr(session: Session, funcs: Mapping[int, TracedFunc], symbolizer: Symbolizer,
                       max_count: int = 0, fmt: StackFormat = PLAIN_STACKS) -> str:
    """The LBR block of one session (empty without --lbr): retsnoop prints it between the call table
    and the stack."""
    cap = session.lbr
    if cap is None:
        return ""
    if cap.error:
        name = errno_name(cap.error) or str(cap.error)
        why = " (this CPU keeps no last branch records)" if cap.error == errno.ENOENT else ""
        return f"[LBR] failed to capture branch records: -{name}{why}\n"
    if not cap.branches:
        return "[LBR] no branch records were captured\n"
    func = funcs.get(cap.func_id)
    addr, size = (func.addr, func.size) if func is not None else (0, 0)
    return render_lbr(cap.branches, symbolizer, addr, size, max_count, fmt)

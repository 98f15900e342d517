"""--lbr: branch-sampling specs, and retsnoop's LBR view of captured branch records.

LBR needs a CPU (and hypervisor) that exposes last-branch records to perf; where there is none
(this project's CI host and its VMs), `--lbr` is refused before anything is attached. The view is
pure: it turns (from, to) address pairs into `[#NN] from -> to` rows, dropping the records wasted
inside the tracing machinery after the deepest traced function returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .symbolize import Frame, Symbolizer

# enum perf_branch_sample_type (uapi linux/perf_event.h)
BRANCH_KERNEL = 1 << 1
BRANCH_TYPES: Mapping[str, int] = {
    "any": 1 << 3,
    "any_call": 1 << 4,
    "any_return": 1 << 5,
    "ind_call": 1 << 6,
    "abort_tx": 1 << 7,
    "in_tx": 1 << 8,
    "no_tx": 1 << 9,
    "cond": 1 << 10,
    "call_stack": 1 << 11,
    "ind_jump": 1 << 12,
    "call": 1 << 13,
}
DEFAULT_SPEC = "any_return"


class LbrError(Exception):
    """A bad --lbr spec or a machine without LBR: one sentence for the user."""


def parse_specs(specs: Sequence[str]) -> int:
    """OR of the given specs (names or numbers); the default is any_return. Kernel-only sampling."""
    flags = 0
    for spec in specs or [DEFAULT_SPEC]:
        for part in (spec or DEFAULT_SPEC).split(","):
            part = part.strip().lower()
            if part in BRANCH_TYPES:
                flags |= BRANCH_TYPES[part]
                continue
            try:
                flags |= int(part, 0)
            except ValueError:
                raise LbrError(f"unknown --lbr value '{part}' (expected one of {', '.join(BRANCH_TYPES)}, "
                               "or a number)") from None
    return flags | BRANCH_KERNEL


def require_lbr(available: bool, detail: str) -> None:
    if not available:
        raise LbrError(f"--lbr needs last branch records, but {detail}: run without --lbr, or on a machine "
                       "whose CPU exposes LBR to this kernel (bare metal or a VM with LBR passthrough)")


@dataclass(frozen=True, slots=True)
class Branch:
    src: int
    dst: int


def relevant(records: Sequence[Branch], func_addr: int, func_size: int) -> tuple[list[Branch], bool]:
    """retsnoop's relevance cut: records are newest first; drop the newest ones up to the first whose
    source or target lies inside the deepest traced function. Returns (kept, filtered?); when no
    record touches that function, everything is kept and filtered is False."""
    end = func_addr + max(func_size, 1)
    for i, b in enumerate(records):
        if func_addr <= b.src < end or func_addr <= b.dst < end:
            return list(records[i:]), True
    return list(records), False


def _side(frames: list[Frame], addr: int) -> list[tuple[str, str]]:
    """(symbol, source) cells of one end of a record: the function, then its inlined frames."""
    if not frames:
        return [(f"0x{addr:x}", "")]
    out = []
    for i, f in enumerate(frames):
        name = f.name if not f.inlined else f". {f.name}"
        if i == 0:
            name = f"{f.name}+0x{f.offset:x}"
        src = f"({f.file}:{f.line})" if f.file and f.line else ""
        out.append((name, src))
    return out


def render_lbr(records: Sequence[Branch], symbolizer: Symbolizer, func_addr: int, func_size: int,
               max_count: int = 0) -> str:
    """The LBR block, oldest record first, numbered as captured (#00 = newest)."""
    kept, filtered = relevant(records, func_addr, func_size)
    first = len(records) - len(kept)
    numbered = list(enumerate(kept, start=first))
    if max_count > 0:
        numbered = numbered[:max_count]  # the records nearest to the cut are the relevant ones
    rows: list[tuple[str, str, str, str, str]] = []
    for idx, b in reversed(numbered):
        src = _side(symbolizer.frames(b.src), b.src)
        dst = _side(symbolizer.frames(b.dst), b.dst)
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

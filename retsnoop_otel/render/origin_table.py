"""`trace`'s summary at stop: where the run's errors started, from the kernel's origin counts (issue 46 point 3).

One row per (entry function, origin, error), the most frequent first, with its share of all failing sessions
counted: the kernel counts every failing session, so the table holds the ones the console never printed too
(sampled out, filtered by -x/-X, or lost to a full ring buffer).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from retsnoop_otel.capture.model import FuncTable, OriginCount
from retsnoop_otel.capture.origins import merge_origins


class OriginRow(NamedTuple):
    count: int
    error: str
    origin: str
    entry: str
    share: float  # of all failing sessions in the table, 0..1


def origin_rows(sets: Iterable[tuple[FuncTable, Iterable[OriginCount]]]) -> list[OriginRow]:
    """Rows of every probe set's counts, same-named functions summed, largest first (then by name)."""
    merged: dict[tuple[str, str, str], int] = {}
    for funcs, counts in sets:
        for key, n in merge_origins(counts, funcs, None).items():
            merged[key] = merged.get(key, 0) + n
    total = sum(merged.values())
    rows = [OriginRow(n, err, origin, entry, n / total) for (entry, origin, err), n in merged.items() if n]
    return sorted(rows, key=lambda r: (-r.count, r.origin, r.entry, r.error))


def origin_table(rows: Sequence[OriginRow]) -> str:
    """The rows as retsnoop-style text columns; "" when no session failed."""
    if not rows:
        return ""
    head = ("COUNT", "ERRNO", "ORIGIN", "ENTRY", "SHARE")
    cells = [(str(r.count), r.error, r.origin, r.entry, f"{r.share * 100:.1f}%") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = [f"ERROR ORIGINS ({sum(r.count for r in rows)} failing sessions, counted in the kernel):"]
    for c in [head, *cells]:
        lines.append(f"{c[0]:>{widths[0]}}  {c[1]:<{widths[1]}}  {c[2]:<{widths[2]}}  {c[3]:<{widths[3]}}  "
                     f"{c[4]:>{widths[4]}}".rstrip())
    return "\n".join(lines) + "\n"


def origins_json(rows: Sequence[OriginRow]) -> dict[str, Any]:
    """--json: the same table as one object."""
    return {"origins": [{"count": r.count, "error": r.error, "origin": r.origin, "entry": r.entry,
                         "share": round(r.share, 6)} for r in rows]}

"""`trace`'s table of error origins (issue 46 point 3): of the whole run at stop, and of each interval with
--origins-interval, from the kernel's origin counts.

One row per (entry function, origin, error), the most frequent first, with its share of all failing sessions
counted: the kernel counts every failing session, so the table holds the ones the console never printed too
(sampled out, filtered by -x/-X, or lost to a full ring buffer). The kernel's counts are cumulative: an interval's
table is what they grew by between two reads (counts_since), so the intervals' tables add up to the run's.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from retsnoop_otel.capture.model import FuncTable, OriginCount
from retsnoop_otel.capture.origins import merge_origins

OriginKey = tuple[str, str, str]  # (entry, origin, error type), by function name


class OriginRow(NamedTuple):
    count: int
    error: str
    origin: str
    entry: str
    share: float  # of all failing sessions in the table, 0..1


class Span(NamedTuple):
    """An interval of the run, wall clock (ns since the epoch), for the header of its table."""

    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def origin_totals(sets: Iterable[tuple[FuncTable, Iterable[OriginCount]]]) -> dict[OriginKey, int]:
    """Every probe set's counts by name, same-named functions summed."""
    merged: dict[OriginKey, int] = {}
    for funcs, counts in sets:
        for key, n in merge_origins(counts, funcs, None).items():
            merged[key] = merged.get(key, 0) + n
    return merged


def counts_since(now: Mapping[OriginKey, int], before: Mapping[OriginKey, int]) -> dict[OriginKey, int]:
    """The failing sessions counted between two reads of the cumulative counts. The kernel's map only adds (an
    entry once in it stays), so no count goes down; one that did would be left out, not shown negative."""
    return {key: n - before.get(key, 0) for key, n in now.items() if n > before.get(key, 0)}


def rows_of(counts: Mapping[OriginKey, int]) -> list[OriginRow]:
    """The table's rows, largest first (then by name)."""
    total = sum(counts.values())
    rows = [OriginRow(n, err, origin, entry, n / total) for (entry, origin, err), n in counts.items() if n]
    return sorted(rows, key=lambda r: (-r.count, r.origin, r.entry, r.error))


def origin_rows(sets: Iterable[tuple[FuncTable, Iterable[OriginCount]]]) -> list[OriginRow]:
    """Rows of every probe set's counts, same-named functions summed, largest first (then by name)."""
    return rows_of(origin_totals(sets))


def origin_table(rows: Sequence[OriginRow], span: Span | None = None) -> str:
    """The rows as retsnoop-style text columns. The run's table (no `span`) is "" when no session failed; an
    interval's says so in one line, so that a quiet interval is seen as quiet."""
    total = sum(r.count for r in rows)
    if span is None:
        if not rows:
            return ""
        title = f"ERROR ORIGINS ({_sessions(total)}, counted in the kernel):"
    else:
        from retsnoop_otel.render.stack import format_ts  # an interval's only: a stop imports no renderer

        when = f"{format_ts(span.start_ns)} -> {format_ts(span.end_ns)} ({span.seconds:.1f} s"
        if not rows:
            return f"ERROR ORIGINS {when}): no failing sessions\n"
        title = f"ERROR ORIGINS {when}, {_sessions(total)}, counted in the kernel):"
    head = ("COUNT", "ERRNO", "ORIGIN", "ENTRY", "SHARE")
    cells = [(str(r.count), r.error, r.origin, r.entry, f"{r.share * 100:.1f}%") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = [title]
    for c in [head, *cells]:
        lines.append(f"{c[0]:>{widths[0]}}  {c[1]:<{widths[1]}}  {c[2]:<{widths[2]}}  {c[3]:<{widths[3]}}  "
                     f"{c[4]:>{widths[4]}}".rstrip())
    return "\n".join(lines) + "\n"


def _sessions(n: int) -> str:
    return f"{n} failing session" + ("" if n == 1 else "s")


def origins_json(rows: Sequence[OriginRow], span: Span | None = None) -> dict[str, Any]:
    """--json: the same table as one object; an interval's starts with its span (start_ns and end_ns wall clock,
    as a session's; seconds)."""
    out: dict[str, Any] = {} if span is None else {"start_ns": span.start_ns, "end_ns": span.end_ns,
                                                   "seconds": round(span.seconds, 3)}
    out["origins"] = [{"count": r.count, "error": r.error, "origin": r.origin, "entry": r.entry,
                       "share": round(r.share, 6)} for r in rows]
    return out


def render_origins(rows: Sequence[OriginRow], as_json: bool, span: Span | None = None, running: bool = False) -> str:
    """What `trace` prints of a table: one JSON line, or the text after a blank line (under "DONE"), or, `running`
    (among the sessions), before one, as a session's block is; "" for a run's table with no failing session (an
    interval's is always printed)."""
    if span is None and not rows:
        return ""
    if as_json:
        import json  # --json's only: 0.2 s of a stop under emulation

        return json.dumps(origins_json(rows, span)) + "\n"
    return origin_table(rows, span) + "\n" if running else "\n" + origin_table(rows, span)

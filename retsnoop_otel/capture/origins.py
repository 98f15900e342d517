"""Where a failing session's error started: the deepest function of its error chain.

The kernel keeps one chain per session (bpf/retsnoop.bpf.c, handle_exit): a failing return restarts it at
that call, and the callers that return the error in turn fill its upper levels. Its deepest level is the
origin, which the stack view marks '!' and the kernel counts in map origin_stats (bpf/stats.bpf.h); this
module gives user space the same answer for the sessions it receives (root span, --json, the trace summary).
"""

from collections.abc import Callable, Iterable
from typing import NamedTuple

from retsnoop_otel.capture.model import FuncTable, OriginCount, Session, StackEntry, error_type, lookup_func


class Origin(NamedTuple):
    """The origin of one failing session: its function and what that function returned."""

    func_id: int
    name: str
    error: str  # error.type of the origin's return ('EINVAL', 'NULL')


def origin_entry(session: Session) -> StackEntry | None:
    """The error chain's deepest level of a failing session (None: it did not fail, or has no chain)."""
    if not session.is_err or not session.chain:
        return None
    return session.chain[-1]


def error_origin(session: Session, funcs: FuncTable) -> Origin | None:
    """The origin of a failing session, named; None when it did not fail or its chain is empty."""
    entry = origin_entry(session)
    if entry is None:
        return None
    func = lookup_func(funcs, entry.func_id)
    return Origin(entry.func_id, func.label, error_type(entry.result, func.ret) or "unknown")


def merge_origins(counts: Iterable[OriginCount], funcs: FuncTable, label: Callable[[str], str] | None
                  ) -> dict[tuple[str, str, str], int]:
    """(entry, origin, error type) -> failing sessions, by function name: same-named functions (and those
    `label` folds, metrics.functions) are summed."""
    out: dict[tuple[str, str, str], int] = {}
    for c in counts:
        origin = lookup_func(funcs, c.origin_func_id).name
        key = (lookup_func(funcs, c.entry_func_id).name, label(origin) if label is not None else origin, c.error)
        out[key] = out.get(key, 0) + c.count
    return out

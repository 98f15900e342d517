"""The kernel's error-origin rule replayed over a session's recorded calls (-T), independently of its chain.

bpf/retsnoop.bpf.c handle_exit() keeps one error chain per session: a failing return starts a new chain at
that call, unless it is the parent of the chain's top returning (then it passes the error up); a fallible
parent that succeeds there ends the error. The origin is the call that started the last chain of a session
that still failed. Tests compare this with the chain's deepest level (capture/origins.py), which the stack view
marks '!' and the kernel counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from retsnoop_otel.capture.model import Call, RetKind, TracedFunc, is_failure


def _exits(calls: list[Call]) -> Iterator[Call]:
    """Calls in the order they returned (children first); calls whose exit was not seen are left out."""
    for c in calls:
        yield from _exits(c.children)
        if c.result is not None:
            yield c


def origin_from_calls(calls: list[Call], funcs: Mapping[int, TracedFunc]) -> int | None:
    """The func id where the error of this call tree started, or None when it did not end in an error."""
    origin, top, failing = None, 0, False
    for c in _exits(calls):
        kind = funcs[c.func_id].ret
        failed = is_failure(c.result, kind)  # type: ignore[arg-type]
        if failing and c.depth == top - 1:
            top = c.depth
            if not failed and kind not in (RetKind.VOID, RetKind.BOOL, RetKind.UNSIGNED):
                failing = False
        elif failed:
            origin, top, failing = c.func_id, c.depth, True
    return origin if failing else None

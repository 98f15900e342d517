"""The error chain rebuilt from returns alone (bpf/origins.bpf.h, --origins-only) names the origin sessions name.

bpf/origins.bpf.h sees no entry: it orders the returns by the stack pointer each leaves behind (its caller's).
`origin_by_returns` replays that program's rule in Python over a call tree's returns, with a stack pointer per
depth, and the tests compare it with the sessions' rule (tests/origin_oracle.py, itself checked against the kernel's
chains in the VM) over generated trees where every function is traced. Trees with untraced functions between traced
ones are where the two may differ (the docs say how); the VM's --syscalls scenario compares both on real paths.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from retsnoop_otel.capture.model import Call, RetKind, TracedFunc, is_failure
from tests.origin_oracle import origin_from_calls

FRAME = 64  # bytes a level's frame takes: a deeper call returns to a lower stack pointer
BASE = 1 << 20
FALLIBLE_NOT = (RetKind.VOID, RetKind.BOOL, RetKind.UNSIGNED)
EINVAL, ENOENT = (1 << 64) - 22, (1 << 64) - 2
FUNCS = {i: TracedFunc(i, f"f{i}", 0, kind, i == 0)
         for i, kind in enumerate((RetKind.SIGNED, RetKind.INT32, RetKind.INT32, RetKind.POINTER, RetKind.VOID,
                                   RetKind.BOOL, RetKind.INT32))}


def _returns(calls: list[Call]) -> Iterator[Call]:
    for c in calls:
        yield from _returns(c.children)
        yield c


def origin_by_returns(calls: list[Call], funcs: Mapping[int, TracedFunc], at_sys_exit: bool = False) -> int | None:
    """origin_exit and entry_return of bpf/origins.bpf.h over one thread's returns; the sp at a return is its
    caller's (a level up). None when the entry function (depth 0) did not fail. `at_sys_exit`: the entry's return is
    seen at the sys_exit tracepoint (origin_sys_exit), where any active chain is the syscall's."""
    active, top_sp, origin = False, 0, None
    for c in _returns(calls):
        kind = funcs[c.func_id].ret
        sp = BASE - FRAME * c.depth  # the caller's frame: the lower the deeper
        failed = is_failure(c.result, kind)  # type: ignore[arg-type]
        if c.depth == 0:  # the entry function's return
            if not failed:
                return None
            return origin if active and (at_sys_exit or sp > top_sp) else c.func_id
        if not failed:
            if active and sp > top_sp:
                if kind in FALLIBLE_NOT:
                    top_sp = sp  # it cannot fail: the error passes up through it
                else:
                    active = False  # it could have failed and did not: the error was handled
            continue
        if not active or sp <= top_sp:
            origin, active = c.func_id, True
        top_sp = sp
    return None


@st.composite
def trees(draw: st.DrawFn, depth: int = 0) -> Call:
    fid = 0 if depth == 0 else draw(st.integers(1, len(FUNCS) - 1))
    kids = [] if depth >= 4 else draw(st.lists(trees(depth + 1), max_size=3))  # type: ignore[call-arg]
    kind = FUNCS[fid].ret
    results = [0] if kind in FALLIBLE_NOT else [0, EINVAL, ENOENT, 12345] if kind is not RetKind.POINTER \
        else [0, 0xFFFF888000001000, EINVAL]
    return Call(fid, depth, 0, 1, draw(st.sampled_from(results)), children=kids)


@settings(max_examples=1000, deadline=None)
@given(trees(), st.booleans())
def test_every_traced_the_returns_name_the_sessions_origin(root: Call, at_sys_exit: bool) -> None:
    """With every function traced, the first return above the chain's top is its parent's: the same rule, whether
    the syscall's end is its entry function's return or the sys_exit tracepoint."""
    assert origin_by_returns([root], FUNCS, at_sys_exit) == origin_from_calls([root], FUNCS)


def test_a_handled_error_below_is_not_the_origin() -> None:
    """f1 fails and its caller f2 succeeds (handled), then f6 fails: f6 is the origin, as in a session."""
    root = Call(0, 0, 0, 1, EINVAL, children=[
        Call(2, 1, 0, 1, 0, children=[Call(1, 2, 0, 1, EINVAL)]),
        Call(6, 1, 0, 1, ENOENT)])
    assert origin_by_returns([root], FUNCS) == origin_from_calls([root], FUNCS) == 6


def test_an_error_passed_up_through_a_void_function_keeps_its_origin() -> None:
    root = Call(0, 0, 0, 1, EINVAL, children=[Call(4, 1, 0, 1, 0, children=[Call(1, 2, 0, 1, EINVAL)])])
    assert origin_by_returns([root], FUNCS) == origin_from_calls([root], FUNCS) == 1

"""The functions of tests/native/simkern.c, the user-space stand-ins for kernel call chains that the native tests
trace through uprobes, and a walk over the call trees their sessions hold."""

from __future__ import annotations

from collections.abc import Iterator

from retsnoop_otel.capture.model import Call, RetKind, TracedFunc

SIMKERN_FUNCS = [
    ("sk_syscall", RetKind.SIGNED, True),
    ("sk_create", RetKind.SIGNED, False),
    ("sk_check", RetKind.INT32, False),
    ("sk_alloc", RetKind.POINTER, False),
    ("sk_log", RetKind.VOID, False),
    ("sk_flag", RetKind.BOOL, False),
    ("sk_recurse", RetKind.INT32, True),
    ("sk_many", RetKind.SIGNED, True),
]


def simkern_funcs() -> list[TracedFunc]:
    """The functions of simkern.c as the tracer is given them (id = index in SIMKERN_FUNCS)."""
    return [TracedFunc(i, name, 0, kind, entry) for i, (name, kind, entry) in enumerate(SIMKERN_FUNCS)]


def walk(calls: list[Call]) -> Iterator[Call]:
    """Every call of the trees, depth first, parents before children."""
    for c in calls:
        yield c
        yield from walk(c.children)

"""The functions of tests/native/simkern.c, the user-space stand-ins for kernel call chains that the native tests
trace through uprobes, and a walk over the call trees their sessions hold."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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
    ("sk_wait", RetKind.SIGNED, True),
]


def simkern_funcs() -> list[TracedFunc]:
    """The functions of simkern.c as the tracer is given them (id = index in SIMKERN_FUNCS)."""
    return [TracedFunc(i, name, 0, kind, entry) for i, (name, kind, entry) in enumerate(SIMKERN_FUNCS)]


def walk(calls: list[Call]) -> Iterator[Call]:
    """Every call of the trees, depth first, parents before children."""
    for c in calls:
        yield c
        yield from walk(c.children)


def drive(tracer: Any, lib: Any, calls: list[tuple[str, int]], on_record: Callable[[Any], object]) -> None:
    """Load and attach `tracer`, make simkern's `calls` (function name, argument), and read the ring buffer until it
    is empty: what every native capture test does before it reads the tracer's counters."""
    tracer.load()
    tracer.attach(strict=True)
    tracer.open_ring_buffer(on_record)
    for fn, arg in calls:
        getattr(lib, fn)(arg)
    while tracer.poll(50):
        pass

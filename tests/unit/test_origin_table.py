"""`trace`'s table of error origins at stop (issue 46 point 3): count, errno, origin, entry, share; --json the same."""

from __future__ import annotations

import io
import json
import os
import signal
import threading

import pytest

from retsnoop_otel.capture.model import OriginCount, RetKind, TracedFunc
from retsnoop_otel.render.origin_table import origin_rows, origin_table, origins_json
from retsnoop_otel.trace.main import run_trace
from tests.fakes import FakeTracer, World

FUNCS = [TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
         TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False),
         TracedFunc(2, "map_lookup_elem", 0, RetKind.INT32, False)]


def test_rows_largest_first_with_their_share_and_probe_sets_summed() -> None:
    rows = origin_rows([(FUNCS, [OriginCount(0, 1, "EINVAL", 5), OriginCount(0, 2, "EBADF", 2)]),
                        (FUNCS, [OriginCount(0, 1, "EINVAL", 1), OriginCount(0, 2, "EPERM", 0)])])
    assert origin_table(rows) == (
        "ERROR ORIGINS (8 failing sessions, counted in the kernel):\n"
        "COUNT  ERRNO   ORIGIN                 ENTRY          SHARE\n"
        "    6  EINVAL  array_map_alloc_check  __x64_sys_bpf  75.0%\n"
        "    2  EBADF   map_lookup_elem        __x64_sys_bpf  25.0%\n")
    assert origins_json(rows) == {"origins": [
        {"count": 6, "error": "EINVAL", "origin": "array_map_alloc_check", "entry": "__x64_sys_bpf", "share": 0.75},
        {"count": 2, "error": "EBADF", "origin": "map_lookup_elem", "entry": "__x64_sys_bpf", "share": 0.25}]}
    assert origin_table(origin_rows([])) == ""


def _trace(argv: list[str], world: World) -> str:
    out = io.StringIO()
    old = signal.getsignal(signal.SIGTERM)
    stopper = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    stopper.start()
    try:
        assert run_trace(argv, out, io.StringIO(), world.deps()) == 0
    finally:
        stopper.cancel()
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return out.getvalue()


@pytest.fixture
def origins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel counted 3 failing sessions that started in array_map_alloc_check (none printed)."""
    monkeypatch.setattr(FakeTracer, "origin_counts", lambda self: [
        OriginCount(self.fid("__x64_sys_bpf"), self.fid("array_map_alloc_check"), "EINVAL", 3)])


def test_trace_prints_the_origins_at_stop(world: World, origins: None) -> None:
    out = _trace(["-e", "*sys_bpf", "-a", "array_map_alloc_check"], world)
    assert "Detaching... DONE in" in out
    assert out.endswith("ERROR ORIGINS (3 failing sessions, counted in the kernel):\n"
                        "COUNT  ERRNO   ORIGIN                 ENTRY           SHARE\n"
                        "    3  EINVAL  array_map_alloc_check  __x64_sys_bpf  100.0%\n"), out


def test_trace_json_prints_them_as_one_object(world: World, origins: None) -> None:
    last = _trace(["-e", "*sys_bpf", "-a", "array_map_alloc_check", "--json"], world).splitlines()[-1]
    assert json.loads(last) == {"origins": [{"count": 3, "error": "EINVAL", "origin": "array_map_alloc_check",
                                             "entry": "__x64_sys_bpf", "share": 1.0}]}


def test_no_table_when_nothing_failed(world: World) -> None:
    assert "ERROR ORIGINS" not in _trace(["-e", "*sys_bpf", "-a", "array_map_alloc_check"], world)

"""Another build of retsnoop.bpf.c goes in through the runtime's tracer factory (RuntimeDeps), as benches pass it."""

from __future__ import annotations

from pathlib import Path

import pytest

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import tracer
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.runtime.probe_set import real_tracer_factory, tracer_factory


class Opened(Exception):
    pass


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    paths: list[str] = []

    def open_file(path: str) -> None:
        paths.append(path)
        raise Opened

    monkeypatch.setattr(lb, "num_possible_cpus", lambda: 2)
    monkeypatch.setattr(lb.BpfObject, "open_file", staticmethod(open_file))
    monkeypatch.setattr(tracer, "bpf_object_path", lambda: Path("/pkg/bpf/retsnoop.bpf.o"))
    return paths


FUNCS = [TracedFunc(0, "map_create", 0xFFFFFFFF81000000, RetKind.INT32, True)]


def test_the_factory_loads_the_object_it_was_given_and_the_package_s_by_default(opened: list[str]) -> None:
    for factory in (tracer_factory(Path("/tmp/base.bpf.o")), real_tracer_factory):
        t = factory(FUNCS, CaptureConfig(mode="kprobe_multi"), None)
        with pytest.raises(Opened):
            t._load_object()  # type: ignore[attr-defined]
    assert opened == ["/tmp/base.bpf.o", "/pkg/bpf/retsnoop.bpf.o"]


def test_the_trace_command_runs_with_the_deps_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/harness.py BASE_LAUNCH: `trace` through cli.main, with another object in its RuntimeDeps."""
    from retsnoop_otel import cli
    from retsnoop_otel.runtime.deps import RuntimeDeps
    from retsnoop_otel.trace import main as trace_main
    seen = []
    monkeypatch.setattr(cli.gc, "disable", lambda: None)  # as the command does: not in the tests' process
    monkeypatch.setattr(trace_main, "run_trace",
                        lambda argv, deps=None, started=None, **_streams: seen.append((argv, deps)) or 0)
    deps = RuntimeDeps(tracer_factory=tracer_factory(Path("/tmp/base.bpf.o")))
    assert cli.main(["trace", "-e", "map_create"], deps=deps) == 0
    assert seen == [(["-e", "map_create"], deps)]

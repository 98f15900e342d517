"""The kernel cache's writes wait until nothing on the way to ready needs the time: a start writes what it read once
it is ready (on a thread), a dry run or a refused start before it returns, and the read-ahead thread hands a table
to the run before writing it. The symbols are a 7 MB write: 70-130 ms under emulation, and up to 1.5 s over a busy
9p host, which a pinned first start used to spend before "Receiving data" (bench/RESULTS.md)."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from retsnoop_otel.agent.config_file import load_config
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
from retsnoop_otel.runtime.config import SymbolsConfig
from retsnoop_otel.runtime.environment import load_kernel_env
from retsnoop_otel.runtime.hooks import StartHook
from retsnoop_otel.runtime.runtime import Runtime
from retsnoop_otel.symbols.kernel_facts import load_func_types, load_symbols, read_func_types, read_symbols
from retsnoop_otel.symbols.read_ahead import TablesAhead
from tests.fakes import AGENT_CONFIG, World, make_env
from tests.kernel_roots import btf_blob, make_root


def _root(tmp_path: Path) -> Path:
    root = make_root(tmp_path)
    (root / "sys/kernel/btf").mkdir(parents=True, exist_ok=True)
    (root / "sys/kernel/btf/vmlinux").write_bytes(btf_blob())
    return root


def _stored(cache_dir: Path) -> list[str]:
    kernel = cache_dir / "kernel"
    names = [f.name for f in kernel.iterdir()] if kernel.exists() else []
    return sorted(n.split("-")[0] for n in names if n.endswith(".marshal") and not n.startswith("."))


def _wait_for(check, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_deferred_read_writes_nothing_until_its_write_runs(tmp_path: Path) -> None:
    root, cache_dir = _root(tmp_path), tmp_path / "cache"
    cache, ident = KernelCache.at(cache_dir), kernel_identity(str(root))
    later: list = []
    ksyms, _, source = load_symbols(cache, ident, str(root), later.append)
    types, cached = load_func_types(cache, ident, str(root), defer=later.append)
    assert source == "" and not cached and len(later) == 2 and _stored(cache_dir) == []
    for write in later:
        write()
    assert _stored(cache_dir) == ["btf", "symbols"]
    again = read_symbols(cache, ident, str(root))
    assert again.source == "cached" and list(again.ksyms.items()) == list(ksyms.items())
    assert read_func_types(cache, ident, str(root)).cached


def test_the_read_ahead_writes_nothing_of_what_it_hands_over(tmp_path: Path) -> None:
    """Its tables' writes go to the run with them, and from there into the run's KernelEnv (load_kernel_env), so a
    table read ahead is stored when and as one the run read itself is."""
    root, cache_dir = _root(tmp_path), tmp_path / "cache"
    ahead = TablesAhead(False, {"RETSNOOP_OTEL_CACHE": str(cache_dir)}, str(root)).start()
    env = load_kernel_env(SymbolsConfig(cache_dir=str(cache_dir)), None, root=str(root), ahead=ahead)
    ahead._thread.join()
    # this host refuses kernel tracing, so the run stops short of the symbols: BTF's types are the table here
    assert "read beside the imports" in next(p.detail for p in env.phases if p.name == "btf")
    assert _stored(cache_dir) == [] and len(env.writes) == 1
    env.write_cache()
    assert _stored(cache_dir) == ["btf"] and env.writes == []


class Order(StartHook):
    def __init__(self, events: list[str], go: bool = True) -> None:
        self.events, self.go = events, go

    def go_on(self, runtime, found) -> bool:
        return self.go

    def attached(self, runtime, sets) -> None:
        self.events.append("attached")


def _runtime(tmp_path: Path, world: World, events: list[str], fail: Exception | None = None) -> Runtime:
    """The agent's runtime for a fake kernel whose tables have one cache write to make, which says where it ran."""
    path = tmp_path / "agent.yaml"
    path.write_text(AGENT_CONFIG.format(prob=1.0))
    deps = world.deps()

    def load_env(_symbols, _vmlinux, _lbr):
        env = make_env()
        env.writes.append(lambda: events.append(f"written on {threading.current_thread().name}"))
        return env

    deps.load_env = load_env
    if fail is not None:
        def refuse(*_a, **_k):
            raise fail
        deps.tracer_factory = refuse
    return Runtime(load_config(path).runtime, deps, EventLog(io.StringIO()))


def test_a_start_writes_the_kernel_cache_once_ready_off_its_thread(tmp_path: Path, world: World) -> None:
    events: list[str] = []
    rt = _runtime(tmp_path, world, events)
    assert rt.start(Order(events)) is True
    try:
        assert _wait_for(lambda: len(events) == 2)
        assert events == ["attached", "written on kernel-cache"]
    finally:
        rt.shutdown(1.0)
    assert len(events) == 2  # once


def test_a_dry_run_writes_what_it_read_before_it_returns(tmp_path: Path, world: World) -> None:
    """`trace --dry-run` fills the kernel cache for the run that follows (bench/start_after_reboot.sh fill)."""
    events: list[str] = []
    rt = _runtime(tmp_path, world, events)
    assert rt.start(Order(events, go=False)) is False
    assert events == [f"written on {threading.current_thread().name}"]


def test_a_start_refused_after_the_kernel_phases_keeps_what_it_read(tmp_path: Path, world: World) -> None:
    events: list[str] = []
    rt = _runtime(tmp_path, world, events, fail=RuntimeError("attach refused"))
    with pytest.raises(RuntimeError):
        rt.start(Order(events))
    assert events == [f"written on {threading.current_thread().name}"]

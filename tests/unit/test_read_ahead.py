"""The symbol tables read beside a start's imports (symbols/read_ahead.py): taken only when they are this run's.

Fixture kernel roots as in test_kernel_cache.py; the thread reads them as the run's own load would.
"""

from __future__ import annotations

from pathlib import Path

from retsnoop_otel.kernel.kcache import KernelCache, cache_base, kernel_identity
from retsnoop_otel.runtime.environment import kernel_env_loader, load_kernel_env
from retsnoop_otel.symbols.kernel_facts import load_symbols, read_symbols, store_symbols
from retsnoop_otel.symbols.read_ahead import SymbolsAhead, read_ahead
from tests.kernel_roots import MODULES, make_root


def _ahead(tmp_path: Path, root: Path) -> tuple[SymbolsAhead, Path]:
    cache_dir = tmp_path / "cache"
    return SymbolsAhead(False, {"RETSNOOP_OTEL_CACHE": str(cache_dir)}, str(root)).start(), cache_dir


def test_the_tables_read_ahead_are_the_ones_read_in_place_and_nothing_is_written(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    ahead, cache_dir = _ahead(tmp_path, root)
    ident = kernel_identity(str(root))
    got = ahead.take(str(cache_dir), ident, str(root))
    assert got is not None and got.tables.source == "" and got.seconds >= 0
    assert not (cache_dir / "kernel").exists()  # the thread only reads: the run stores what it takes
    direct = read_symbols(KernelCache(None), ident, str(root))
    assert list(got.tables.ksyms.items()) == list(direct.ksyms.items())
    assert got.tables.available.state() == direct.available.state()
    assert ahead.take(str(cache_dir), ident, str(root)) is None  # once
    cache = KernelCache.at(cache_dir)
    assert store_symbols(cache, ident, got.tables, str(root))
    assert load_symbols(cache, ident, str(root))[2] == "cached"  # stored as the run's own read would have


def test_a_warm_start_takes_the_cached_tables(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    cache_dir = tmp_path / "cache"
    load_symbols(KernelCache.at(cache_dir), kernel_identity(str(root)), str(root))
    ahead, _ = _ahead(tmp_path, root)
    got = ahead.take(cache_dir, kernel_identity(str(root)), str(root))
    assert got is not None and got.tables.source == "cached" and got.tables.store is None


def test_tables_of_another_kernel_state_cache_or_root_are_not_taken(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    ahead, cache_dir = _ahead(tmp_path, root)
    before = kernel_identity(str(root))
    make_root(tmp_path, modules=MODULES + "dummy 16384 0 - Live 0xffffffffc0c00000\n")  # a module loaded meanwhile
    assert ahead.take(cache_dir, kernel_identity(str(root)), str(root)) is None
    ahead, cache_dir = _ahead(tmp_path, root)
    assert ahead.take(tmp_path / "elsewhere", kernel_identity(str(root)), str(root)) is None
    ahead, cache_dir = _ahead(tmp_path, root)
    assert ahead.take(cache_dir, before, "/") is None


def test_a_failed_read_is_left_to_the_run(tmp_path: Path) -> None:
    """The run reads again where it needs the tables, and says what failed there."""
    root = make_root(tmp_path)
    (root / "proc/kallsyms").unlink()
    ahead, cache_dir = _ahead(tmp_path, root)
    assert ahead.take(cache_dir, kernel_identity(str(root)), str(root)) is None


def test_started_for_runs_only() -> None:
    env = {"RETSNOOP_OTEL_CACHE": "/nonexistent/retsnoop-otel-test"}
    for command, args in (("trace", ["-h"]), ("trace", ["-e", "x", "--version"]), ("agent", ["--help"]),
                          ("agent", ["--check", "a.yaml"]), ("agent", ["--health", "--config", "a.yaml"]),
                          ("features", []), ("simfail", []), (None, [])):
        assert read_ahead(command, args, env) is None, (command, args)
    for command in ("trace", "agent"):
        ahead = read_ahead(command, ["--config", "a.yaml"] if command == "agent" else ["-e", "x"], env)
        assert isinstance(ahead, SymbolsAhead) and ahead.agent == (command == "agent")
        ahead._thread.join()


def test_the_agents_cache_directory_is_its_own(tmp_path: Path) -> None:
    """Without RETSNOOP_OTEL_CACHE the agent's tables are read for /var/cache's cache, trace's for the user's."""
    root = make_root(tmp_path)
    for agent, configured in ((True, "/var/cache/retsnoop-otel"), (False, None)):
        env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
        ahead = SymbolsAhead(agent, env, str(root)).start()
        got = ahead.take(cache_base(configured, env), kernel_identity(str(root)), str(root))
        assert got is not None and got.cache_dir == cache_base(configured, env)


def test_the_runs_loader_takes_the_read_ahead() -> None:
    assert kernel_env_loader(None) is load_kernel_env
    ahead = SymbolsAhead(False, {})
    loader = kernel_env_loader(ahead)
    assert loader.func is load_kernel_env and loader.keywords == {"ahead": ahead}  # type: ignore[attr-defined]

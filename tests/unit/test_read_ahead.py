"""The kernel's tables read beside a start's imports (symbols/read_ahead.py): taken only when they are this run's.

Fixture kernel roots (tests/kernel_roots.py); the thread reads them as the run's own load would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retsnoop_otel.kernel.features import detect_at_start
from retsnoop_otel.kernel.kcache import KernelCache, cache_base, kernel_identity
from retsnoop_otel.runtime.environment import kernel_env_loader, load_kernel_env
from retsnoop_otel.symbols.kernel_facts import load_func_types, load_symbols, read_func_types, read_symbols
from retsnoop_otel.symbols.read_ahead import TablesAhead, read_ahead
from tests.kernel_roots import MODULES, btf_blob, make_root


def _root(tmp_path: Path) -> Path:
    root = make_root(tmp_path)
    (root / "sys/kernel/btf").mkdir(parents=True, exist_ok=True)
    (root / "sys/kernel/btf/vmlinux").write_bytes(btf_blob())
    return root


def _ahead(tmp_path: Path, root: Path) -> tuple[TablesAhead, Path]:
    cache_dir = tmp_path / "cache"
    return TablesAhead(False, {"RETSNOOP_OTEL_CACHE": str(cache_dir)}, str(root)).start(), cache_dir


def test_the_tables_read_ahead_are_the_ones_read_in_place_and_are_stored(tmp_path: Path) -> None:
    root = _root(tmp_path)
    ahead, cache_dir = _ahead(tmp_path, root)
    ident = kernel_identity(str(root))
    types = ahead.take("types", str(cache_dir), ident, str(root))
    symbols = ahead.take("symbols", str(cache_dir), ident, str(root))
    assert types is not None and symbols is not None and types.seconds >= 0 and symbols.seconds >= 0
    assert not types.value[1] and types.value[0].func_id("f_long") == 6
    direct = read_symbols(KernelCache(None), ident, str(root))
    assert symbols.value[2] == ""
    assert list(symbols.value[0].items()) == list(direct.ksyms.items())
    assert symbols.value[1].state() == direct.available.state()
    assert ahead.take("symbols", str(cache_dir), ident, str(root)) is None  # once each
    assert ahead.take("types", str(cache_dir), ident, str(root)) is None
    cache = KernelCache.at(cache_dir)  # stored by the thread, as the run's own read would have
    assert read_symbols(cache, ident, str(root)).source == "cached" and read_func_types(cache, ident, str(root)).cached
    assert sorted(f.name for f in (cache_dir / "kernel").iterdir()) == [
        f"btf-{ident.build_id}.marshal", f"symbols-{ident.build_id}.marshal"]


def test_the_feature_probes_ahead_are_the_starts_own(tmp_path: Path) -> None:
    """Probed after BTF's types, with their function ids, as the run's own start would; stored for the next."""
    root = _root(tmp_path)
    ahead, cache_dir = _ahead(tmp_path, root)
    ident = kernel_identity(str(root))
    got = ahead.take("features", cache_dir, ident, str(root))
    assert got is not None
    feats, cached = got.value
    assert not cached
    here, _ = detect_at_start(KernelCache(None), ident, str(root), read_func_types(KernelCache(None), ident,
                                                                                   str(root)).types.func_id)
    assert feats.to_dict() == here.to_dict()
    assert ahead.take("features", cache_dir, ident, str(root)) is None


def test_no_feature_probes_ahead_without_btf_types(tmp_path: Path) -> None:
    """The probes look their targets up in BTF's types: without them the run probes, after its own BTF fallback."""
    root = make_root(tmp_path)  # no BTF
    ahead, cache_dir = _ahead(tmp_path, root)
    ident = kernel_identity(str(root))
    assert ahead.take("features", cache_dir, ident, str(root)) is None
    assert ahead.take("symbols", cache_dir, ident, str(root)) is not None


def test_a_warm_start_takes_the_cached_tables(tmp_path: Path) -> None:
    root = _root(tmp_path)
    cache, ident = KernelCache.at(tmp_path / "cache"), kernel_identity(str(root))
    load_symbols(cache, ident, str(root))
    load_func_types(cache, ident, str(root))
    ahead, cache_dir = _ahead(tmp_path, root)
    symbols = ahead.take("symbols", cache_dir, ident, str(root))
    types = ahead.take("types", cache_dir, ident, str(root))
    assert symbols is not None and symbols.value[2] == "cached"
    assert types is not None and types.value[1]


def test_tables_of_another_kernel_state_cache_or_root_are_not_taken(tmp_path: Path) -> None:
    root = _root(tmp_path)
    ahead, cache_dir = _ahead(tmp_path, root)
    before = kernel_identity(str(root))
    ahead.take("types", cache_dir, before, str(root))  # read under the identity before the module loaded
    make_root(tmp_path, modules=MODULES + "dummy 16384 0 - Live 0xffffffffc0c00000\n")  # a module loaded meanwhile
    assert ahead.take("symbols", cache_dir, kernel_identity(str(root)), str(root)) is None
    ahead, cache_dir = _ahead(tmp_path, root)
    assert ahead.take("symbols", tmp_path / "elsewhere", kernel_identity(str(root)), str(root)) is None
    ahead, cache_dir = _ahead(tmp_path, root)
    assert ahead.take("symbols", cache_dir, kernel_identity(str(root)), "/") is None
    assert ahead.take("dwarf", cache_dir, kernel_identity(str(root)), str(root)) is None


def test_a_failed_read_is_left_to_the_run(tmp_path: Path) -> None:
    """The run reads again where it needs the table, and says what failed there; the other table is still taken."""
    root = make_root(tmp_path)  # no BTF
    (root / "proc/kallsyms").unlink()
    ahead, cache_dir = _ahead(tmp_path, root)
    assert ahead.take("types", cache_dir, kernel_identity(str(root)), str(root)) is None
    assert ahead.take("symbols", cache_dir, kernel_identity(str(root)), str(root)) is None
    root = make_root(tmp_path / "second")  # no BTF, kallsyms there
    ahead, cache_dir = _ahead(tmp_path / "second", root)
    assert ahead.take("types", cache_dir, kernel_identity(str(root)), str(root)) is None
    assert ahead.take("symbols", cache_dir, kernel_identity(str(root)), str(root)) is not None


def test_a_cache_directory_the_run_refuses_is_neither_read_nor_made(tmp_path: Path) -> None:
    """RETSNOOP_OTEL_CACHE naming a file, a device or a new top-level directory: the run refuses it (exit 2), and
    the thread must not have made the directory or written into it meanwhile."""
    root = _root(tmp_path)
    (tmp_path / "file").write_text("")
    ident = kernel_identity(str(root))
    for named in (str(tmp_path / "file"), str(tmp_path / "file" / "below"), "/dev/null",
                  "/no-such-top-level-dir-48/cache"):
        ahead = TablesAhead(False, {"RETSNOOP_OTEL_CACHE": named}, str(root)).start()
        for name in ("types", "features", "symbols"):
            assert ahead.take(name, named, ident, str(root)) is None, (named, name)
    assert not Path("/no-such-top-level-dir-48").exists()
    assert (tmp_path / "file").read_text() == ""


def test_a_user_who_may_not_trace_reads_nothing_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run stops at its privilege check (runtime/environment.py check_privileges): its thread must not have
    read the tables or left a cache entry in that user's cache meanwhile. With CAP_BPF and CAP_PERFMON it reads."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for caps, read in (("0000000000000000", False), ("000000c000000000", True), (None, False)):
        root = _root(tmp_path / str(caps))
        (root / "proc/self").mkdir(parents=True)
        if caps is not None:
            (root / "proc/self/status").write_text(f"Name:\tpython3\nCapEff:\t{caps}\n")
        ahead, cache_dir = _ahead(tmp_path / str(caps), root)
        ident = kernel_identity(str(root))
        for name in ("types", "symbols"):
            assert (ahead.take(name, cache_dir, ident, str(root)) is not None) == read, (caps, name)
        assert (cache_dir / "kernel").exists() == read, caps


def test_started_for_runs_only() -> None:
    env = {"RETSNOOP_OTEL_CACHE": "/nonexistent/retsnoop-otel-test"}
    for command, args in (("trace", ["-h"]), ("trace", ["-e", "x", "--version"]), ("agent", ["--help"]),
                          ("agent", ["--check", "a.yaml"]), ("agent", ["--health", "--config", "a.yaml"]),
                          ("features", []), ("simfail", []), (None, [])):
        assert read_ahead(command, args, env, lambda: 2.0) is None, (command, args)
    for command in ("trace", "agent"):
        args = ["--config", "a.yaml"] if command == "agent" else ["-e", "x"]
        for cpus, symbols in ((2.0, True), (1.0, False), (1.5, False)):
            ahead = read_ahead(command, args, env, lambda c=cpus: c)
            assert isinstance(ahead, TablesAhead) and ahead.agent == (command == "agent"), (command, cpus)
            assert ahead.symbols == symbols, (command, cpus)  # on one CPU the run parses its symbols itself
            ahead._thread.join()


def test_on_one_cpu_only_the_types_and_the_feature_probes_are_read_ahead(tmp_path: Path) -> None:
    """What waits on the kernel (the probes) still overlaps the imports; the symbols, all CPU, are the run's."""
    root = _root(tmp_path)
    cache_dir = tmp_path / "cache"
    ahead = TablesAhead(False, {"RETSNOOP_OTEL_CACHE": str(cache_dir)}, str(root), symbols=False).start()
    ident = kernel_identity(str(root))
    assert ahead.take("types", cache_dir, ident, str(root)) is not None
    assert ahead.take("features", cache_dir, ident, str(root)) is not None
    assert ahead.take("symbols", cache_dir, ident, str(root)) is None
    assert not list(cache_dir.glob("**/symbols-*"))  # nothing of the symbols read or stored by the thread


def test_the_agents_cache_directory_is_its_own(tmp_path: Path) -> None:
    """Without RETSNOOP_OTEL_CACHE the agent's tables are read for /var/cache's cache, trace's for the user's."""
    root = _root(tmp_path)
    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    for agent, configured in ((True, "/var/cache/retsnoop-otel"), (False, None)):
        ahead = TablesAhead(agent, env, str(root)).start()
        got = ahead.take("symbols", cache_base(configured, env), kernel_identity(str(root)), str(root))
        assert got is not None and got.cache_dir == cache_base(configured, env)


def test_the_runs_loader_takes_the_read_ahead() -> None:
    assert kernel_env_loader(None) is load_kernel_env
    ahead = TablesAhead(False, {})
    loader = kernel_env_loader(ahead)
    assert loader.func is load_kernel_env and loader.keywords == {"ahead": ahead}  # type: ignore[attr-defined]

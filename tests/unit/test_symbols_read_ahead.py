"""The kernel symbols read ahead of a start on a build the cache has not seen (symbols/read_ahead.py), on fixture
kernel roots: started only then, its tables taken once and only under the identity the start finds, and what a
start does with them the same as a read of its own (the cache entry written, the next start a hit)."""

from __future__ import annotations

from pathlib import Path

from retsnoop_otel import cli
from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
from retsnoop_otel.symbols import read_ahead
from retsnoop_otel.symbols.kernel_facts import AHEAD, load_symbols
from tests.unit.test_kernel_cache import MODULES, make_root


def _env(tmp_path: Path) -> dict[str, str]:
    return {"RETSNOOP_OTEL_CACHE": str(tmp_path / "cache")}


def test_a_build_never_seen_is_read_ahead_and_the_start_takes_it(tmp_path: Path) -> None:
    root, env = str(make_root(tmp_path)), _env(tmp_path)
    cache = KernelCache.at(tmp_path / "cache")
    ahead = read_ahead.start("trace", env, root)
    assert ahead is not None
    ident = kernel_identity(root)
    ksyms, available, source = load_symbols(cache, ident, root, ahead)
    assert source == AHEAD
    plain_ksyms, plain_available, plain_source = load_symbols(KernelCache(None), ident, root)
    assert plain_source == ""
    assert list(ksyms.items()) == list(plain_ksyms.items()) and len(ksyms) > 0
    assert available.state() == plain_available.state()
    # written back as a read of its own is: the next start is a plain hit, with nothing read ahead
    assert read_ahead.start("trace", env, root) is None
    assert load_symbols(cache, ident, root)[2] == "cached"


def test_tables_read_under_another_identity_are_not_taken(tmp_path: Path) -> None:
    root_path = make_root(tmp_path)
    root = str(root_path)
    ahead = read_ahead.start("trace", _env(tmp_path), root)
    assert ahead is not None
    ahead._thread.join()
    (root_path / "proc/modules").write_text(MODULES + "dummy 16384 0 - Live 0xffffffffc0c00000\n")
    now = kernel_identity(root)
    assert ahead.take(now) is None  # a module loaded since: read again
    assert load_symbols(KernelCache(None), now, root, ahead)[2] == ""


def test_taken_once(tmp_path: Path) -> None:
    root = str(make_root(tmp_path))
    ahead = read_ahead.start("agent", _env(tmp_path), root)
    assert ahead is not None
    ident = kernel_identity(root)
    assert ahead.take(ident) is not None and ahead.take(ident) is None  # an agent's reload reads for itself


def test_a_failed_read_ahead_leaves_the_read_and_its_message_to_the_start(tmp_path: Path) -> None:
    root_path = make_root(tmp_path)
    (root_path / "proc/kallsyms").unlink()
    ahead = read_ahead.start("trace", _env(tmp_path), str(root_path))
    assert ahead is not None and ahead.take(kernel_identity(str(root_path))) is None


def test_none_where_the_cache_holds_the_build_whatever_the_boot(tmp_path: Path) -> None:
    root, env = str(make_root(tmp_path)), _env(tmp_path)
    cache = KernelCache.at(tmp_path / "cache")
    load_symbols(cache, kernel_identity(root), root)  # cached at this boot
    other_boot = str(make_root(tmp_path / "b", boot="boot-2"))
    assert read_ahead.start("trace", env, other_boot) is None  # moved or read, the start decides: no read-ahead
    # the agent's cache is another directory (/var/cache/retsnoop-otel unless the variable says otherwise)
    assert KernelCache.at(read_ahead.cache_base(read_ahead.AGENT_CACHE_DIR, {})).directory == \
        Path("/var/cache/retsnoop-otel/kernel")


def test_only_starts_that_read_symbols_read_ahead(monkeypatch, tmp_path: Path) -> None:
    started: list[str] = []
    monkeypatch.setattr(read_ahead, "start", lambda cmd: started.append(cmd))
    for cmd, rest in (("trace", ["-h"]), ("trace", ["-V"]), ("agent", ["--check", "x.yaml"]),
                      ("agent", ["--config", "x.yaml", "--health"]), ("features", []), ("simfail", []), (None, [])):
        cli._symbols_ahead(cmd, rest)
    assert started == []
    cli._symbols_ahead("trace", ["-e", "bpf_*"])
    cli._symbols_ahead("agent", ["--config=x.yaml"])
    assert started == ["trace", "agent"]

"""The kernel facts cache: keys (build, boot, modules), invalidation, and that it never gets in the way.

Fixture kernel roots are built in tmp_path from tests/fixtures/kernel_root (kallsyms and
available_filter_functions) plus the files the key is made of: /sys/kernel/notes (build-id),
/proc/sys/kernel/random/boot_id and /proc/modules.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from retsnoop_otel.kernel import kcache
from retsnoop_otel.kernel.kcache import KernelCache, cache_base, kernel_identity, modules_state
from retsnoop_otel.symbols import kernel_facts
from retsnoop_otel.symbols.kernel_facts import load_func_types, load_symbols
from retsnoop_otel.symbols.traceable import Traceable
from tests.kernel_roots import FIXTURE, MODULES, btf_blob, make_root, notes


@pytest.fixture
def cache(tmp_path: Path) -> KernelCache:
    return KernelCache(tmp_path / "cache" / "kernel")


def test_cache_directory_precedence(tmp_path: Path) -> None:
    assert cache_base("/var/cache/x", {"RETSNOOP_OTEL_CACHE": "/env"}) == Path("/env")
    assert cache_base(kcache.AGENT_CACHE_DIR, {}) == Path("/var/cache/retsnoop-otel")
    assert cache_base(None, {"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/retsnoop-otel")
    assert KernelCache.at(cache_base(None, {"RETSNOOP_OTEL_CACHE": str(tmp_path)})).directory == tmp_path / "kernel"


def test_identity_reads_build_boot_and_modules(tmp_path: Path) -> None:
    ident = kernel_identity(str(make_root(tmp_path)))
    assert ident.build_id == "12" * 20 and ident.boot_id == "boot-1"
    assert ident.modules == ("kvm 1204224 Live 0xffffffffc0400000\n"
                             "nf_tables 352256 Live 0xffffffffc0a00000")
    assert ident.boot_key() and ident.build_key() and ident.boot_key() != ident.build_key()


def test_module_reference_counts_do_not_change_the_key() -> None:
    busy = MODULES.replace("kvm 1204224 1 kvm_intel,", "kvm 1204224 7 kvm_intel,kvm_amd,")
    assert modules_state(busy) == modules_state(MODULES)
    assert modules_state(MODULES.replace("Live", "Loading")) != modules_state(MODULES)


def test_no_build_id_means_no_cache(tmp_path: Path, cache: KernelCache) -> None:
    root = make_root(tmp_path)
    (root / "sys/kernel/notes").unlink()
    ident = kernel_identity(str(root))
    assert ident.build_key() is None and ident.boot_key() is None
    assert not cache.write("x", ident.boot_key(), [1])
    _, _, cached = load_symbols(cache, ident, str(root))
    _, _, cached_again = load_symbols(cache, ident, str(root))
    assert not cached and not cached_again


def test_roundtrip_and_key_mismatch(cache: KernelCache) -> None:
    assert cache.read("facts", "k1") is None
    assert cache.write("facts", "k1", {"a": [1, 2], "b": ("x", None)})
    assert cache.read("facts", "k1") == {"a": [1, 2], "b": ("x", None)}
    assert cache.read("facts", "k2") is None
    assert cache.write("facts", "k2", [3])
    assert cache.read("facts", "k1") is None and cache.read("facts", "k2") == [3]


def test_a_write_leaves_one_private_file_and_no_temporary_one(cache: KernelCache) -> None:
    assert cache.write("facts", "k1", [1]) and cache.write("facts", "k1", [2])
    (path,) = [p for p in cache.directory.rglob("*") if p.is_file()]
    assert path.name.startswith("facts") and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert cache.read("facts", "k1") == [2]


def test_corrupt_or_foreign_files_read_as_misses(cache: KernelCache) -> None:
    assert cache.write("facts", "k", [1])
    path = cache.directory / "facts.marshal"  # type: ignore[operator]
    path.write_bytes(b"\x00garbage")
    assert cache.read("facts", "k") is None
    assert cache.write("facts", "k", [1])
    path.chmod(0o666)  # writable by others: it could have been replaced
    assert cache.read("facts", "k") is None
    path.chmod(0o600)
    assert cache.read("facts", "k") == [1]
    cache.directory.chmod(0o777)  # type: ignore[union-attr]
    assert cache.read("facts", "k") is None
    assert not cache.write("facts", "k", [2])


def test_unwritable_cache_directory_is_only_slower(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = KernelCache(blocker / "kernel")
    root = make_root(tmp_path)
    ident = kernel_identity(str(root))
    assert not cache.write("facts", "k", [1]) and cache.read("facts", "k") is None
    ksyms, available, cached = load_symbols(cache, ident, str(root))
    assert len(ksyms) > 10 and len(available) > 10 and not cached


def test_read_only_cache_directory(tmp_path: Path, cache: KernelCache) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    cache.directory.mkdir(parents=True)  # type: ignore[union-attr]
    cache.directory.chmod(0o500)  # type: ignore[union-attr]
    assert not cache.write("facts", "k", [1])


def test_symbols_come_from_the_cache_while_boot_and_modules_hold(tmp_path: Path, cache: KernelCache) -> None:
    root = make_root(tmp_path)
    ident = kernel_identity(str(root))
    ksyms, available, cached = load_symbols(cache, ident, str(root))
    assert not cached
    # the kernel files are gone: a second run can only succeed from the cache
    (root / "proc/kallsyms").rename(root / "proc/kallsyms.away")
    (root / "sys/kernel/tracing/available_filter_functions").rename(root / "aff.away")
    warm, warm_available, cached = load_symbols(cache, kernel_identity(str(root)), str(root))
    assert cached == "cached" and warm_available == available
    assert [s.addr for s in warm.by_name("show_stat")] == [s.addr for s in ksyms.by_name("show_stat")]
    assert warm.lookup(0xFFFFFFFF81001010 + 0x35) == ksyms.lookup(0xFFFFFFFF81001010 + 0x35)
    # what changes without any module load is left out, cached or not: [bpf] programs, ftrace trampolines
    assert not ksyms.by_name("bpf_trampoline_6442491234") and not warm.by_name("bpf_trampoline_6442491234")
    assert not ksyms.by_name("ftrace_trampoline") and not warm.by_name("ftrace_trampoline")
    assert len(warm) == len(ksyms) == 47 - 4


@pytest.mark.parametrize("change", [
    {"modules": MODULES + "dummy 16384 0 - Live 0xffffffffc0c00000\n"},  # a module loaded
    {"modules": MODULES.splitlines(keepends=True)[0]},  # a module unloaded
    {"modules": MODULES.replace("1204224", "1208320")},  # another build of a module
    {"build_id": b"\x34" * 20},  # another kernel
])
def test_symbols_are_read_again_when_the_kernel_changes(tmp_path: Path, cache: KernelCache, change: dict) -> None:
    root = make_root(tmp_path)
    load_symbols(cache, kernel_identity(str(root)), str(root))
    root = make_root(tmp_path, **change)
    kallsyms = root / "proc/kallsyms"
    kallsyms.write_text(kallsyms.read_text() + "ffffffffc0c00000 t dummy_xmit\t[dummy]\n")
    ksyms, _, source = load_symbols(cache, kernel_identity(str(root)), str(root))
    assert source == "" and ksyms.by_name("dummy_xmit")


CORE_MOVE, KVM_MOVE, NFT_MOVE = 0x1E00000, -0x200000, 0x40000


def moved_text(text: str, core: int, mods: dict[str, int]) -> str:
    """kallsyms as another boot shows it: the kernel's text moved by `core` (KASLR), each module's by its own."""
    out = []
    for line in text.splitlines():
        addr, rest = line.split(" ", 1)
        mod = rest.partition("[")[2].rstrip("]")
        delta = mods.get(mod, 0) if mod else core
        out.append(f"{int(addr, 16) + delta:016x} {rest}")
    return "\n".join(out) + "\n"


def move_root(tmp_path: Path, core: int, kvm: int, nft: int, boot: str = "boot-2") -> Path:
    """The fixture root at another boot: kallsyms and /proc/modules moved alike."""
    modules = (MODULES.replace("0xffffffffc0400000", f"0x{0xFFFFFFFFC0400000 + kvm:x}")
               .replace("0xffffffffc0a00000", f"0x{0xFFFFFFFFC0A00000 + nft:x}"))
    root = make_root(tmp_path, boot=boot, modules=modules)
    fresh = (FIXTURE / "proc/kallsyms").read_text()
    (root / "proc/kallsyms").write_text(moved_text(fresh, core, {"kvm": kvm, "nf_tables": nft}))
    return root


def module_notes(root: Path, builds: dict[str, bytes]) -> None:
    for mod, build in builds.items():
        (root / "sys/module" / mod / "notes").mkdir(parents=True, exist_ok=True)
        (root / "sys/module" / mod / "notes/.note.gnu.build-id").write_bytes(notes(build))


def test_symbols_of_another_boot_are_moved_not_read(tmp_path: Path, cache: KernelCache) -> None:
    root = make_root(tmp_path)
    module_notes(root, {"kvm": b"\x01" * 20, "nf_tables": b"\x02" * 20})
    load_symbols(cache, kernel_identity(str(root)), str(root))
    root = move_root(tmp_path, CORE_MOVE, KVM_MOVE, NFT_MOVE)
    moved, available, source = load_symbols(cache, kernel_identity(str(root)), str(root))
    read, read_available, _ = load_symbols(KernelCache(None), kernel_identity(str(root)), str(root))
    assert source == kernel_facts.MOVED
    assert list(moved.items()) == list(read.items()) and available == read_available
    assert moved.lookup(0xFFFFFFFF81001010 + CORE_MOVE + 0x35) == read.lookup(0xFFFFFFFF81001010 + CORE_MOVE + 0x35)
    assert [s.addr for s in moved.by_name("show_stat")] == [s.addr for s in read.by_name("show_stat")]
    # stored back under this boot's key: the next start reads nothing of the kernel's tables
    (root / "proc/kallsyms").rename(root / "proc/kallsyms.away")
    (root / "sys/kernel/tracing/available_filter_functions").rename(root / "aff.away")
    again, _, source = load_symbols(cache, kernel_identity(str(root)), str(root))
    assert source == "cached" and list(again.items()) == list(read.items())


def test_a_module_reloaded_elsewhere_moves_alone(tmp_path: Path, cache: KernelCache) -> None:
    root = make_root(tmp_path)
    load_symbols(cache, kernel_identity(str(root)), str(root))
    root = move_root(tmp_path, 0, 0, 0x100000, boot="boot-1")  # nf_tables unloaded, loaded again higher up
    moved, _, source = load_symbols(cache, kernel_identity(str(root)), str(root))
    read, _, _ = load_symbols(KernelCache(None), kernel_identity(str(root)), str(root))
    assert source == kernel_facts.MOVED and list(moved.items()) == list(read.items())


@pytest.mark.parametrize("why", ["another order", "another module build", "addresses hidden", "another anchor"])
def test_symbols_are_read_again_when_moving_could_be_wrong(tmp_path: Path, cache: KernelCache, why: str) -> None:
    root = make_root(tmp_path)
    module_notes(root, {"kvm": b"\x01" * 20})
    load_symbols(cache, kernel_identity(str(root)), str(root))
    kvm = 0x800000 if why == "another order" else KVM_MOVE  # kvm loaded after nf_tables this time
    root = move_root(tmp_path, CORE_MOVE, kvm, NFT_MOVE)
    if why == "another module build":
        module_notes(root, {"kvm": b"\x03" * 20})
    if why == "addresses hidden":
        (root / "proc/modules").write_text(MODULES.replace("0xffffffffc0400000", "0x0000000000000000"))
    if why == "another anchor":  # the kernel's first text symbol is another one: do not guess
        lines = (root / "proc/kallsyms").read_text().splitlines(keepends=True)
        (root / "proc/kallsyms").write_text("".join(lines[1:]))
    ksyms, _, source = load_symbols(cache, kernel_identity(str(root)), str(root))
    read, _, _ = load_symbols(KernelCache(None), kernel_identity(str(root)), str(root))
    assert source == "" and list(ksyms.items()) == list(read.items())


def test_nothing_is_stored_when_the_kernel_changed_during_the_read(tmp_path: Path, cache: KernelCache) -> None:
    root = make_root(tmp_path)
    before = kernel_identity(str(root))
    make_root(tmp_path, modules=MODULES + "dummy 16384 0 - Live 0xffffffffc0c00000\n")
    load_symbols(cache, before, str(root))  # identity taken before a module load: what it read is newer
    _, _, cached = load_symbols(cache, before, str(root))
    assert not cached


def test_function_types_are_cached_per_kernel_build(tmp_path: Path, cache: KernelCache) -> None:
    root = make_root(tmp_path)
    (root / "sys/kernel/btf").mkdir(parents=True)
    (root / "sys/kernel/btf/vmlinux").write_bytes(btf_blob())
    types, cached = load_func_types(cache, kernel_identity(str(root)), str(root))
    assert not cached and types.func_id("f_long") == 6  # type: ignore[attr-defined]
    (root / "sys/kernel/btf/vmlinux").unlink()
    make_root(tmp_path, boot="boot-2", modules="")  # BTF is the build's: a reboot keeps it
    types, cached = load_func_types(cache, kernel_identity(str(root)), str(root))
    assert cached and types.func_id("f_int") == 3  # type: ignore[attr-defined]
    make_root(tmp_path, build_id=b"\x56" * 20)
    with pytest.raises(OSError):
        load_func_types(cache, kernel_identity(str(root)), str(root))


def test_each_table_that_cannot_be_read_is_said(tmp_path: Path, cache: KernelCache) -> None:
    """A failure of either table is said, kallsyms' first when both fail."""
    from retsnoop_otel.kernel.tracefs import TracefsError
    from retsnoop_otel.symbols.kallsyms import KallsymsError
    root = make_root(tmp_path)
    aff = root / "sys/kernel/tracing/available_filter_functions"
    aff.rename(root / "aff.away")
    with pytest.raises(TracefsError, match="available_filter_functions"):
        load_symbols(cache, kernel_identity(str(root)), str(root))
    (root / "proc/kallsyms").rename(root / "proc/kallsyms.away")
    with pytest.raises(KallsymsError, match="cannot read"):
        load_symbols(cache, kernel_identity(str(root)), str(root))
    (root / "aff.away").rename(aff)
    (root / "proc/kallsyms.away").rename(root / "proc/kallsyms")
    ksyms, available, source = load_symbols(cache, kernel_identity(str(root)), str(root))
    assert source == "" and len(ksyms) == 47 - 4 and available == Traceable.parse(aff.read_bytes())


def test_an_unreadable_traceable_list_read_beside_kallsyms_is_said(tmp_path: Path, cache: KernelCache) -> None:
    """available_filter_functions is read on a thread beside kallsyms: its refusal still reaches the caller."""
    from retsnoop_otel.kernel.tracefs import TracefsError

    root = make_root(tmp_path)
    for aff in root.rglob("available_filter_functions"):
        aff.unlink()
    with pytest.raises(TracefsError, match="available_filter_functions"):
        load_symbols(cache, kernel_identity(str(root)), str(root))
    assert not list(cache.directory.rglob("symbols-*"))  # type: ignore[union-attr]


def test_a_write_removes_what_writers_cut_short_left(tmp_path: Path, cache: KernelCache) -> None:
    """A process that ended mid-write (killed, or exited while its read-ahead thread wrote) leaves a temporary file:
    the next write of that entry removes it, not those of running processes or of other entries."""
    import subprocess
    dead = subprocess.Popen(["true"])
    assert dead.wait() == 0 and cache.directory is not None
    cache.directory.mkdir(parents=True)
    left = cache.directory / f".symbols-ab.{dead.pid}.0123456789ab"
    running = cache.directory / f".symbols-ab.{os.getppid()}.0123456789ab"
    other = cache.directory / f".btf-ab.{dead.pid}.0123456789ab"
    for f in (left, running, other):
        f.write_bytes(b"half")
    assert cache.write("symbols-ab", "key", (1, 2))
    assert not left.exists() and running.exists() and other.exists()
    assert cache.read("symbols-ab", "key") == (1, 2)

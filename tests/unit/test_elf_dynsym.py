"""The struct-based dynamic symbol lookup gives pyelftools' answers on this machine's real ELF files.

GNU-hash files (everything Debian builds), a SysV-hash library built here with gcc, the walk of .dynsym
without a hash section, and the program headers the thread-context locator keeps.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.hash import ELFHashSection, GNUHashSection
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from retsnoop_otel.appctx import thread_ctx
from retsnoop_otel.appctx.elf_dynsym import find_dynsym, read_headers, relocations

PUBLISHER = Path(__file__).resolve().parents[2] / "retsnoop_otel" / "publisher" / "libotel_thread_ctx.so"
ABSENT = "retsnoop_no_such_symbol"


def _mapped_libraries() -> list[Path]:
    """Shared objects this test process has mapped (libc, libm, Python's extension modules, ...)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if ".so" in line.split()[-1]}
    return sorted(Path(p) for p in paths if Path(p).is_file())


def _files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    libs = _mapped_libraries()
    big = [p for p in libs if p.name.startswith(("libc.so", "libm.so", "libpython", "libcrypto", "libz.so"))]
    files = [Path(sys.executable).resolve(), *big, *[p for p in libs if p not in big][:4]]
    if PUBLISHER.exists():
        files.append(PUBLISHER)
    if shutil.which("gcc"):
        src = tmp_path_factory.mktemp("sysv") / "lib.c"
        src.write_text("__thread void *otel_thread_ctx_v1;\nint visible(int x) { return x + 1; }\n"
                       "int other_one;\n")
        out = src.with_name("libsysv.so")
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--hash-style=sysv", "-o", str(out), str(src)], check=True)
        files.append(out)
    return files


@pytest.fixture(scope="module")
def elf_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _files(tmp_path_factory)


def _names(elf: ELFFile) -> list[str]:
    dynsym = next(s for s in elf.iter_sections() if isinstance(s, SymbolTableSection) and s["sh_type"] == "SHT_DYNSYM")
    syms = [s for s in dynsym.iter_symbols() if s.name]
    defined = [s.name for s in syms if s["st_shndx"] != "SHN_UNDEF"]  # what a hash table holds
    undefined = [s.name for s in syms if s["st_shndx"] == "SHN_UNDEF"]
    return [*defined[:: max(1, len(defined) // 40)], *undefined[:3], thread_ctx.SYMBOL, "malloc", ABSENT]


def _theirs(sym) -> tuple[int, str, bool] | None:
    return None if sym is None else (sym["st_value"], sym["st_info"]["type"], sym["st_shndx"] == "SHN_UNDEF")


def _ours(sym) -> tuple[int, str, bool] | None:
    types = {0: "STT_NOTYPE", 1: "STT_OBJECT", 2: "STT_FUNC", 3: "STT_SECTION", 4: "STT_FILE", 5: "STT_COMMON",
             6: "STT_TLS", 10: "STT_LOOS"}
    return None if sym is None else (sym.value, types.get(sym.info & 0xF, sym.info & 0xF), sym.shndx == 0)


def test_hash_lookups_match_pyelftools(elf_files: list[Path]) -> None:
    kinds, hits = set(), 0
    for path in elf_files:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            sections = list(elf.iter_sections())
            table = next(s for s in sections if isinstance(s, GNUHashSection | ELFHashSection))
            kinds.add(type(table).__name__)
            names = _names(elf)
            expected = {n: _theirs(table.get_symbol(n)) for n in names}
            found = read_headers(f)
            assert found is not None, path
            got = {n: _ours(find_dynsym(f, found[1], n)) for n in names}
        assert got == expected, path
        assert expected[ABSENT] is None, path
        hits += sum(v is not None for v in expected.values())
    assert hits > 100
    assert kinds == ({"GNUHashSection", "ELFHashSection"} if shutil.which("gcc") else {"GNUHashSection"})


def test_walk_without_a_hash_section_matches_pyelftools(elf_files: list[Path]) -> None:
    for path in elf_files[:3]:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynsym = next(s for s in elf.iter_sections() if isinstance(s, SymbolTableSection)
                          and s["sh_type"] == "SHT_DYNSYM")
            names = _names(elf)
            expected = {n: _theirs(next(iter(dynsym.get_symbol_by_name(n) or ()), None)) for n in names}
            found = read_headers(f)
            assert found is not None
            # the hash sections turned into SHT_NULL ones, section indices (sh_link) kept
            no_hash = [(s[0], 0, *s[2:]) if s[1] in (5, 0x6FFFFFF6) else s for s in found[1]]
            assert no_hash != found[1]
            got = {n: _ours(find_dynsym(f, no_hash, n)) for n in names}
        assert got == expected, path
        assert sum(v is not None for v in got.values()) >= 5, path  # undefined names are in .dynsym too


def test_program_headers_match_pyelftools(elf_files: list[Path]) -> None:
    for path in elf_files:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            segs = list(elf.iter_segments())
            tls = [(s["p_vaddr"], s["p_memsz"], s["p_align"]) for s in segs if s["p_type"] == "PT_TLS" and s["p_memsz"]]
            dyn = [(s["p_vaddr"], s["p_memsz"]) for s in segs if s["p_type"] == "PT_DYNAMIC"]
            f.seek(0)
            head, _ = read_headers(f) or (None, None)
        assert head is not None
        assert head.exec_type == (elf["e_type"] == "ET_EXEC")
        assert head.tls == (tls[0] if tls else None)
        assert head.loads == tuple((s["p_offset"], s["p_vaddr"]) for s in segs if s["p_type"] == "PT_LOAD")
        assert head.dynamic == (dyn[0] if dyn else None)
        assert head.interp == any(s["p_type"] == "PT_INTERP" for s in segs)


def test_relocations_match_pyelftools(elf_files: list[Path]) -> None:
    total = 0
    for path in elf_files:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynsym = next(i for i, s in enumerate(elf.iter_sections()) if s["sh_type"] == "SHT_DYNSYM")
            expected = [(r["r_offset"], r["r_info_sym"], r["r_info_type"], r["r_addend"])
                        for s in elf.iter_sections() if isinstance(s, RelocationSection) and s.is_RELA()
                        and s["sh_link"] == dynsym for r in s.iter_relocations()]
            found = read_headers(f)
            assert found is not None
            sym = find_dynsym(f, found[1], "malloc")
            got = [tuple(r) for r in relocations(f, found[1], dynsym)]
        assert got == expected, path
        assert sym is None or sym.table == dynsym, path
        total += len(got)
    assert total > 1000


def test_the_publisher_library_exports_the_tls_symbol() -> None:
    if not PUBLISHER.exists():
        pytest.skip("the publisher library is built by `make bpf`")
    with open(PUBLISHER, "rb") as f:
        info = thread_ctx._read_elf(f, thread_ctx.X86_64)
    assert info is not None and info.value is not None and info.tls is not None
    assert info.relocs  # its own TLSDESC/DTPMOD64 relocations: how static TLS is found


def test_not_an_elf_or_cut_short_is_none() -> None:
    libc = next(p for p in _mapped_libraries() if p.name.startswith("libc.so"))
    assert thread_ctx._read_elf(io.BytesIO(b"#!/bin/sh\necho hi\n"), thread_ctx.X86_64) is None
    assert thread_ctx._read_elf(io.BytesIO(libc.read_bytes()[:200]), thread_ctx.X86_64) is None
    data = libc.read_bytes()
    # the section headers are at the end
    assert thread_ctx._read_elf(io.BytesIO(data[:len(data) // 2]), thread_ctx.X86_64) is None


AARCH64_CC = "aarch64-linux-gnu-gcc"
NATIVE = Path(__file__).resolve().parents[1] / "native"


@pytest.fixture(scope="module")
def aarch64_writers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/native's writer built for aarch64 with the cross compiler (`make setup` installs it): the executable
    holding the variable (-rdynamic) and libctxlib.so (aarch64's default TLS dialect is TLSDESC)."""
    if shutil.which(AARCH64_CC) is None:
        pytest.fail(f"{AARCH64_CC} not found: run `make setup` (Debian package gcc-aarch64-linux-gnu)")
    out = tmp_path_factory.mktemp("aarch64")
    cc = [AARCH64_CC, "-O1", "-Wall"]
    subprocess.run([*cc, "-shared", "-fPIC", "-o", out / "libctxlib.so", NATIVE / "ctxlib.c"], check=True)
    subprocess.run([*cc, "-rdynamic", "-o", out / "writer_exe", NATIVE / "ctx_writer.c", "-lpthread", "-ldl"],
                   check=True)
    return out


def test_aarch64_files_are_read_with_aarch64s_relocations(aarch64_writers: Path) -> None:
    with open(aarch64_writers / "libctxlib.so", "rb") as f:
        lib = thread_ctx._read_elf(f, thread_ctx.AARCH64)
        assert thread_ctx._read_elf(f, thread_ctx.X86_64) is None  # another machine's file is not read
    assert lib is not None and lib.value is not None and lib.tls is not None
    assert {kind for kind, _, _ in lib.relocs} <= {1028, 1030, 1031} and lib.relocs, lib.relocs
    with open(aarch64_writers / "writer_exe", "rb") as f:
        exe = thread_ctx._read_elf(f, thread_ctx.AARCH64)
    assert exe is not None and exe.value is not None and exe.tls is not None and exe.interp


@pytest.mark.parametrize(("tls", "interp", "x86", "arm"), [
    ((0x1000, 8, 8), True, -8, 16),  # 8 bytes, 8-aligned: right below tp / right after the 16-byte TCB
    ((0x2000, 24, 8), True, -24, 16),
    ((0x4000, 8, 32), True, -32, 32),  # 32-aligned: the block starts at the next multiple of 32 above the TCB
    ((0x4000, 40, 64), False, -64, 64),  # statically linked: the same, from csu/libc-tls.c
])
def test_where_the_executables_block_starts(tls: tuple[int, int, int], interp: bool, x86: int, arm: int) -> None:
    """TLS variant II below the thread pointer (x86-64), variant I above the TCB (aarch64)."""
    assert thread_ctx._exe_tls_block(tls, interp, thread_ctx.X86_64) == x86
    assert thread_ctx._exe_tls_block(tls, interp, thread_ctx.AARCH64) == arm


class _Counted(io.FileIO):
    """A file that counts the bytes read from it."""

    read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self.read_bytes += len(data)
        return data


def test_a_lookup_reads_the_words_it_visits_not_the_tables() -> None:
    """Almost every file a watcher asks is answered "absent" by the GNU table's Bloom filter: whole tables read
    over 9p or NFS cost a large read each (Python's buffer is st_blksize there)."""
    libc = next(p for p in _mapped_libraries() if p.name.startswith("libc.so"))
    with _Counted(libc) as f:
        found = read_headers(f)
        assert found is not None
        headers = f.read_bytes
        assert find_dynsym(f, found[1], thread_ctx.SYMBOL) is None
        assert find_dynsym(f, found[1], ABSENT) is None
        sym = find_dynsym(f, found[1], "malloc")
        assert sym is not None and sym.shndx != 0
    tables = sum(s[5] for s in found[1] if s[1] in (5, 11, 0x6FFFFFF6))  # hash and .dynsym sections
    assert f.read_bytes - headers < 512 < tables, (f.read_bytes, headers, tables)

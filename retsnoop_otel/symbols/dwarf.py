"""DWARF: source-path globs, and file:line + inline frames (finding the vmlinux: symbols/vmlinux.py).

Symbolization goes through one long-running `llvm-symbolizer` process with an address cache;
source-path globs (`:kernel/bpf/*.c`) use an index of compile units -> functions built once per
kernel build-id (llvm-dwarfdump for CU names and ranges, the ELF symbol table for functions) and
cached on disk, so that later runs (and VM guests sharing the cache) start fast.
"""

from __future__ import annotations

import bisect
import json
import re
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from retsnoop_otel.kernel.build_id import parse_notes_build_id, running_build_id  # noqa: F401 - re-exported
from retsnoop_otel.kernel.kcache import cache_base
from retsnoop_otel.symbols.globs import glob_to_regex
from retsnoop_otel.symbols.vmlinux import DwarfError, candidate_paths, elf_build_id, find_vmlinux  # noqa: F401

# Kernel tree top-level directories: a DWARF path is cut at the first of these (build prefixes go).
_TREE_DIRS = ("arch", "block", "certs", "crypto", "drivers", "fs", "include", "init", "io_uring", "ipc",
              "kernel", "lib", "mm", "net", "rust", "samples", "scripts", "security", "sound", "tools",
              "usr", "virt")
_TREE_RE = re.compile(r"(?:^|/)((?:{})/.*)$".format("|".join(_TREE_DIRS)))


def tree_path(path: str) -> str:
    """'debian/build/build_amd64_none_amd64/kernel/bpf/syscall.c' -> 'kernel/bpf/syscall.c'."""
    m = _TREE_RE.search(path)
    return m.group(1) if m else path


def cache_dir(base: str | Path) -> Path:
    """The source indexes' directory under the run's cache directory (kcache.cache_base)."""
    return Path(base) / "dwarf"


# ---- source path index --------------------------------------------------------------------------


@dataclass
class SourceIndex:
    """compile unit (tree-relative path) -> functions whose code it holds."""

    build_id: str
    units: dict[str, list[str]]

    def match(self, glob: str) -> set[str]:
        rx = glob_to_regex(glob.lstrip(":").lstrip("/"))
        out: set[str] = set()
        for unit, funcs in self.units.items():
            if rx.fullmatch(unit):
                out.update(funcs)
        return out

    @classmethod
    def load_or_build(cls, vmlinux: str, cache: str | Path) -> SourceIndex:
        """`cache`: the run's cache directory (kcache.cache_base), as for the kernel facts."""
        build_id = elf_build_id(vmlinux) or "unknown"
        path = cache_dir(cache) / f"{build_id}.units.json"
        if path.is_file():
            data = json.loads(path.read_text())
            return cls(build_id, data["units"])
        index = cls(build_id, build_units(vmlinux))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"units": index.units}))
            tmp.replace(path)
        except OSError:
            pass  # read-only cache (a VM guest): still usable, just not saved
        return index


_CU_RE = re.compile(r"DW_TAG_compile_unit")
_RANGE_RE = re.compile(r"\[0x([0-9a-f]+), 0x([0-9a-f]+)\)")
_LOWPC_RE = re.compile(r"DW_AT_low_pc\s+\(0x([0-9a-f]+)\)")
_HIGHPC_RE = re.compile(r"DW_AT_high_pc\s+\(0x([0-9a-f]+)\)")
_NAME_RE = re.compile(r'DW_AT_name\s+\("([^"]*)"\)')


def parse_cu_dump(text: Iterable[str]) -> list[tuple[int, int, str]]:
    """(start, end, tree path) ranges from `llvm-dwarfdump --debug-info --recurse-depth=0` output."""
    ranges: list[tuple[int, int, str]] = []
    cur: list[tuple[int, int]] = []
    name: str | None = None
    low = high = None

    def flush() -> None:
        if name is None:
            return
        spans = list(cur)
        if low is not None and high is not None:
            spans.append((low, high if high > low else low + high))
        for s, e in spans:
            if e > s:
                ranges.append((s, e, tree_path(name)))

    for line in text:
        if _CU_RE.search(line):
            flush()
            cur, name, low, high = [], None, None, None
            continue
        if m := _NAME_RE.search(line):
            name = name or m.group(1)
        elif m := _LOWPC_RE.search(line):
            low = int(m.group(1), 16)
        elif m := _HIGHPC_RE.search(line):
            high = int(m.group(1), 16)
        for m in _RANGE_RE.finditer(line):
            cur.append((int(m.group(1), 16), int(m.group(2), 16)))
    flush()
    ranges.sort()
    return ranges


def build_units(vmlinux: str) -> dict[str, list[str]]:
    tool = shutil.which("llvm-dwarfdump")
    if tool is None:
        raise DwarfError("llvm-dwarfdump not found: install the Debian package 'llvm' to use ':path' globs")
    proc = subprocess.run([tool, "--debug-info", "--recurse-depth=0", vmlinux], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise DwarfError(f"llvm-dwarfdump failed on {vmlinux}: {proc.stderr.strip()[:200]}")
    ranges = parse_cu_dump(proc.stdout.splitlines())
    starts = [r[0] for r in ranges]
    units: dict[str, set[str]] = {}
    from elftools.elf.elffile import ELFFile
    with open(vmlinux, "rb") as fh:
        symtab = ELFFile(fh).get_section_by_name(".symtab")
        if symtab is None:
            raise DwarfError(f"{vmlinux} has no symbol table")
        for sym in symtab.iter_symbols():
            if sym["st_info"]["type"] != "STT_FUNC" or not sym.name:
                continue
            addr = sym["st_value"]
            i = bisect.bisect_right(starts, addr) - 1
            if i >= 0 and ranges[i][0] <= addr < ranges[i][1]:
                units.setdefault(ranges[i][2], set()).add(sym.name)
    return {unit: sorted(funcs) for unit, funcs in units.items()}


# ---- symbolization ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceFrame:
    """One (possibly inlined) frame at an address; innermost inline first as llvm reports them."""

    function: str
    file: str
    line: int


class LlvmSymbolizer:
    """One long-running llvm-symbolizer process over the vmlinux, with a cache per address."""

    def __init__(self, vmlinux: str, kaslr_offset: int, inlines: bool = True) -> None:
        tool = shutil.which("llvm-symbolizer")
        if tool is None:
            raise DwarfError("llvm-symbolizer not found: install the Debian package 'llvm' (or use -sn)")
        args = [tool, f"--obj={vmlinux}", "--output-style=JSON", "--functions=linkage"]
        args.append("--inlines" if inlines else "--no-inlines")  # llvm-symbolizer inlines by default
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._offset = kaslr_offset
        self._cache: dict[int, list[SourceFrame]] = {}
        self._lock = threading.Lock()

    def frames(self, addr: int) -> list[SourceFrame]:
        """Source frames for a runtime kernel address, innermost (deepest inline) first."""
        with self._lock:
            hit = self._cache.get(addr)
            if hit is not None:
                return hit
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(f"0x{addr - self._offset:x}\n")
            self._proc.stdin.flush()
            reply = json.loads(self._proc.stdout.readline())
            out = [SourceFrame(s.get("FunctionName", ""), tree_path(s.get("FileName", "")), int(s.get("Line", 0)))
                   for s in reply.get("Symbol", []) if s.get("FunctionName")]
            self._cache[addr] = out
            return out

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def kaslr_offset(vmlinux: str, runtime_stext: int) -> int:
    """Runtime _stext minus its link-time address: the KASLR slide to undo before symbolizing.

    Reads the raw ELF64 symbol table: pyelftools' by-name lookup builds a dict of all ~150,000 kernel
    symbols first (3.6 s here, minutes under emulation), for the one symbol needed.
    """
    from elftools.elf.elffile import ELFFile
    with open(vmlinux, "rb") as fh:
        elf = ELFFile(fh)
        symtab = elf.get_section_by_name(".symtab")
        if symtab is not None and elf.elfclass == 64 and elf.little_endian:
            strtab = elf.get_section(symtab["sh_link"]).data()
            at = strtab.find(b"\0_stext\0")
            if at >= 0:
                name = at + 1
                for st_name, _info, _other, _shndx, st_value, _size in struct.iter_unpack("<IBBHQQ", symtab.data()):
                    if st_name == name:
                        return runtime_stext - st_value
        elif symtab is not None:
            for sym in symtab.get_symbol_by_name("_stext") or []:
                return runtime_stext - sym["st_value"]
    raise DwarfError(f"{vmlinux} has no _stext symbol")


def main(argv: list[str] | None = None) -> int:
    """`python -m retsnoop_otel.symbols.dwarf index VMLINUX`: pre-build the source index (done on the host)."""
    import os
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "index":
        print("usage: python -m retsnoop_otel.symbols.dwarf index VMLINUX", file=sys.stderr)
        return 2
    index = SourceIndex.load_or_build(args[1], cache_base(None, os.environ))  # a command of its own
    print(f"{args[1]}: build-id {index.build_id}, {len(index.units)} compile units, "
          f"{sum(len(v) for v in index.units.values())} functions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""User-space stack addresses -> frames for people: ELF symbols always, DWARF file:line and inlines when present.

bpf_get_stack(BPF_F_USER_STACK) gives raw return addresses, innermost first, and the stack reaches us
milliseconds to seconds later, when the process may be gone. So `remember(pid)` snapshots the executable
mappings as soon as a process is first seen, and opens and parses each mapped ELF right then (once per
build-id: libc is parsed once for the whole host), keeping an open fd only for ELFs whose DWARF
llvm-symbolizer will read later.

ELF files are opened through /proc/PID/map_files/<range>: that is the very inode mapped, even when the path
was deleted or replaced by a package upgrade, and it works across mount namespaces (containers). It needs
CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE since 5.9); without it we fall back to /proc/PID/root/<path>, the
path resolved in the process's own root (still right for containers, not for deleted files).
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import struct
import subprocess
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile

from retsnoop_otel.capture.model import UserFrame

MAX_ELFS = 256        # parsed ELFs kept after no remembered process maps them any more
MAX_LINES = 65536     # DWARF answers cached, keyed by (ELF identity, address)
REFRESH_AFTER = 1.0   # seconds: an address outside a live process's snapshot re-reads its maps (dlopen)
_FUNC_TYPES = (2, 10)  # STT_FUNC, STT_GNU_IFUNC


class _Elf:
    """One ELF: file offset -> virtual address, sorted function symbols, and an fd for DWARF lookups."""

    __slots__ = ("key", "segments", "starts", "syms", "dwarf_fd", "__weakref__")

    def __init__(self, key: object, elf: ELFFile, debug: ELFFile | None) -> None:
        self.key = key
        self.segments = [(s["p_offset"], s["p_filesz"], s["p_vaddr"]) for s in elf.iter_segments()
                         if s["p_type"] == "PT_LOAD"]
        self.dwarf_fd: int | None = None
        src, sec = elf, elf.get_section_by_name(".symtab")
        if sec is None and debug is not None:  # a -dbgsym package's .symtab knows the static functions too
            src, sec = debug, debug.get_section_by_name(".symtab")
        if sec is None:
            src, sec = elf, elf.get_section_by_name(".dynsym")
        self.syms = elf_functions(src, sec) if sec is not None else []  # (start, size, name)
        self.starts = [r[0] for r in self.syms]

    def vaddr(self, file_off: int) -> int | None:
        """The link-time address of a file offset, through the PT_LOAD segment holding it."""
        for off, size, vaddr in self.segments:
            if off <= file_off < off + size:
                return file_off - off + vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(function, offset) or None. Sized symbols cover [start, start+size); a zero-sized one (assembly)
        runs to the next symbol, or to the end of its segment when it is the last."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        start, size, name = self.syms[i]
        if size:
            end = start + size
        elif i + 1 < len(self.syms):
            end = self.syms[i + 1][0]
        else:
            end = next((v + n for _o, n, v in self.segments if v <= start < v + n), start)
        return (name, vaddr - start) if vaddr < end else None


def function_symbols(elf: ELFFile, sec) -> Iterator[tuple[int, int, int, int, str]]:
    """(index in the table, address, size, binding, name as stored) of every defined function of a symbol table.
    A .symtab name may carry a version (`memcpy@GLIBC_2.2.5`, `f@@V2`); a .dynsym one never does (.gnu.version
    says it). Bindings: 0 local, 1 global, 2 weak.

    Reads the raw table: pyelftools' per-symbol objects cost ~10 us each, too slow for big binaries."""
    is64 = elf.elfclass == 64
    fmt = ("<" if elf.little_endian else ">") + ("IBBHQQ" if is64 else "IIIBBH")
    esize = struct.calcsize(fmt)
    data = sec.data()
    strtab = elf.get_section(sec["sh_link"]).data()
    mask = ~1 if elf["e_machine"] == "EM_ARM" else ~0  # Thumb functions have bit 0 set
    for i, ent in enumerate(struct.iter_unpack(fmt, data[:len(data) - len(data) % esize])):
        name, info, _o, shndx, value, size = ent if is64 else (ent[0], ent[3], ent[4], ent[5], ent[1], ent[2])
        if info & 0xF not in _FUNC_TYPES or shndx == 0 or value == 0 or name == 0:
            continue
        yield i, value & mask, size, info >> 4, strtab[name:strtab.find(b"\0", name)].decode(errors="replace")


def elf_functions(elf: ELFFile, sec) -> list[tuple[int, int, str]]:
    """(address, size, name) of every defined function, one name per address: global > weak > local, then a
    name without a leading '_' (a stack frame shows one name; uprobes' specs match every name, user_funcs.py)."""
    rows = []
    for _i, value, size, bind, text in function_symbols(elf, sec):
        text = text.split("@", 1)[0]  # f@@GLIBC_2.34
        rows.append((value, {1: 0, 2: 1}.get(bind, 2), text.startswith("_"), text, size))
    rows.sort()
    out: list[tuple[int, int, str]] = []
    for value, _rank, _under, text, size in rows:
        if not out or out[-1][0] != value:
            out.append((value, size, text))
    return out


def _touch(lru: OrderedDict, key: object, value: object, limit: int) -> None:
    """Insert or refresh an LRU entry, dropping the oldest beyond `limit`."""
    lru[key] = value
    lru.move_to_end(key)
    while len(lru) > limit:
        lru.popitem(last=False)


def _open_first(*names: str):
    """The first of these files that opens, or None."""
    for name in names:
        try:
            return open(name, "rb")  # the caller closes it
        except OSError:
            continue
    return None


def _build_id(elf: ELFFile) -> str | None:
    for sec in elf.iter_sections():
        if sec["sh_type"] == "SHT_NOTE":
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID" and isinstance(note["n_desc"], str):
                    return note["n_desc"]
    return None


class _Llvm:
    """One long-running llvm-symbolizer for all objects, given as /proc/<us>/fd/N paths.

    It caches every object it opens, forever and by path: when an ELF we gave it is dropped (its fd number
    may then name another file) it is marked stale and restarted before the next query."""

    def __init__(self, tool: str) -> None:
        self._tool = tool
        self._proc: subprocess.Popen | None = None
        self.stale = False

    def query(self, fd: int, vaddr: int) -> list[dict] | None:
        try:
            if self._proc is None or self.stale or self._proc.poll() is not None:
                self.close()
                self.stale = False
                args = [self._tool, "--output-style=JSON", "--inlines", "--functions=linkage", "--no-demangle"]
                self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, text=True, bufsize=1)
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(f'"/proc/{os.getpid()}/fd/{fd}" 0x{vaddr:x}\n')
            self._proc.stdin.flush()
            return json.loads(self._proc.stdout.readline()).get("Symbol", [])
        except (OSError, ValueError):  # died or garbled: no lines this time, a fresh process next time
            self.stale = True
            return None

    def forget(self, fd: int) -> None:
        os.close(fd)
        self.stale = True

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


@dataclass(slots=True)
class _Proc:
    taken: float
    starts: list[int]
    maps: list[tuple[int, int, int, str, _Elf | None]]  # (start, end, pgoff, path, elf)

    def find(self, addr: int) -> tuple[int, int, int, str, _Elf | None] | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        return self.maps[i] if i >= 0 and addr < self.maps[i][1] else None


class UserSymbolizer:
    """User stack addresses -> UserFrames, with bounded caches fit for an agent that runs for months."""

    def __init__(self, proc_root: str = "/proc", lines: bool = True, max_processes: int = 1024) -> None:
        self._root = proc_root
        tool = shutil.which("llvm-symbolizer") if lines else None
        self._llvm = _Llvm(tool) if tool else None
        self._max_procs = max_processes
        self._procs: OrderedDict[int, _Proc] = OrderedDict()
        self._elfs: OrderedDict[object, _Elf] = OrderedDict()                   # LRU: strong references
        self._live: weakref.WeakValueDictionary[object, _Elf] = weakref.WeakValueDictionary()  # any still held
        self._lines: OrderedDict[tuple[object, int], list[dict]] = OrderedDict()
        self._lock = threading.Lock()
        self.parses = 0  # ELFs parsed so far: shows the caches work

    def remember(self, pid: int) -> None:
        """Snapshot the process's executable mappings now, so its stacks resolve after it exits."""
        with self._lock:
            self._snapshot(pid)

    def frames(self, pid: int, addrs: Sequence[int]) -> list[UserFrame]:
        """One frame per address, innermost first as given, each preceded by the frames inlined there."""
        with self._lock:
            proc = self._procs.get(pid)
            if proc is not None:
                self._procs.move_to_end(pid)
            look = [a if i == 0 else a - 1 for i, a in enumerate(addrs)]  # return addresses: the call is before
            if proc is None or (any(proc.find(x) is None for x in look)
                                and time.monotonic() - proc.taken > REFRESH_AFTER):
                proc = self._snapshot(pid) or proc
            out: list[UserFrame] = []
            for a, x in zip(addrs, look, strict=True):
                out.extend(self._resolve(proc, a, x))
            return out

    def describe(self, frame: UserFrame) -> str:
        """'func+0x1a (/usr/bin/prog)', 'func+0x1a file.c:12', 'inl file.c:3 (inlined)', '0x7f..' unknown."""
        if frame.function is None:
            return f"0x{frame.addr:x}" + (f" ({frame.module})" if frame.module else "")
        name = frame.function if frame.inlined else f"{frame.function}+0x{frame.offset:x}"
        where = f"{os.path.basename(frame.file)}:{frame.line}" if frame.file else f"({frame.module})"
        return f"{name} {where}" + (" (inlined)" if frame.inlined else "")

    def close(self) -> None:
        with self._lock:
            self._procs.clear()
            self._elfs.clear()
            self._lines.clear()
            if self._llvm is not None:
                self._llvm.close()

    # ---- internals (under the lock) ------------------------------------------------------------

    def _snapshot(self, pid: int) -> _Proc | None:
        try:
            with open(f"{self._root}/{pid}/maps") as fh:
                text = fh.read()
        except OSError:
            return None  # gone (or not ours to read): keep any older snapshot
        maps = []
        for row in text.splitlines():
            parts = row.split(maxsplit=5)
            if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                continue  # anonymous, [vdso], JIT code: nothing to read symbols from
            rng, path = parts[0], parts[5]
            start, end = (int(x, 16) for x in rng.split("-"))
            maps.append((start, end, int(parts[2], 16), path, self._elf(pid, rng, path)))
        if not maps:
            return None  # a zombie (exited, not yet reaped) has no mappings: keep the snapshot it had
        maps.sort()
        proc = _Proc(time.monotonic(), [m[0] for m in maps], maps)
        _touch(self._procs, pid, proc, self._max_procs)
        return proc

    def _elf(self, pid: int, rng: str, path: str) -> _Elf | None:
        """The parsed ELF mapped at `rng`, from the caches when this inode or build-id was seen before."""
        fh = _open_first(f"{self._root}/{pid}/map_files/{rng}", f"{self._root}/{pid}/root{path}")
        if fh is None:
            return None
        try:
            st = os.fstat(fh.fileno())
            skey = ("stat", st.st_dev, st.st_ino, st.st_mtime_ns)
            elf = self._live.get(skey)
            if elf is None:
                elf = self._parse(pid, fh, skey)
            if elf is not None:
                self._live[skey] = elf
                _touch(self._elfs, elf.key, elf, MAX_ELFS)
            return elf
        except Exception:  # noqa: BLE001 - pyelftools raises many types on odd files: no symbols, no crash
            return None
        finally:
            fh.close()

    def _parse(self, pid: int, fh, skey: tuple) -> _Elf | None:
        elf = ELFFile(fh)
        bid = _build_id(elf)
        if bid is not None and (same := self._live.get(bid)) is not None:
            return same  # the same build in another container or path
        rel = f"/usr/lib/debug/.build-id/{bid[:2]}/{bid[2:]}.debug" if bid else None
        debug_fh = _open_first(f"{self._root}/{pid}/root{rel}", rel) if rel else None  # its container's, then ours
        try:
            debug = ELFFile(debug_fh) if debug_fh is not None else None
            out = _Elf(bid or skey, elf, debug)
            self.parses += 1
            dwarf = fh if elf.get_section_by_name(".debug_info") is not None else None
            if dwarf is None and debug is not None and debug.get_section_by_name(".debug_info") is not None:
                dwarf = debug_fh
            if self._llvm is not None and dwarf is not None:
                out.dwarf_fd = os.dup(dwarf.fileno())
                weakref.finalize(out, self._llvm.forget, out.dwarf_fd)
            self._live[out.key] = out
            return out
        finally:
            if debug_fh is not None:
                debug_fh.close()

    def _resolve(self, proc: _Proc | None, addr: int, look: int) -> list[UserFrame]:
        m = proc.find(look) if proc is not None and look >= 0 else None
        if m is None:
            return [UserFrame(addr, None, 0, None)]
        start, _end, pgoff, path, elf = m
        vaddr = elf.vaddr(look - start + pgoff) if elf is not None else None
        if elf is None or vaddr is None:
            return [UserFrame(addr, None, 0, path)]
        sym = elf.lookup(vaddr)
        func, off = (sym[0], sym[1] + addr - look) if sym else (None, 0)
        src = self._source(elf, vaddr)
        if not src:
            return [UserFrame(addr, func, off, path)]
        out = [UserFrame(addr, s.get("FunctionName") or None, 0, path, s.get("FileName") or None,
                         s.get("Line") or None, inlined=True) for s in src[:-1]]
        top = src[-1]
        out.append(UserFrame(addr, func or top.get("FunctionName") or None, off, path, top.get("FileName") or None,
                             top.get("Line") or None))
        return out

    def _source(self, elf: _Elf, vaddr: int) -> list[dict]:
        """llvm-symbolizer's frames at vaddr, innermost inline first; [] without DWARF."""
        if self._llvm is None or elf.dwarf_fd is None:
            return []
        key = (elf.key, vaddr)
        hit = self._lines.get(key)
        if hit is None:
            got = self._llvm.query(elf.dwarf_fd, vaddr)
            if got is None:
                return []  # not cached: the restarted process may answer next time
            hit = [s for s in got if s.get("FileName") or s.get("FunctionName")]
        _touch(self._lines, key, hit, MAX_LINES)
        return hit

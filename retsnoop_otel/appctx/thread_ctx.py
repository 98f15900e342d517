"""Where a process keeps its OTEP 4947 thread-context pointer, `otel_thread_ctx_v1` (glibc on x86-64 or aarch64).

A BPF program sees only the thread pointer (x86-64: fsbase; aarch64: TPIDR_EL0) of the thread that entered a
traced function, so user space computes, once per process, how to get from that pointer to the variable:

- defined in the executable: at a fixed distance from the thread pointer (`tp_offset`), whatever the access
  model (local-exec, initial-exec, TLSDESC or GD relaxed). x86-64 has TLS variant II, the executable's block
  right below the thread pointer; aarch64 variant I, the block above it, after the 16-byte TCB;
- defined in a shared library whose block glibc put in the static TLS area (every library linked at start, and
  a dlopen'ed one reached through TLSDESC or initial-exec): also a fixed `tp_offset`, read from the library's
  resolved TLSDESC descriptor or TPOFF64 GOT slot. This matters for a dlopen'ed TLSDESC library: glibc gives it
  optional static TLS and never fills in its DTV entry in threads that only use TLSDESC;
- otherwise through glibc's DTV: dtv = *(u64 *)(tp + 8) on x86-64, (tp + 0) on aarch64 (tcbhead_t.dtv, set
  by INSTALL_DTV to &array[1]; the BPF side knows which, bpf/vmlinux_min.h), its
  16-byte entries (dtv_t) hold at [modid] the start of the module's block in this thread, dtv[-1] the length.
  An entry is TLS_DTV_UNALLOCATED (-1), or past the length, until that thread first touched the module.

Limits: musl (another DTV layout and module numbering) is not handled. A counted module id (see _count_modid)
is wrong after a TLS library was dlclose'd or failed to load (glibc reuses the gap), with LD_AUDIT modules or
dlmopen namespaces; a library's own resolved DTPMOD64 slot, when it has one, overrides the count. Only the
first object defining the symbol in load order is considered (the one the dynamic linker binds to).
ELF files are read through /proc/PID/root/<path> (so containerised processes work), or
/proc/PID/map_files/<range> when the file was deleted or replaced; process memory through /proc/PID/mem.
"""

import os
import re
import stat
import struct
import time
from collections.abc import Callable
from typing import NamedTuple

from retsnoop_otel.appctx.deferral import CheckDeferred
from retsnoop_otel.appctx.elf_dynsym import EM_AARCH64, EM_X86_64, DynSym, find_dynsym, read_headers, relocations

SYMBOL = "otel_thread_ctx_v1"
_PAGE = os.sysconf("SC_PAGE_SIZE")
_DT_DEBUG = 21
_STT_TLS = 6
_MAX_OBJECTS = 8192  # a corrupt or cyclic r_map list must not loop for ever
_CACHE_LIMIT = 4096
_EXEC_FILES = re.compile(r"^\S+ ..x. \S+ (\S+ \S+) +(/.*)$", re.M)  # maps: (device and inode, path) of each
ABSENT_S = 60.0  # how long "none of these files defines it" answers a process with the same files (an exec'd
#                  process that loads a library later has other files; a process whose answer is stale asks again)


class TlsAbi(NamedTuple):
    """What differs between the architectures' TLS: the psABI's relocation types, and on which side of the
    thread pointer the static TLS blocks lie."""

    machine: int  # e_machine of the files to read
    dtpmod64: int
    tpoff64: int  # aarch64 calls it TLS_TPREL64
    tlsdesc: int
    above_tp: bool  # variant I (aarch64, TLS_DTV_AT_TP): blocks above the thread pointer, after the TCB


X86_64 = TlsAbi(EM_X86_64, 16, 18, 36, False)
AARCH64 = TlsAbi(EM_AARCH64, 1028, 1030, 1031, True)
_ABIS = {"x86_64": X86_64, "aarch64": AARCH64}
_TCB_SIZE = 16  # aarch64 glibc's tcbhead_t { dtv_t *dtv; void *private; }: TLS_TCB_SIZE, where variant I starts


def host_abi() -> TlsAbi | None:
    """The running machine's TLS conventions; None where the locator has none (processes are never located)."""
    return _ABIS.get(os.uname().machine)


class TlsLocation(NamedTuple):
    """Where otel_thread_ctx_v1 lives in every thread of one process (glibc). Not a dataclass: dataclasses imports
    inspect, ast and dis, 0.3-0.5 s of the first session under emulation, which a stop right after ready waited for."""

    modid: int  # 0: the variable is at thread_pointer + tp_offset; > 0: at dtv[modid].val + offset,
    tp_offset: int  # where dtv = *(u64 *)(thread_pointer + 8) and entries are 16 bytes (glibc's dtv_t)
    offset: int  # the symbol's st_value: offset inside its module's TLS block
    module: str  # path of the ELF that defines it
    how: str  # "executable" (static TLS next to the thread pointer), "static-tls" (a shared library in the
    #           static TLS area, found from its resolved relocation: also tp_offset) or "dtv" (a shared library)
    # False: a library's module id counted while its TLS relocation was not resolved yet (just dlopen'ed, no
    # access to the variable so far); a TLSDESC library may still land in static TLS, so look again later
    settled: bool = True


class ThreadCtxError(Exception):
    """One line: which process, and what of it could not be read."""


class _ElfInfo(NamedTuple):
    """What the locator needs of one ELF file; cached per file identity."""

    exec_type: bool  # ET_EXEC (loaded at its link addresses) rather than ET_DYN
    tls: tuple[int, int, int] | None  # non-empty PT_TLS: (p_vaddr, p_memsz, p_align)
    value: int | None  # st_value of a defined STT_TLS otel_thread_ctx_v1 in .dynsym
    loads: tuple[tuple[int, int], ...]  # PT_LOAD (p_offset, p_vaddr)
    dynamic: tuple[int, int] | None  # PT_DYNAMIC (p_vaddr, p_memsz)
    interp: bool  # has PT_INTERP: started by ld.so rather than statically linked
    # TLS relocations against SYMBOL or against this module's own block (symbol index 0, as -Bsymbolic or a hidden
    # alias produce): (type, r_offset, bias) where a resolved static slot holds the variable's tp offset + bias
    relocs: tuple[tuple[int, int, int], ...] = ()


class _Mapping(NamedTuple):
    start: int
    end: int
    perms: str
    offset: int
    path: str


class _Unresolved(Exception):
    """Something in the process's memory could not be followed; the caller falls back."""


def _exe_tls_block(tls: tuple[int, int, int], dynamic_linker: bool, abi: TlsAbi) -> int:
    """Where the executable's TLS block starts, relative to the thread pointer: -l_tls_offset on x86-64 (its
    block occupies [tp - l_tls_offset, tp)), +l_tls_offset on aarch64.

    aarch64 is TLS_DTV_AT_TP, variant I: elf/dl-tls.c:_dl_determine_tlsoffset starts at offset = TLS_TCB_SIZE
    and gives the first module off = roundup(offset, align), one align more when off - offset < firstbyte, then
    l_tls_offset = off - firstbyte (firstbyte = -l_tls_firstbyte_offset mod align); statically linked,
    csu/libc-tls.c puts it at roundup(TLS_INIT_TCB_SIZE, align). GNU ld's local-exec code uses the same
    (tpoff = address - tls_vma + align_up(TCB_SIZE, tls_align)). Then &var = tp + l_tls_offset + st_value.

    x86-64 is TLS_TCB_AT_TP (sysdeps/x86_64/nptl/tls.h), variant II. Dynamically linked: rtld gives the
    executable slot 0 and elf/dl-tls.c:_dl_determine_tlsoffset starts at offset 0, so
    off = roundup(0 + l_tls_blocksize - firstbyte, l_tls_align) + firstbyte, with
    firstbyte = -(p_vaddr mod p_align) mod p_align (l_tls_firstbyte_offset, dl-load.c). Statically linked:
    csu/libc-tls.c sets main_map->l_tls_offset = roundup(memsz, align ?: 1). Linkers align PT_TLS's p_vaddr, so
    firstbyte is 0 and both are round_up(p_memsz, p_align), which is also what GNU ld bakes into local-exec
    code (tpoff = address - tls_vma - BFD_ALIGN(tls_size, tls_align)). Then &var = tp - l_tls_offset +
    st_value (dl-tls.c: dest = (char *) result - map->l_tls_offset).
    """
    vaddr, memsz, align = tls
    align = max(align, 1)
    firstbyte = -(vaddr & (align - 1)) & (align - 1) if dynamic_linker else 0
    if abi.above_tp:
        off = -(-_TCB_SIZE // align) * align
        if off - _TCB_SIZE < firstbyte:
            off += align
        return off - firstbyte
    return -(-(-(memsz - firstbyte) // align) * align + firstbyte)


def _read_elf(f, abi: TlsAbi) -> _ElfInfo | None:
    """Program headers and the .dynsym entry of SYMBOL; None for a file that is not an ELF of abi's machine."""
    try:
        found = read_headers(f, abi.machine)
        if found is None:
            return None
        head, sections = found
        sym = find_dynsym(f, sections, SYMBOL)
        if sym is None or sym.info & 0xF != _STT_TLS or sym.shndx == 0:
            return _ElfInfo(head.exec_type, head.tls, None, head.loads, head.dynamic, head.interp)
        relocs = _tls_relocs(f, sections, sym, abi)
    except (OSError, ValueError, struct.error):  # unreadable or malformed: not an ELF we can use
        return None
    return _ElfInfo(head.exec_type, head.tls, sym.value, head.loads, head.dynamic, head.interp, relocs)


def _tls_relocs(f, sections: list[tuple[int, ...]], sym: DynSym, abi: TlsAbi) -> tuple[tuple[int, int, int], ...]:
    """The defining file's TLS relocations against SYMBOL, or against its own block (symbol index 0, as
    -Bsymbolic or a hidden alias produce, where r_addend is the offset inside the block)."""
    return tuple((r.type, r.offset, r.addend - (0 if r.sym else sym.value)) for r in relocations(f, sections, sym.table)
                 if r.sym in (0, sym.index) and r.type in (abi.dtpmod64, abi.tpoff64, abi.tlsdesc))


def _parse_maps(text: str) -> list[_Mapping]:
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, _, hi = parts[0].partition("-")
        out.append(_Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16), parts[5] if len(parts) > 5 else ""))
    return out


class _Process:
    """One look at one process: its maps, its memory, and the ELF files behind its mappings."""

    def __init__(self, locator: "TlsLocator", pid: int, deadline: float | None = None) -> None:
        self.locator, self.pid = locator, pid
        self.deadline, self.read_files = deadline, 0  # CheckDeferred past the deadline, once a file was read
        self.defines: bool | None = None  # whether any of its files defines SYMBOL (None: not asked)
        self.base = f"{locator.proc_root}/{pid}"
        self._mem: int | None = None
        with open(f"{self.base}/maps") as f:
            self.text = f.read()  # empty for kernel threads and zombies
        self._maps: list[_Mapping] | None = None
        self._exe: str | None = None

    @property
    def maps(self) -> list[_Mapping]:
        """Parsed at the first use: a process answered by its signature alone is never parsed."""
        if self._maps is None:
            self._maps = _parse_maps(self.text)
        return self._maps

    @property
    def exe(self) -> str:
        if self._exe is None:
            self._exe = os.readlink(f"{self.base}/exe") if self.text else ""  # " (deleted)" as in maps
        return self._exe

    def signature(self) -> frozenset[tuple[str, str]]:
        """The files of its executable mappings as maps names them (device and inode, path): what _find reads."""
        return frozenset(_EXEC_FILES.findall(self.text))

    def read(self, addr: int, size: int) -> bytes:
        if not 0 <= addr < 1 << 63:
            raise OSError(f"bad address {addr:#x}")
        if self._mem is None:
            self._mem = os.open(f"{self.base}/mem", os.O_RDONLY | os.O_CLOEXEC)
        data = os.pread(self._mem, size, addr)
        if len(data) != size:
            raise OSError(f"short read of {size} bytes at {addr:#x}")
        return data

    def close(self) -> None:
        if self._mem is not None:
            os.close(self._mem)
            self._mem = None

    def info(self, path: str) -> _ElfInfo | None:
        """The ELF behind a mapped path (through the process's root), from the cache when unchanged."""
        if path == self.exe:
            candidates = [f"{self.base}/exe"]
        else:
            candidates = [] if path.endswith(" (deleted)") else [f"{self.base}/root{path}"]
            candidates += [f"{self.base}/map_files/{m.start:x}-{m.end:x}" for m in self.maps if m.path == path][:1]
        error: OSError | None = None
        for candidate in candidates:
            try:
                st = os.stat(candidate)
                if not stat.S_ISREG(st.st_mode):  # never open a device someone mapped
                    return None
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                cache = self.locator._cache
                if key not in cache:
                    if self.read_files and self.deadline is not None and time.monotonic() > self.deadline:
                        raise CheckDeferred(self.pid)
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    with open(candidate, "rb", buffering=0) as f:  # a few small reads, not st_blksize each
                        cache[key] = _read_elf(f, self.locator.abi)
                    self.read_files += 1
                return cache[key]
            except OSError as exc:
                error = exc
        raise error or FileNotFoundError(path)

    def objects(self) -> list[str]:
        """ELF files with an executable mapping: the executable, then the others from the highest first
        mapping down. mmap hands out addresses top-down, so ld.so (mapped by the kernel) comes first and each
        library loaded later sits below the previous one: load order, as long as no hole is reused."""
        first: dict[str, int] = {}
        executable = {m.path for m in self.maps if "x" in m.perms}
        for m in self.maps:
            if m.path in executable and m.path.startswith("/") and not m.path.startswith("/memfd:"):
                first[m.path] = min(first.get(m.path, m.start), m.start)
        first.pop(self.exe, None)
        return [self.exe, *sorted(first, key=first.__getitem__, reverse=True)]

    def load_base(self, path: str, info: _ElfInfo) -> int:
        """ET_EXEC runs at its link addresses; a PIE or a library at its first mapping's start minus that
        segment's p_vaddr rounded down to a page."""
        if info.exec_type:
            return 0
        first = min((m for m in self.maps if m.path == path), default=None)
        for offset, vaddr in info.loads:
            if first is not None and offset & -_PAGE == first.offset:
                return first.start - (vaddr & -_PAGE)
        raise _Unresolved(f"the load base of {path}")

    def link_order(self, exe: _ElfInfo) -> list[str | None]:
        """Objects in the dynamic linker's load order, from r_debug.r_map (the public <link.h> part only).

        Module ids follow this order (dl-load.c assigns _dl_next_tls_modid() as each object is loaded and
        appends it to the list), except ld.so, which gets its id (if it had TLS) before any library is
        loaded (rtld.c), so it is moved right after the executable. None stands for the vDSO (no TLS).
        """
        if exe.dynamic is None:
            raise _Unresolved("no PT_DYNAMIC (static executable)")
        dyn_vaddr, dyn_size = exe.dynamic
        dynamic = self.read(self.load_base(self.exe, exe) + dyn_vaddr, dyn_size - dyn_size % 16)
        r_debug = 0
        for tag, val in struct.iter_unpack("<qQ", dynamic):
            if tag == _DT_DEBUG:
                r_debug = val
            if tag == 0:
                break
        if not r_debug:
            raise _Unresolved("DT_DEBUG is not set")
        # struct r_debug { int r_version; struct link_map *r_map; ElfW(Addr) r_brk; enum r_state; r_ldbase; }
        version, r_map, _brk, _state, ldbase = struct.unpack("<i4xQQi4xQ", self.read(r_debug, 40))
        if version < 1 or not r_map:
            raise _Unresolved("r_debug is not initialised")
        order: list[str | None] = []
        interp: list[str | None] = []
        lm, seen = r_map, set()
        while lm and lm not in seen and len(seen) < _MAX_OBJECTS:
            seen.add(lm)
            # struct link_map { ElfW(Addr) l_addr; char *l_name; ElfW(Dyn) *l_ld; l_next, l_prev; }
            l_addr, _name, l_ld, l_next = struct.unpack("<QQQQ", self.read(lm, 32))
            (interp if order and l_addr == ldbase else order).append(self._path_of(l_ld))
            lm = l_next
        return order[:1] + interp + order[1:]

    def resolved(self, path: str, info: _ElfInfo) -> tuple[str, int] | None:
        """What the dynamic linker wrote for the library's own relocations against SYMBOL, as
        ("static-tls", tp_offset) or ("dtv", modid). TPOFF64 (initial-exec GOT slot) holds st_value + addend -
        l_tls_offset; a TLSDESC descriptor {entry, arg} resolved to static TLS returns arg = the same
        (_dl_tlsdesc_return), while a dynamic one points arg at a heap object (positive, so told apart by the
        sign: static TLS lies below the thread pointer; on aarch64 it lies above it, within 4 GiB, where no heap
        object is); DTPMOD64 (GD tls_index.ti_module) holds the module id.
        The variable is then at tp + (slot - bias), or in that module's DTV entry. None: nothing resolved
        (no such relocation, lazily bound, or unreadable)."""
        try:
            base = self.load_base(path, info)
            found = None
            abi = self.locator.abi
            for kind, offset, bias in info.relocs:
                if kind == abi.dtpmod64:
                    (modid,) = struct.unpack("<Q", self.read(base + offset, 8))
                    found = found or (("dtv", modid) if 0 < modid < 1 << 20 else None)
                    continue
                word = self.read(base + offset + (8 if kind == abi.tlsdesc else 0), 8)
                (value,) = struct.unpack("<q", word)
                if (0 < value < 1 << 32) if abi.above_tp else (-(1 << 32) < value < 0):
                    return "static-tls", value - bias
            return found
        except (_Unresolved, OSError):
            return None

    def _path_of(self, l_ld: int) -> str | None:
        """The file an object was loaded from: the mapping that holds its dynamic section."""
        for m in self.maps:
            if m.start <= l_ld < m.end:
                if m.path == "[vdso]":
                    return None
                if m.path.startswith("/"):
                    return m.path
        raise _Unresolved(f"no file mapping holds l_ld {l_ld:#x}")


class TlsLocator:
    """Finds the location per process; caches per ELF file (st_dev, st_ino, st_size, st_mtime_ns) whether it
    exports the symbol, its st_value, and its PT_TLS p_memsz/p_align, so scanning many processes that share
    libraries is cheap."""

    def __init__(self, proc_root: str = "/proc", abi: TlsAbi | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root.rstrip("/") or "/"
        self.abi = abi or host_abi()
        self._cache: dict[tuple[int, int, int, int], _ElfInfo | None] = {}
        # the executable mappings of processes none of whose files define SYMBOL -> when that was found: a process
        # with the same files (the workers of one service, the shells of a host) is answered without a stat of each
        # (a stat per file and process was most of a start's check of every running process under emulation)
        self._absent: dict[frozenset[tuple[str, str]], float] = {}
        self._now = monotonic

    def locate(self, pid: int, deadline: float | None = None) -> TlsLocation | None:
        """None when no ELF of the process exports an STT_TLS otel_thread_ctx_v1 in .dynsym. CheckDeferred when
        `deadline` (time.monotonic()) passed while it read the process's files: call again to go on."""
        try:
            return self._locate(pid, deadline)
        except OSError as exc:
            if not os.path.exists(f"{self.proc_root}/{pid}"):
                raise ThreadCtxError(f"pid {pid}: the process has exited") from None
            what = f"{exc.filename}: " if exc.filename else ""
            raise ThreadCtxError(f"pid {pid}: cannot read {what}{exc.strerror or exc}") from None

    def _locate(self, pid: int, deadline: float | None) -> TlsLocation | None:
        if self.abi is None:
            return None
        proc = _Process(self, pid, deadline)
        try:
            if not proc.text:
                return None
            files, now = proc.signature(), self._now()
            if now - self._absent.get(files, -ABSENT_S) < ABSENT_S:
                return None
            found = self._find(proc)
            if found is None and proc.defines is False:
                if len(self._absent) >= _CACHE_LIMIT:
                    self._absent.clear()
                self._absent[files] = now
            return found
        finally:
            proc.close()

    def _find(self, proc: _Process) -> TlsLocation | None:
        exe = proc.info(proc.exe)
        if exe is not None and exe.value is not None and exe.tls is not None:
            assert self.abi is not None
            tp_offset = _exe_tls_block(exe.tls, exe.interp, self.abi) + exe.value
            return TlsLocation(0, tp_offset, exe.value, proc.exe, "executable")
        infos = {path: proc.info(path) for path in proc.objects()}
        proc.defines = any(i is not None and i.value is not None for i in infos.values())
        if not proc.defines:
            return None
        found = self._count_modid(proc, exe, infos)
        if found is None:
            return None
        path, info, number = found
        resolved = proc.resolved(path, info)
        how, number = resolved or ("dtv", number)
        offset = info.value or 0  # set: _count_modid returns the defining object only
        if how == "static-tls":
            return TlsLocation(0, number, offset, path, how)
        return TlsLocation(number, 0, offset, path, how, settled=resolved is not None)

    def _count_modid(self, proc: _Process, exe: _ElfInfo | None,
                     infos: dict[str, _ElfInfo | None]) -> tuple[str, _ElfInfo, int] | None:
        """The first library (in load order) that defines SYMBOL, and its TLS module id by counting."""
        # glibc numbers TLS modules in load order, counting only objects with a non-empty PT_TLS, the
        # executable first (rtld.c: "This image gets the ID one"). A library dlopen'ed later gets the next free
        # id (dl-tls.c:_dl_assign_tls_modid), which equals this count unless a TLS library was dlclose'd
        # (or failed to load) and left a gap that a later one reuses: a documented limit, like LD_AUDIT
        # modules and dlmopen namespaces, which take ids but are not on the base namespace's r_map list.
        try:
            order: list[str | None] = proc.link_order(exe) if exe is not None else []
        except (_Unresolved, OSError, struct.error):
            order = []
        if not order or not any(infos.get(p) and infos[p].value is not None for p in order if p):
            # Approximation (static executable, r_debug unreadable): the maps order of objects() above. Right for
            # libraries linked at start; a dlopen'ed library often lands in a hole above older ones, and the
            # legacy bottom-up mmap layout reverses everything.
            order = list(infos)
        modid = 0
        for path in order:
            info = None if path is None else infos[path] if path in infos else proc.info(path)
            if info is None or info.tls is None:
                continue
            modid += 1
            if info.value is not None:
                return path, info, modid
        return None

"""One dynamic symbol of an ELF file, found the way the dynamic linker finds it, and the relocations against it.

The application-context watcher asks every running process's executable and libraries whether they
export otel_thread_ctx_v1, and almost none does. Answering with pyelftools cost about 50 ms of imports
and tens of ms of parsing per file on the host (3.7 s of the first poll after start under emulation, on a
handful of processes); this reads the ELF header, the program and section headers and the three
sections a lookup needs, with struct. Only ELF64 little-endian files of the machine asked for are read (x86-64
and aarch64 are what the thread context locator supports); anything else, or a malformed file, is `None`.
"""

import struct
from typing import BinaryIO, NamedTuple

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")  # Elf64_Rela: r_offset, r_info, r_addend
EM_X86_64, EM_AARCH64 = 62, 183
_ET_EXEC = 2
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP, _PT_TLS = 1, 2, 3, 7
_SHT_RELA, _SHT_HASH, _SHT_DYNSYM, _SHT_GNU_HASH = 4, 5, 11, 0x6FFFFFF6
_MAX_TABLE = 64 << 20  # a section claiming more than this is not one we read


class ElfHeaders(NamedTuple):
    """What the thread-context locator needs of a file's layout."""

    exec_type: bool  # ET_EXEC (loaded at its link addresses) rather than ET_DYN
    tls: tuple[int, int, int] | None  # non-empty PT_TLS: (p_vaddr, p_memsz, p_align)
    loads: tuple[tuple[int, int], ...]  # PT_LOAD (p_offset, p_vaddr)
    dynamic: tuple[int, int] | None  # PT_DYNAMIC (p_vaddr, p_memsz)
    interp: bool  # has PT_INTERP


class DynSym(NamedTuple):
    table: int  # section index of the .dynsym it was found in
    index: int  # in .dynsym
    value: int
    info: int  # st_info: type in the low four bits (STT_TLS = 6)
    shndx: int  # 0: undefined


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    if size < 0 or size > _MAX_TABLE:
        raise ValueError(f"table of {size} bytes")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("file shorter than its headers say")
    return data


def read_headers(f: BinaryIO, machine: int = EM_X86_64) -> tuple[ElfHeaders, list[tuple[int, ...]]] | None:
    """The program headers' summary and the raw section headers of a little-endian ELF64 file for `machine`
    (e_machine); None otherwise."""
    f.seek(0)
    ident = f.read(_EHDR.size)
    if len(ident) < _EHDR.size or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    (_, e_type, e_machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = _EHDR.unpack(ident)
    if e_machine != machine:
        return None
    tls = dynamic = None
    loads, interp = [], False
    if phnum:
        if phentsize != _PHDR.size:
            return None
        raw = _read(f, phoff, phnum * _PHDR.size)
        for p_type, _, p_offset, p_vaddr, _, _, p_memsz, p_align in _PHDR.iter_unpack(raw):
            if p_type == _PT_TLS and p_memsz:  # dl-load.c: an empty PT_TLS gets no module id
                tls = (p_vaddr, p_memsz, p_align)
            elif p_type == _PT_LOAD:
                loads.append((p_offset, p_vaddr))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_vaddr, p_memsz)
            elif p_type == _PT_INTERP:
                interp = True
    sections: list[tuple[int, ...]] = []
    if shnum and shoff:
        if shentsize != _SHDR.size:
            return None
        sections = list(_SHDR.iter_unpack(_read(f, shoff, shnum * _SHDR.size)))
    return ElfHeaders(e_type == _ET_EXEC, tls, tuple(loads), dynamic, interp), sections


def _gnu_hash(name: bytes) -> int:
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def _sysv_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = (h << 4) + c
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def find_dynsym(f: BinaryIO, sections: list[tuple[int, ...]], name: str) -> DynSym | None:
    """`name` in the first .dynsym, through the first hash section (GNU or SysV, in section order, as
    pyelftools picks it), or by a walk of .dynsym when the file has no hash section.

    Through a hash section only the words the lookup visits are read (the GNU table's Bloom filter first, as
    ld.so does): almost every file answers "absent" from one 8-byte word, where reading its tables whole cost a
    large read per table (Python's buffer is st_blksize, 500 KiB over 9p and often 1 MiB over NFS)."""
    table_index = next((i for i, s in enumerate(sections) if s[1] == _SHT_DYNSYM), None)
    if table_index is None or not 0 <= sections[table_index][6] < len(sections):
        return None
    dynsym = sections[table_index]
    strtab = sections[dynsym[6]]
    want = name.encode()
    count = dynsym[5] // _SYM.size
    table = next((s for s in sections if s[1] in (_SHT_GNU_HASH, _SHT_HASH)), None)

    if table is None:  # no hash section: a walk of the whole table
        syms, strs = _read(f, dynsym[4], count * _SYM.size), _read(f, strtab[4], strtab[5])

        def named(i: int) -> bool:
            st_name = _SYM.unpack_from(syms, i * _SYM.size)[0]
            return strs[st_name:strs.find(b"\0", st_name)] == want
        return next((_sym(table_index, i, syms[i * _SYM.size:(i + 1) * _SYM.size])
                     for i in range(count) if named(i)), None)

    def matches(i: int) -> DynSym | None:
        if not 0 <= i < count:
            return None
        raw = _read(f, dynsym[4] + i * _SYM.size, _SYM.size)
        st_name = _SYM.unpack_from(raw)[0]
        if st_name + len(want) >= strtab[5]:
            return None
        return _sym(table_index, i, raw) if _read(f, strtab[4] + st_name, len(want) + 1) == want + b"\0" else None

    def word(index: int, fmt: str = "<I") -> int:
        size = struct.calcsize(fmt)
        if not 0 <= index <= table[5] - size:
            raise ValueError("hash table shorter than its header says")
        return struct.unpack(fmt, _read(f, table[4] + index, size))[0]

    if table[1] == _SHT_HASH:
        nbucket, nchain = struct.unpack("<II", _read(f, table[4], 8))
        if not nbucket:
            return None
        i = word(8 + 4 * (_sysv_hash(want) % nbucket))
        for _ in range(nchain):  # a chain longer than the table is corrupt
            if i == 0:
                return None
            if (hit := matches(i)) is not None:
                return hit
            i = word(8 + 4 * (nbucket + i))
        return None
    nbucket, symoffset, bloom_size, bloom_shift = struct.unpack("<4I", _read(f, table[4], 16))
    if not nbucket:
        return None
    h = _gnu_hash(want)
    if bloom_size:  # ELF64: 64-bit words; a name whose two bits are not both set is in no bucket
        bits = word(16 + 8 * (h // 64 % bloom_size), "<Q")
        mask = 1 << h % 64 | 1 << (h >> bloom_shift) % 64
        if bits & mask != mask:
            return None
    buckets = 16 + 8 * bloom_size
    chains = buckets + 4 * nbucket
    i = word(buckets + 4 * (h % nbucket))
    if i < symoffset:
        return None
    while chains + 4 * (i - symoffset) + 4 <= table[5]:
        link = word(chains + 4 * (i - symoffset))
        if (link | 1) == (h | 1) and (hit := matches(i)) is not None:
            return hit
        if link & 1:
            return None
        i += 1
    return None


def _sym(table: int, index: int, raw: bytes) -> DynSym:
    _, info, _, shndx, value, _ = _SYM.unpack(raw)
    return DynSym(table, index, value, info, shndx)


class Rela(NamedTuple):
    offset: int  # r_offset
    sym: int  # index in the symbol table; 0: none (r_addend alone locates the target)
    type: int
    addend: int


def relocations(f: BinaryIO, sections: list[tuple[int, ...]], table: int) -> list[Rela]:
    """Every SHT_RELA entry of the sections whose symbols come from section `table` (sh_link)."""
    out = []
    for sh in sections:
        if sh[1] == _SHT_RELA and sh[6] == table:
            raw = _read(f, sh[4], sh[5] - sh[5] % _RELA.size)
            out += [Rela(off, info >> 32, info & 0xFFFFFFFF, add) for off, info, add in _RELA.iter_unpack(raw)]
    return out

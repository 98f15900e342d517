"""kallsyms and the vmlinux BTF parsed by kernel_tables.c (libkernel_tables.so, built at install time), via ctypes.

A start with an empty kernel cache (the first after a boot or a kernel update) parses ~150k kallsyms lines
and ~150k BTF types. In Python that was 5-6 s of a 10 s start under emulation, and 3x retsnoop's whole
start; the C parse takes tens of milliseconds and hands back the flat columns symbols/names.py keeps.
"""

import ctypes
from array import array
from functools import cache
from pathlib import Path
from typing import NamedTuple

from retsnoop_otel.capture.model import RET_KIND_CODES, RetKind

LIBRARY = Path(__file__).resolve().parent / "libkernel_tables.so"
ABI = 4  # KT_ABI of kernel_tables.c
# the return kinds in the order of kernel_tables.c's R_* enumeration
RET_KINDS = (RetKind.VOID, RetKind.POINTER, RetKind.BOOL, RetKind.UNSIGNED, RetKind.INT32, RetKind.SIGNED,
             RetKind.UNKNOWN)


class TableError(ValueError):
    """Input the parser refuses (one sentence from kernel_tables.c)."""


class _Table(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64), ("values", ctypes.c_void_p), ("blob", ctypes.c_void_p),
        ("blob_len", ctypes.c_uint64), ("starts", ctypes.c_void_p), ("order", ctypes.c_void_p),
        ("dups", ctypes.c_void_p), ("ndups", ctypes.c_uint64), ("run_starts", ctypes.c_void_p),
        ("run_mods", ctypes.c_void_p), ("nruns", ctypes.c_uint64), ("run_mods_len", ctypes.c_uint64),
        ("error", ctypes.c_char * 200),
    ]


@cache
def library(path: Path = LIBRARY) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise RuntimeError(f"retsnoop-otel: cannot load {path} ({e}); reinstall retsnoop-otel with gcc available "
                           "(Debian package 'gcc'), or run `make bpf` in a source tree") from None
    lib.kt_abi.restype = ctypes.c_int
    lib.kt_free.argtypes = [ctypes.POINTER(_Table)]
    lib.kt_free.restype = None
    for fn in (lib.kt_kallsyms, lib.kt_btf_funcs, lib.kt_traceable, lib.kt_missing, lib.kt_find):
        fn.restype = ctypes.POINTER(_Table)
    lib.kt_kallsyms.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]
    lib.kt_btf_funcs.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p]
    lib.kt_traceable.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.kt_missing.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                               ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64]
    lib.kt_find.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
                            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64]
    lib.kt_shift.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    lib.kt_shift.restype = None
    if lib.kt_abi() != ABI:
        raise RuntimeError(f"retsnoop-otel: {path} is of another version: rebuild it (`make bpf`)")
    return lib


class NameColumn(NamedTuple):
    """symbols/names.py's state: the names blob and the array of where each begins (and the end)."""

    blob: str
    starts: bytes


class KallsymsColumns(NamedTuple):
    addrs: array  # 'Q', sorted by (address, name, module)
    names: NameColumn
    order: array  # 'I': positions sorted by (name, position)
    dups: list[int]  # indexes k of `order` whose name is that of order[k - 1]
    run_starts: list[int]  # positions where the module changes
    run_mods: list[str]  # the module from there on ('' for vmlinux)


class FuncColumns(NamedTuple):
    names: NameColumn  # sorted, each once
    packed: array  # 'Q': BTF id << 4 | RET_KIND_CODES of the return kind


def _array(typecode: str, address: int | None, count: int) -> array:
    out = array(typecode)
    if count:
        out.frombytes(ctypes.string_at(address, count * out.itemsize))
    return out


def _names(t: _Table) -> NameColumn:
    raw = ctypes.string_at(t.blob, t.blob_len)
    starts = ctypes.string_at(t.starts, (t.count + 1) * 4)
    if raw.isascii():
        return NameColumn(raw.decode("ascii"), starts)
    # a name beyond ASCII: the starts count bytes, Python's slices characters
    text = raw.decode("utf-8", "surrogateescape")
    names = text[1:-1].split("\n") if t.count else []
    at = array("I", [1])
    for name in names:
        at.append(at[-1] + len(name) + 1)
    return NameColumn(text, at.tobytes())


def _run(fn_name: str, *args: object) -> tuple[ctypes.CDLL, ctypes._Pointer]:
    lib = library()
    ptr = getattr(lib, fn_name)(*args)
    if not ptr:
        raise MemoryError(f"{fn_name}: out of memory")
    if ptr.contents.error:
        message = ptr.contents.error.decode("utf-8", "replace")
        lib.kt_free(ptr)
        raise TableError(message)
    return lib, ptr


def shift_runs(addrs: array, run_starts: list[int], deltas: list[int]) -> None:
    """Add deltas[r] to the addresses of run r (from run_starts[r] to the next run's start), in place."""
    if not addrs or not run_starts:
        return
    n = len(run_starts)
    buf = (ctypes.c_uint64 * len(addrs)).from_buffer(addrs)
    starts = (ctypes.c_uint64 * n)(*run_starts)
    moves = (ctypes.c_uint64 * n)(*(d & 0xFFFF_FFFF_FFFF_FFFF for d in deltas))
    library().kt_shift(buf, len(addrs), starts, moves, n)


def kallsyms_columns(text: bytes, stable: bool) -> KallsymsColumns:
    """Raises TableError: "no function symbols found in kallsyms", "zero addresses"."""
    lib, ptr = _run("kt_kallsyms", text, len(text), int(stable))
    try:
        t = ptr.contents
        order = _array("I", t.order, t.count)
        mods = ctypes.string_at(t.run_mods, t.run_mods_len).decode("utf-8", "surrogateescape")
        return KallsymsColumns(_array("Q", t.values, t.count), _names(t), order,
                               list(_array("I", t.dups, t.ndups)), list(_array("I", t.run_starts, t.nruns)),
                               mods.split("\n")[:-1])
    finally:
        lib.kt_free(ptr)


def btf_funcs(data: bytes) -> FuncColumns:
    """Raises TableError naming what it does not understand (an unknown kind: "unknown BTF kind K at type N")."""
    codes = bytes(RET_KIND_CODES[kind] for kind in RET_KINDS)
    lib, ptr = _run("kt_btf_funcs", data, len(data), codes)
    try:
        t = ptr.contents
        return FuncColumns(_names(t), _array("Q", t.values, t.count))
    finally:
        lib.kt_free(ptr)


def traceable_names(text: bytes) -> NameColumn:
    """available_filter_functions' names sorted, repeats kept, modules and ftrace's placeholders left out."""
    lib, ptr = _run("kt_traceable", text, len(text))
    try:
        return _names(ptr.contents)
    finally:
        lib.kt_free(ptr)


def missing(names: tuple[str, bytes], others: tuple[str, bytes], others_order: bytes) -> list[str]:
    """The distinct names of `names` (a Names state, sorted) that `others` (a Names state, sorted by
    `others_order`) lacks, sorted."""
    names, others = NameColumn._make(names), NameColumn._make(others)
    if not (names.blob.isascii() and others.blob.isascii()):  # the starts count characters: compare in Python
        have = set(others.blob[1:-1].split("\n"))
        return sorted(set(names.blob[1:-1].split("\n") if len(names.blob) > 1 else ()).difference(have))
    count, others_count = len(names.starts) // 4 - 1, len(others.starts) // 4 - 1
    lib, ptr = _run("kt_missing", names.blob.encode("ascii"), names.starts, count,
                    others.blob.encode("ascii"), others.starts, others_order, others_count)
    try:
        found = _names(ptr.contents).blob
    finally:
        lib.kt_free(ptr)
    return found[1:-1].split("\n") if len(found) > 1 else []


def find(names: tuple[str, bytes], order: bytes | None, queries: list[str]) -> list[tuple[int, int]] | None:
    """(where in `order` the first instance of each query is, how many there are) in a Names state sorted
    by `order` (None: sorted itself); None when a name is beyond ASCII (the caller searches in Python)."""
    table = NameColumn._make(names)
    blob = "\n" + "".join(q + "\n" for q in queries)
    if not (table.blob.isascii() and blob.isascii()):
        return None
    qstarts = array("I", [1])
    for q in queries:
        qstarts.append(qstarts[-1] + len(q) + 1)
    lib, ptr = _run("kt_find", table.blob.encode("ascii"), table.starts, order, len(table.starts) // 4 - 1,
                    blob.encode("ascii"), qstarts.tobytes(), len(queries))
    try:
        found = _array("Q", ptr.contents.values, 2 * len(queries))
    finally:
        lib.kt_free(ptr)
    return list(zip(found[::2], found[1::2], strict=True))

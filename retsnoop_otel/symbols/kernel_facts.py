"""kallsyms, available_filter_functions and BTF function types, read or taken from the kernel cache.

Symbols and traceable functions are keyed by the boot and the loaded modules (a module load or
unload changes both), function types by the kernel build (its BTF cannot change). What is read
fresh is stored back only if the kernel's identity did not change while it was read. After a reboot
(or a module reloaded elsewhere) the same build with the same modules has the same symbols, moved:
the kernel's by its KASLR offset (read from the head of kallsyms), each module's by its new base
(/proc/modules); those tables are moved rather than read again when each module's build-id still
matches and the moved runs keep their order.
"""

import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from retsnoop_otel.kernel.build_id import module_build_id
from retsnoop_otel.kernel.kcache import KernelCache, KernelIdentity, kernel_identity
from retsnoop_otel.symbols.btf_index import BtfFormatError, FuncTypes
from retsnoop_otel.symbols.kallsyms import Kallsyms, head_symbols
from retsnoop_otel.symbols.traceable import Traceable


class SymbolTables(NamedTuple):
    """kallsyms and available_filter_functions as one read gave them, and what to store of them."""

    ksyms: Kallsyms
    available: Traceable
    source: str  # "" read, "cached", or MOVED: cached at another boot, or before a module was reloaded elsewhere
    store: tuple | None  # the cache's payload when the cache should hold them (read, or moved), else None


def load_symbols(cache: KernelCache, ident: KernelIdentity, root: str = "/") -> tuple[Kallsyms, Traceable, str]:
    """(kallsyms, available_filter_functions, where both came from: "" read, "cached", or MOVED: cached at
    another boot, or before a module was reloaded elsewhere, and moved to where the kernel and modules are now)."""
    tables = read_symbols(cache, ident, root)
    store_symbols(cache, ident, tables, root)
    return tables.ksyms, tables.available, tables.source


def read_symbols(cache: KernelCache, ident: KernelIdentity, root: str = "/") -> SymbolTables:
    """The tables from the cache, or from the kernel; nothing written (store_symbols does: this may run on a
    thread of a process that exits before it is done, symbols/read_ahead.py)."""
    name = f"symbols-{ident.build_id}"
    key = ident.boot_key()
    stored = cache.read_keyed(name) if key is not None else None
    if stored is not None:
        tables = _cached_tables(stored, key, ident, root)  # type: ignore[arg-type]
        if tables is not None:
            ksyms, available, layout = tables
            if layout is None:
                return SymbolTables(ksyms, available, "cached", None)
            return SymbolTables(ksyms, available, MOVED, (ksyms.state(), available.state(), layout))
    # what comes and goes without a module load is left out whether cached or not, so that a run finds
    # the same functions either way; the tracer merges its own [bpf] symbols after attaching (fentry)
    traceable = _traceable_beside(root)
    ksyms = Kallsyms.load(root, stable=True)
    available = traceable()
    available.not_in(ksyms)  # found once here, kept with the cache
    store = (ksyms.state(), available.state(), _layout(ident, root)) if cache.directory is not None else None
    return SymbolTables(ksyms, available, "", store)


def store_symbols(cache: KernelCache, ident: KernelIdentity, tables: SymbolTables, root: str = "/") -> bool:
    """Keep what read_symbols read or moved, if the kernel's identity still is the one they were read under (a
    module loaded meanwhile may be in one table and not the other)."""
    key = ident.boot_key()
    if tables.store is None or key is None or kernel_identity(root) != ident:
        return False
    return cache.write(f"symbols-{ident.build_id}", key, tables.store)


MOVED = "cached at another boot, moved"

def _traceable_beside(root: str) -> Callable[[], Traceable]:
    """available_filter_functions read and parsed on a thread from now; the call returned joins it and
    raises what the read raised.

    Reading it and kallsyms is the kernel formatting ~250k lines under the read calls, then a C parse
    through ctypes: neither holds the GIL, so the two take the machine's two CPUs instead of adding up.
    """
    out: list[Traceable | BaseException] = []

    def read() -> None:
        try:
            out.append(Traceable.load(root))
        except BaseException as exc:  # noqa: BLE001 - raised where the table is asked for
            out.append(exc)

    thread = threading.Thread(target=read, name="kernel-tables", daemon=True)
    thread.start()

    def result() -> Traceable:
        thread.join()
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]
    return result


def _cached_tables(stored: tuple[str, object], key: str, ident: KernelIdentity, root: str
                   ) -> tuple[Kallsyms, Traceable, tuple | None] | None:
    """(the stored tables, None) under this boot's key; (moved ones, their new layout) from another."""
    payload = stored[1]
    if not (isinstance(payload, tuple) and len(payload) == 3):
        return None
    try:
        ksyms, available = Kallsyms.from_state(payload[0]), Traceable.from_state(payload[1])
    except (TypeError, ValueError):
        return None  # a payload of another shape: read the kernel instead
    if stored[0] == key:
        return ksyms, available, None
    moved = _moved(ksyms, payload[2], ident, root)
    return None if moved is None else (moved[0], available, moved[1])


def _layout(ident: KernelIdentity, root: str) -> tuple | None:
    """Where the kernel's text and each module's began when these tables were read, and what must hold for them
    to be moved to another boot: the build and modules (ident.layout_key) and each module's build-id."""
    bases, head = ident.module_bases(), head_symbols(root)
    if bases is None or not head:
        return None
    return ident.layout_key(), head[-1], {m: (base, module_build_id(m, root)) for m, base in bases.items()}


def _moved(ksyms: Kallsyms, layout: object, ident: KernelIdentity, root: str) -> tuple[Kallsyms, tuple] | None:
    """The tables of an earlier boot moved to this one, with this boot's layout; None when anything says they
    may differ."""
    if not (isinstance(layout, tuple) and len(layout) == 3) or layout[0] != ident.layout_key():
        return None
    (old_text, anchor), modules, bases, head = layout[1], layout[2], ident.module_bases(), head_symbols(root)
    if bases is None or not head or head[-1][1] != anchor or set(bases) != set(modules):
        return None
    deltas, now = {"": head[-1][0] - old_text}, {}
    for mod, base in bases.items():
        old_base, build_id = modules[mod]
        if module_build_id(mod, root) != build_id:
            return None  # rebuilt (DKMS) with the same name and size: its symbols may sit elsewhere
        deltas[mod], now[mod] = base - old_base, (base, build_id)
    moved = ksyms.moved(deltas)
    if moved is None or not all(addr in (s.addr for s in moved.by_name(n) if s.module is None) for addr, n in head):
        return None  # modules loaded in another order, or the head of kallsyms disagrees: read it whole
    return moved, (layout[0], head[-1], now)


class TypesRead(NamedTuple):
    """BTF function types as one read gave them, and what to store of them."""

    types: FuncTypes
    cached: bool
    store: object | None  # the cache's payload when the cache should hold them, else None


def load_func_types(cache: KernelCache, ident: KernelIdentity, root: str = "/",
                    fallback: Callable[[], object] | None = None) -> tuple[object, bool]:
    """(function types: FuncTypes, or `fallback()` for BTF this parser does not know; whether cached).

    Raises OSError when the kernel has no readable BTF."""
    try:
        read = read_func_types(cache, ident, root)
    except BtfFormatError:
        if fallback is None:
            raise
        return fallback(), False
    store_func_types(cache, ident, read)
    return read.types, read.cached


def read_func_types(cache: KernelCache, ident: KernelIdentity, root: str = "/") -> TypesRead:
    """From the cache, or from /sys/kernel/btf/vmlinux; nothing written (store_func_types does).

    Raises OSError when the kernel has no readable BTF, BtfFormatError for BTF this parser does not know."""
    cached = cache.read(f"btf-{ident.build_id}", ident.build_key())
    if cached is not None:
        try:
            return TypesRead(FuncTypes.from_state(cached), True, None)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass  # a payload of another shape: read the kernel instead
    types = FuncTypes.from_raw_btf(Path(root, "sys/kernel/btf/vmlinux").read_bytes())
    return TypesRead(types, False, types.state() if cache.directory is not None else None)


def store_func_types(cache: KernelCache, ident: KernelIdentity, read: TypesRead) -> bool:
    return read.store is not None and cache.write(f"btf-{ident.build_id}", ident.build_key(), read.store)

"""kallsyms, available_filter_functions and BTF function types, read or taken from the kernel cache.

Symbols and traceable functions are keyed by the boot and the loaded modules (a module load or
unload changes both), function types by the kernel build (its BTF cannot change). What is read
fresh is stored back only if the kernel's identity did not change while it was read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from retsnoop_otel.kernel.kcache import KernelCache, KernelIdentity, kernel_identity
from retsnoop_otel.symbols.btf_index import BtfFormatError, FuncTypes
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.traceable import Traceable


def load_symbols(cache: KernelCache, ident: KernelIdentity, root: str = "/") -> tuple[Kallsyms, Traceable, bool]:
    """(kallsyms, available_filter_functions, whether both came from the cache)."""
    name = f"symbols-{ident.build_id}"
    key = ident.boot_key()
    cached = cache.read(name, key)
    if isinstance(cached, tuple) and len(cached) == 2:
        try:
            return Kallsyms.from_state(cached[0]), Traceable.from_state(cached[1]), True
        except (TypeError, ValueError):
            pass  # a payload of another shape: read the kernel instead
    # what comes and goes without a module load is left out whether cached or not, so that a run finds
    # the same functions either way; the tracer merges its own [bpf] symbols after attaching (fentry)
    ksyms = Kallsyms.load(root, stable=True)
    available = Traceable.load(root)
    available.not_in(ksyms)  # found once here, kept with the cache
    if key is not None and cache.directory is not None and kernel_identity(root) == ident:
        cache.write(name, key, (ksyms.state(), available.state()))
    return ksyms, available, False


def load_func_types(cache: KernelCache, ident: KernelIdentity, root: str = "/",
                    fallback: Callable[[], object] | None = None) -> tuple[object, bool]:
    """(function types: FuncTypes, or `fallback()` for BTF this parser does not know; whether cached).

    Raises OSError when the kernel has no readable BTF."""
    name = f"btf-{ident.build_id}"
    key = ident.build_key()
    cached = cache.read(name, key)
    if cached is not None:
        try:
            return FuncTypes.from_state(cached), True  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass  # a payload of another shape: read the kernel instead
    data = Path(root, "sys/kernel/btf/vmlinux").read_bytes()
    try:
        types = FuncTypes.from_raw_btf(data)
    except BtfFormatError:
        if fallback is None:
            raise
        return fallback(), False
    cache.write(name, key, types.state())
    return types, False

"""libbpf's print hook behind print_filter.c (libprint_filter.so, built with the package), which drops libbpf's
debug messages in C: 4,699 in one load of our object, each a call into Python that needs the GIL (0.1-0.3 s of
an agent's load under emulation, where a thread imports beside it)."""

from __future__ import annotations

import ctypes
import os

from retsnoop_otel.kernel import libbpf_abi as abi

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libprint_filter.so")


def without_debug(hook: ctypes._CFuncPtr, most_verbose: int, library: str | None = None) -> ctypes._CFuncPtr:
    """What to hand libbpf_set_print(): `hook` for messages of level `most_verbose` (enum libbpf_print_level) and
    more severe; `hook` itself where the library is missing (a checkout without `make bpf`): every message then
    reaches it, only slower."""
    try:
        lib = ctypes.CDLL(library or LIBRARY)
    except OSError:
        return hook
    lib.pf_install.restype = ctypes.c_void_p
    lib.pf_install.argtypes = [abi.PRINT_FN, ctypes.c_int]
    return abi.PRINT_FN(lib.pf_install(hook, most_verbose))

"""The run's long-lived objects kept out of the garbage collector's full passes (and let go at a reload), and the
start's freed memory given back to the kernel."""

from __future__ import annotations

import ctypes
import gc


def freeze_heap() -> None:
    """The kernel tables (kallsyms, traceable functions, BTF index: about a million objects) live as long
    as the run: moved out of the collector's reach, they no longer make its full passes pause capture for
    seconds under emulation. The command line turns the collector off while it starts (cli.py)."""
    gc.freeze()
    gc.enable()
    release_free_pages()


def refreeze_heap() -> None:
    """After a reload the previous config's tables are garbage, but frozen objects are never collected:
    the cycles among them (probe sets and their callbacks) kept all of it alive, about 45 MB per SIGHUP
    at 10,000 functions (bench/agent_scale.py). One full pass frees them, then the new tables freeze."""
    gc.unfreeze()
    gc.collect()
    freeze_heap()


def release_free_pages(libc: str = "libc.so.6") -> bool:
    """glibc keeps the pages of what a start freed (libbpf's parse of the kernel's BTF at load, the tables' read
    buffers) in its heap, below what is still in use: about 7 MB of a 51 MB `trace` on 7.2. Given back, the run
    holds less, and its exit has fewer pages for the kernel to free (4-7 ms under emulation, where a stop is tens
    of ms: bench/RESULTS.md). False where the C library has no malloc_trim (musl)."""
    try:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
    except OSError:
        return False
    if trim is None:
        return False
    trim(0)
    return True

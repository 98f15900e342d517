"""What a start on a kernel build the cache has never seen must read from the kernel, read on a thread from its first
moment: the symbol tables, the BTF function index and the feature probes' answers.

Such a start (a new kernel, a new node, a wiped cache) reads and parses kallsyms and available_filter_functions
(1.0-1.8 s under emulation, most of it the kernel formatting ~10 MB of kallsyms), indexes BTF and probes the attach
types (0.5 s), in reads, parses and program loads that hold no GIL. Started before the command's own imports
(cli.run), they run on another CPU while the interpreter imports the command's modules and parses its flags, instead
of after them. Only when the cache has no entry for this build at all: a start the cache serves (this boot's entry,
or another boot's moved) reads nothing, and a read-ahead there would only take a CPU from the imports.
The symbols are handed over, and taken only if the kernel's identity (build, boot, modules) is the one the start finds
(symbols/kernel_facts.py); the BTF index and the probes' answers go to the kernel cache, where the start finds them
as a later start would. What failed here is done again by the start, which says what failed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from retsnoop_otel.kernel.build_id import running_build_id
from retsnoop_otel.kernel.kcache import AGENT_CACHE_DIR, KernelCache, cache_base

if TYPE_CHECKING:
    from retsnoop_otel.kernel.kcache import KernelIdentity
    from retsnoop_otel.symbols.kallsyms import Kallsyms
    from retsnoop_otel.symbols.traceable import Traceable

Tables = tuple["Kallsyms", "Traceable"]


class SymbolsAhead:
    """kallsyms and the traceable functions read on a daemon thread, with the kernel identity seen before; the
    BTF index and the feature probes' answers stored in `cache` after them."""

    def __init__(self, cache: KernelCache, root: str = "/") -> None:
        # imported here, on the calling thread: two threads importing modules at once could wait on each other
        from retsnoop_otel.kernel import features
        from retsnoop_otel.kernel.kcache import kernel_identity
        from retsnoop_otel.symbols.kallsyms import Kallsyms
        from retsnoop_otel.symbols.kernel_facts import load_func_types
        from retsnoop_otel.symbols.traceable import Traceable

        self._read: tuple[KernelIdentity, Tables] | None = None
        self._fetched: set[str] = set()  # the build facts read here ("btf", "features"), not found in the cache

        def read() -> None:
            try:
                ident = kernel_identity(root)
                ksyms = Kallsyms.load(root, stable=True)
                available = Traceable.load(root)
                available.not_in(ksyms)
                self._read = ident, (ksyms, available)
                types, cached = load_func_types(cache, ident, root)
                if not cached:
                    self._fetched.add("btf")
                probed = features.ProbeCache.for_build(cache, ident, root)
                features.detect(root, func_id=types.func_id, thorough=False, cache=probed)
                if not probed.hit:
                    self._fetched.add("features")
            except Exception:  # noqa: BLE001 - the start does it again and names the failure
                return

        self._thread = threading.Thread(target=read, name="symbols-ahead", daemon=True)
        self._thread.start()

    def wait(self) -> frozenset[str]:
        """Until the thread is done (before the start's first kernel phase): which build facts it read and stored
        ("btf", "features"), for the start's phases to say so rather than "cached"."""
        self._thread.join()
        return frozenset(self._fetched)

    def take(self, ident: KernelIdentity) -> Tables | None:
        """The tables, once, when they were read under `ident`; None otherwise (then the caller reads them)."""
        self._thread.join()
        read, self._read = self._read, None
        return read[1] if read is not None and read[0] == ident else None


def start(command: str, environ: Mapping[str, str] = os.environ, root: str = "/") -> SymbolsAhead | None:
    """A read-ahead for a `trace` or `agent` start whose kernel cache holds no symbols of this build; else None."""
    build_id = running_build_id(root)  # none: nothing is cached, every start reads
    cache = KernelCache.at(cache_base(AGENT_CACHE_DIR if command == "agent" else None, environ))
    return None if build_id and cache.has(f"symbols-{build_id}") else SymbolsAhead(cache, root)

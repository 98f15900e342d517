"""The kernel's symbol tables read on a thread from the first moment of a start that will have to read them.

A start on a kernel build the cache has never seen (a new kernel, a new node, a wiped cache) reads and parses
kallsyms and available_filter_functions: 1.2-1.8 s under emulation, most of it the kernel formatting ~10 MB of
kallsyms, in a read that holds no GIL, as the C parse after it does not. Started before the command's own imports
(cli.run), that read runs on another CPU while the interpreter imports the command's modules and parses its flags,
instead of after them. Only when the cache has no entry for this build at all: a start the cache serves (this boot's
entry, or another boot's moved) reads nothing, and a read-ahead there would only take a CPU from the imports.
The start takes the tables only if the kernel's identity (build, boot, modules) is the one it finds itself
(symbols/kernel_facts.py); otherwise, or when the read failed, it reads again and says what failed.
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
    """kallsyms and the traceable functions read on a daemon thread, with the kernel identity seen before."""

    def __init__(self, root: str = "/") -> None:
        # imported here, on the calling thread: two threads importing modules at once could wait on each other
        from retsnoop_otel.kernel.kcache import kernel_identity
        from retsnoop_otel.symbols.kallsyms import Kallsyms
        from retsnoop_otel.symbols.traceable import Traceable

        self._read: tuple[KernelIdentity, Tables] | None = None

        def read() -> None:
            try:
                ident = kernel_identity(root)
                ksyms = Kallsyms.load(root, stable=True)
                available = Traceable.load(root)
                available.not_in(ksyms)
            except Exception:  # noqa: BLE001 - the start reads again and names the failure
                return
            self._read = ident, (ksyms, available)

        self._thread = threading.Thread(target=read, name="symbols-ahead", daemon=True)
        self._thread.start()

    def take(self, ident: KernelIdentity) -> Tables | None:
        """The tables, once, when they were read under `ident`; None otherwise (then the caller reads them)."""
        self._thread.join()
        read, self._read = self._read, None
        return read[1] if read is not None and read[0] == ident else None


def start(command: str, environ: Mapping[str, str] = os.environ, root: str = "/") -> SymbolsAhead | None:
    """A read-ahead for a `trace` or `agent` start whose kernel cache holds no symbols of this build; else None."""
    build_id = running_build_id(root)  # none: nothing is cached, every start reads
    cache = KernelCache.at(cache_base(AGENT_CACHE_DIR if command == "agent" else None, environ))
    return None if build_id and cache.has(f"symbols-{build_id}") else SymbolsAhead(root)

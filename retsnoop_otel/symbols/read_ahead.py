"""The kernel's symbol tables read on a thread from a `trace` or `agent` command's first line, beside its imports.

On a kernel build the cache has not seen, reading kallsyms and available_filter_functions takes most of a second
under emulation (the kernel formatting text under the read calls, then a C parse through ctypes: no GIL held), and
importing the command's modules takes seconds where the package sits on slow storage (the VM's 9p, network storage,
a cold disk after a reboot), mostly waiting on file reads. Side by side, the two overlap instead of adding up. On a
warm start the thread reads the kernel cache instead, which is short.

The thread only reads: what it read is stored in the cache by the run that takes it (symbols/kernel_facts.py
store_symbols), so a run that ends early (a bad flag, --help) leaves nothing half-written. A run takes the tables
only when they were read for its cache directory and root, under the kernel identity it sees itself; otherwise, and
when the read failed, it reads them as it would have without this (and says the failure then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from retsnoop_otel.kernel.kcache import KernelIdentity
    from retsnoop_otel.symbols.kernel_facts import SymbolTables

HELP_FLAGS = frozenset(("-h", "--help", "-V", "--version"))


class AheadResult(NamedTuple):
    cache_dir: Path
    ident: KernelIdentity
    tables: SymbolTables
    seconds: float  # the read's own time, on the thread


class SymbolsAhead:
    """One read of the symbol tables on a daemon thread, taken at most once."""

    def __init__(self, agent: bool, environ: Mapping[str, str], root: str = "/") -> None:
        self.agent = agent  # the agent's cache directory is /var/cache's (kernel/kcache.py cache_base)
        self.environ = environ
        self.root = root
        self._out: list[AheadResult | None] = []
        self._taken = False
        self._thread = threading.Thread(target=self._read, name="symbols-ahead", daemon=True)

    def start(self) -> SymbolsAhead:
        self._thread.start()
        return self

    def _read(self) -> None:
        try:
            t0 = time.monotonic()
            from retsnoop_otel.kernel.kcache import AGENT_CACHE_DIR, KernelCache, cache_base, kernel_identity
            from retsnoop_otel.symbols.kernel_facts import read_symbols
            cache_dir = cache_base(AGENT_CACHE_DIR if self.agent else None, self.environ)
            ident = kernel_identity(self.root)
            tables = read_symbols(KernelCache.at(cache_dir), ident, self.root)
            self._out.append(AheadResult(cache_dir, ident, tables, time.monotonic() - t0))
        except BaseException:  # noqa: BLE001 - the run reads again where it needs the tables, and says what failed
            self._out.append(None)

    def take(self, cache_dir: str | Path, ident: KernelIdentity, root: str) -> AheadResult | None:
        """What the thread read, once it has, when it read it for this cache directory, root and kernel identity;
        None otherwise (also on every call after the first)."""
        if self._taken or root != self.root:
            return None
        self._taken = True
        self._thread.join()
        found = self._out[0] if self._out else None
        return found if found is not None and found.cache_dir == Path(cache_dir) and found.ident == ident else None


def read_ahead(command: str | None, args: list[str], environ: Mapping[str, str]) -> SymbolsAhead | None:
    """Started for a `trace` or `agent` run (not for their help, version, or the agent's --check and --health),
    in the cache directory the run will resolve (runtime/settings.py): RETSNOOP_OTEL_CACHE, else the agent's
    /var/cache, else the user's XDG cache."""
    if command not in ("trace", "agent") or HELP_FLAGS.intersection(args):
        return None
    if command == "agent" and any(a.startswith(("--check", "--health")) for a in args):
        return None  # not a run: --check reads the kernel through a run's checks of its own (agent/check.py)
    return SymbolsAhead(command == "agent", environ).start()

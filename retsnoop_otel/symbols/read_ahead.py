"""The kernel's tables read on a thread from a `trace` or `agent` command's first line, beside its imports.

On a kernel build the cache has not seen, reading BTF's function types, kallsyms and available_filter_functions
takes about a second under emulation (the kernel formatting text under the read calls, then a C parse through
ctypes: no GIL held), and the feature probes as long again on some kernels (program loads and attaches, mostly
waiting on the kernel), while importing the command's modules takes seconds where the package sits on slow storage
(the VM's 9p, network storage, a cold disk after a reboot), mostly waiting on file reads. Side by side, they overlap
instead of adding up. On a warm start the thread reads the kernel cache instead, which is short.

The thread stores what it read in the kernel cache, as the run would have (its write is then off the run's path too;
one cut short by the process's exit leaves a temporary file, which the next write of that entry removes). A run takes
a table only when it was read for its cache directory and root, under the kernel identity it sees itself; otherwise,
and when the read failed, it reads the table as it would have without this (and says the failure then). Where the
run will stop at its privilege check, or refuse its cache directory, the thread reads and writes nothing.
"""

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from retsnoop_otel.kernel.cgroups import usable_cpus

if TYPE_CHECKING:
    from retsnoop_otel.kernel.kcache import KernelCache, KernelIdentity

HELP_FLAGS = frozenset(("-h", "--help", "-V", "--version"))
TABLES = ("types", "features", "symbols")  # as the run asks for them (runtime/environment.py load_kernel_env)


class Ahead(NamedTuple):
    cache_dir: Path
    ident: "KernelIdentity"
    value: tuple  # what kernel_facts.load_func_types, features.detect_at_start or kernel_facts.load_symbols return
    seconds: float  # the read's own time, on the thread


class TablesAhead:
    """One read of each table on a daemon thread, each taken at most once."""

    def __init__(self, agent: bool, environ: Mapping[str, str], root: str = "/", symbols: bool = True) -> None:
        self.agent = agent  # the agent's cache directory is /var/cache's (kernel/kcache.py cache_base)
        self.environ = environ
        self.root = root
        self.symbols = symbols  # False: the run reads them (read_ahead: on one CPU they only take turns)
        self._read = {name: threading.Event() for name in TABLES}
        self._out: dict[str, Ahead | None] = {}
        self._taken: set[str] = set()  # by the run's thread, the only one that takes
        self._thread = threading.Thread(target=self._read_all, name="tables-ahead", daemon=True)

    def start(self) -> "TablesAhead":
        self._thread.start()
        return self

    def _read_all(self) -> None:
        """BTF's function types first (the feature probes look their targets up in them), then the feature probes
        here (mostly waiting on the kernel: program loads, attaches, grace periods) while the symbols are read on
        a thread of their own (mostly CPU: the kernel formatting kallsyms, the C parse)."""
        started: set[str] = set()
        try:
            from retsnoop_otel.kernel.kcache import (
                AGENT_CACHE_DIR,
                CACHE_VARIABLE,
                KernelCache,
                cache_base,
                cache_dir_problem,
                kernel_identity,
            )
            from retsnoop_otel.symbols import kernel_facts
            named = self.environ.get(CACHE_VARIABLE, "")
            if named and cache_dir_problem(named):
                return  # the run refuses it (runtime/settings.py): nothing is made or written there
            if not self._may_trace():
                return  # the run stops at its privilege check (runtime/environment.py): it writes no cache entry
            cache_dir = cache_base(AGENT_CACHE_DIR if self.agent else None, self.environ)
            cache, ident = KernelCache.at(cache_dir), kernel_identity(self.root)

            started.add("types")
            found = self._one("types", kernel_facts.load_func_types, cache, cache_dir, ident)  # no libbpf fallback
            if self.symbols:
                threading.Thread(target=self._one, args=("symbols", kernel_facts.load_symbols, cache, cache_dir,
                                                         ident), name="symbols-ahead", daemon=True).start()
                started.add("symbols")
            if found is not None:
                from retsnoop_otel.kernel.features import detect_at_start
                func_id = found.value[0].func_id  # type: ignore[index]
                started.add("features")
                self._one("features", lambda c, i, r: detect_at_start(c, i, r, func_id), cache, cache_dir, ident)
        except BaseException:  # noqa: BLE001, S110 - every table not read here is read by the run itself
            pass
        finally:
            for name, done in self._read.items():
                if name not in started:
                    done.set()  # never read: the run reads it

    def _may_trace(self) -> bool:
        """runtime/environment.py check_privileges' test, without its message."""
        if os.geteuid() == 0:
            return True
        from retsnoop_otel.kernel.caps import CapsError, can_trace, effective_caps
        try:
            return can_trace(effective_caps(self.root))
        except CapsError:
            return False

    def _one(self, name: str, read: Callable[["KernelCache", "KernelIdentity", str], object], cache: "KernelCache",
             cache_dir: Path, ident: "KernelIdentity") -> Ahead | None:
        t0 = time.monotonic()
        try:
            self._out[name] = Ahead(cache_dir, ident, read(cache, ident, self.root), time.monotonic() - t0)
        except BaseException:  # noqa: BLE001 - the run reads again where it needs the table, and says what failed
            self._out[name] = None
        finally:
            self._read[name].set()
        return self._out[name]

    def take(self, name: str, cache_dir: str | Path, ident: "KernelIdentity", root: str) -> Ahead | None:
        """Table `name` (TABLES) once the thread read it, when it read it for this cache directory, root and kernel
        identity; None otherwise, and on every call after the first for that table."""
        if name not in self._read or name in self._taken or root != self.root:
            return None
        self._taken.add(name)
        self._read[name].wait()
        found = self._out.get(name)
        return found if found and found.cache_dir == Path(cache_dir) and found.ident == ident else None


def read_ahead(command: str | None, args: list[str], environ: Mapping[str, str],
               cpus: Callable[[], float] | None = None) -> TablesAhead | None:
    """Started for a `trace` or `agent` run (not for their help, version, or the agent's --check and --health),
    in the cache directory the run will resolve (runtime/settings.py): RETSNOOP_OTEL_CACHE, else the agent's
    /var/cache, else the user's XDG cache. Where the process may not keep two CPUs busy (`cpus`: by default
    usable_cpus) the symbols are left to the run: their read and parse are CPU work that would only take turns
    with the imports, while the feature probes mostly wait on the kernel and still overlap them. Pinned to one CPU,
    first start with 7 functions, medians of 6 (bench/RESULTS.md): 7.2 5.26-5.46 s this way, 5.69 s with no
    thread, 5.85 s with the whole read-ahead; 6.12 5.03-5.07, 5.73 and 5.13 s."""
    if command not in ("trace", "agent") or HELP_FLAGS.intersection(args):
        return None
    if command == "agent" and any(a.startswith(("--check", "--health")) for a in args):
        return None  # not a run: --check reads the kernel through a run's checks of its own (agent/check.py)
    return TablesAhead(command == "agent", environ, symbols=(cpus or usable_cpus)() >= 2).start()

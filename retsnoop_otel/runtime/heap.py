"""The run's long-lived objects kept out of the garbage collector's full passes (and let go at a reload)."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """The kernel tables (kallsyms, traceable functions, BTF index: about a million objects) live as long
    as the run: moved out of the collector's reach, they no longer make its full passes pause capture for
    seconds under emulation. The command line turns the collector off while it starts (cli.py)."""
    gc.freeze()
    gc.enable()


def refreeze_heap() -> None:
    """After a reload the previous config's tables are garbage, but frozen objects are never collected:
    the cycles among them (probe sets and their callbacks) kept all of it alive, about 45 MB per SIGHUP
    at 10,000 functions (bench/agent_scale.py). One full pass frees them, then the new tables freeze."""
    gc.unfreeze()
    gc.collect()
    freeze_heap()

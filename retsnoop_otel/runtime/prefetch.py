"""Modules the run needs once attached, imported in a daemon thread while the BPF object loads and attaches.

Loading and attaching are long calls into libbpf and the kernel, which hold no GIL, and an import over a slow
filesystem (network storage, a cold disk, the VM's 9p) is mostly waiting on file reads: the two overlap instead of
adding up. Only after discovery, so the main thread imports little while this runs (two threads importing modules
that import each other could each wait on the other's module lock). A module that fails to import here is imported
again where it is used, which says what failed.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence


def prefetch(modules: Sequence[str]) -> threading.Thread | None:
    """Start importing `modules`, in order; None when there are none."""
    if not modules:
        return None
    thread = threading.Thread(target=_import_all, args=(tuple(modules),), name="prefetch", daemon=True)
    thread.start()
    return thread


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - its user imports it again and reports
            continue

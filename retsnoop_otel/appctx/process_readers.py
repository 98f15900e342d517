"""The readers of process state the application watcher (appctx/watch.py) goes through: where a process keeps its
thread context, its process context, a thread context's attributes, and (user stacks) its symbols. Production reads
them under a /proc root (AppSources.from_proc); tests script them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


class AppSources:
    """The readers of process state (thread_ctx, process_context, and symbols.user_symbols for user stacks)."""

    __slots__ = ("locate", "read_context", "thread_attributes", "user_symbolizer")

    def __init__(self, locate: Callable[[int], Any], read_context: Callable[[int], Any],
                 thread_attributes: Callable[[bytes, Any], dict[str, str]], user_symbolizer: Any = None) -> None:
        # (pid, deadline) -> TlsLocation | None; raises on an unreadable or exited process, and
        # thread_ctx.CheckDeferred past the deadline (time.monotonic(); None: none)
        self.locate = locate
        self.read_context = read_context  # pid -> ProcessContext | None
        self.thread_attributes = thread_attributes  # (attrs-data, key map) -> attributes
        self.user_symbolizer = user_symbolizer  # UserSymbolizer when user stacks are on

    @classmethod
    def from_proc(cls, proc_root: str, user_stacks: bool, lines: bool = True) -> AppSources:
        """The readers of `proc_root`. thread_ctx and process_context are imported at the first
        call that needs them: a run whose sessions come from no publishing process may never call them."""
        locator: Any = None  # thread_ctx.TlsLocator, built at the first locate (it caches per ELF file)

        def locate(pid: int, deadline: float | None = None) -> Any:
            nonlocal locator
            if locator is None:
                from retsnoop_otel.appctx.thread_ctx import TlsLocator
                locator = TlsLocator(proc_root)
            return locator.locate(pid, deadline)

        def read_context(pid: int) -> Any:
            from retsnoop_otel.appctx.process_context import read_process_context
            return read_process_context(pid, proc_root)

        def thread_attributes(attrs_data: bytes, key_map: Any) -> dict[str, str]:
            from retsnoop_otel.appctx.process_context import thread_attributes as attributes
            return attributes(attrs_data, key_map)

        symbolizer = None
        if user_stacks:
            from retsnoop_otel.symbols.user_symbols import UserSymbolizer
            symbolizer = UserSymbolizer(proc_root, lines=lines)
        return cls(locate, read_context, thread_attributes, symbolizer)


SourcesFactory = Callable[[str, bool, bool], AppSources]  # (proc root, user stacks, source lines)


def running(proc_root: str) -> set[int]:
    """The processes under `proc_root` now (empty when it cannot be listed)."""
    try:
        return {int(n) for n in os.listdir(proc_root) if n.isdigit()}
    except OSError:
        return set()

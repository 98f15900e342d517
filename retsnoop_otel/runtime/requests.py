"""What signals ask of the capture loop (stop, reload), kept as flags that the loop acts on between polls.

A handler only sets a flag: detaching, flushing and reloading run on the loop's own thread, never inside a
signal handler, for `trace` and the agent alike.
"""

from __future__ import annotations

import signal


class Requests:
    __slots__ = ("stop", "reload", "reload_cause")

    def __init__(self) -> None:
        self.stop = False
        self.reload = False
        self.reload_cause = ""  # what asked for the pending reload, for its log line: "SIGHUP", "file change"

    def ask_reload(self, cause: str) -> None:
        """From a signal handler or another thread (the agent's config watch): the cause first, then the flag."""
        self.reload_cause = cause
        self.reload = True

    def install(self, reload: bool) -> Requests:
        """SIGTERM and SIGINT ask for a stop; with `reload`, SIGHUP for a reload."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        if reload:
            signal.signal(signal.SIGHUP, self._reload)
        return self

    def _stop(self, _sig: int, _frame: object) -> None:
        self.stop = True

    def _reload(self, _sig: int, _frame: object) -> None:
        self.ask_reload("SIGHUP")

"""What signals ask of the capture loop (stop, reload), kept as flags that the loop acts on between polls.

A handler only sets a flag: detaching, flushing and reloading run on the loop's own thread, never inside a
signal handler, for `trace` and the agent alike. A stop signal that arrives while the loop is blocked writing to an
output whose reader stopped reading gives that output up (`interrupt_write`: the command's guarded streams',
command/streams.py), so the stop is never held up by a reader.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


class Requests:
    __slots__ = ("stop", "reload", "reload_cause", "wake_fd", "_interrupt_write")

    def __init__(self, interrupt_write: Callable[[], None] | None = None) -> None:
        """`interrupt_write`: what gives up a write blocked when a stop signal comes (GuardedStream.interrupt_write
        of the command's streams; None for streams that are not guarded)."""
        self._interrupt_write = interrupt_write
        self.stop = False
        self.reload = False
        self.reload_cause = ""  # what asked for the pending reload, for its log line: "SIGHUP", "file change"
        self.wake_fd: int | None = None  # readable once a signal came (install): the loop's wait ends on it

    def ask_reload(self, cause: str) -> None:
        """From a signal handler or another thread (the agent's config watch): the cause first, then the flag."""
        self.reload_cause = cause
        self.reload = True

    def install(self, reload: bool) -> Requests:
        """SIGTERM and SIGINT ask for a stop; SIGHUP for a reload with `reload` (the agent), else for a stop too
        (`trace`: a closed terminal detaches and flushes, as SIGTERM does; ignored under nohup, as it was at exec).
        Each signal also writes a byte to `wake_fd`'s pipe (signal.set_wakeup_fd, from whichever thread takes it), so
        a signal that lands between the loop's last look at its flags and its wait still ends that wait."""
        if self.wake_fd is None:
            read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            self.wake_fd = read_end
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        if reload:
            signal.signal(signal.SIGHUP, self._reload)
        elif signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # under nohup it stays ignored
            signal.signal(signal.SIGHUP, self._stop)
        return self

    def ask_stop(self) -> None:
        """From a signal handler or a failed output (command/streams.py): the loop stops after this poll."""
        self.stop = True

    def _stop(self, _sig: int, _frame: object) -> None:
        self.stop = True
        if self._interrupt_write is not None:
            self._interrupt_write()

    def _reload(self, _sig: int, _frame: object) -> None:
        self.ask_reload("SIGHUP")

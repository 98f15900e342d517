"""How a command ends when its own output or a signal ends it: the way Unix tools end, from every phase.

stdout and stderr are wrapped (GuardedStream) so that a write error never surfaces where the write happened (a
sink in the poll loop, argparse's message, a print): the first error is kept, later writes to that stream are
dropped, and the stream's listeners are told, so that a running trace stops through its normal stop path
(detach, then flush the other outputs). The exit code is decided once, at the end (Streams.exit_code):
- stdout's reader went away (EPIPE): quiet, 141 (128 + SIGPIPE), as `yes | head -1` ends;
- any other stdout error (ENOSPC on /dev/full, EIO): one line on stderr if it can be written, exit 1;
- a stderr error: the exit code the command had anyway (there is nowhere left to say more).
A failed stream's descriptor is pointed at /dev/null before the process exits, so that the interpreter's final
flush of what it still buffers cannot raise ("Exception ignored ... BrokenPipeError") or block.

A pipe's reader that left is also seen without a write: each flush of a pipe asks poll() for POLLERR, so a
`trace | head -1` ends once head has exited, not at its next session.

Signals while a command starts (StartSignals): Ctrl-C raises KeyboardInterrupt (exit 130), SIGTERM and SIGHUP raise
SignalStop (128 + the signal's number); the start undoes what it attached on any exception (Runtime.start). Only
the first one raises: the undoing is not interrupted by a second. The agent's start is interrupted by Ctrl-C only
(SIGTERM and SIGHUP are kept as its stop and reload requests, for when the start is done). Once a trace is
receiving, runtime/requests.py turns them into a stop request instead (detach, flush, exit 0). A signal that
arrives while a write is blocked (a reader that stopped reading) abandons that write (WritesInProgress, which
Streams owns and its streams share; GuardedStream.interrupt_write is what runtime/requests.py calls): the output is
given up, the stop goes on.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any, TextIO

from retsnoop_otel.command.errors import EXIT_HOST, EXIT_INTERRUPTED, EXIT_PIPE

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalStop(BaseException):
    """SIGTERM or SIGHUP during a start: unwinds it like KeyboardInterrupt, exit 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class WriteAbandoned(Exception):
    """What a stream failed with when a stop signal came while it was blocked in a write (WritesInProgress)."""


class WritesInProgress:
    """The guarded writes under way, each with its thread: what a stop signal abandons (interrupt). One per Streams,
    shared by its stdout and stderr, so that the process holds no module-level state."""

    def __init__(self) -> None:
        self._entries: list[tuple[int, GuardedStream]] = []

    def enter(self, stream: GuardedStream) -> tuple[int, GuardedStream]:
        entry = (threading.get_ident(), stream)
        self._entries.append(entry)
        return entry

    def leave(self, entry: tuple[int, GuardedStream]) -> None:
        self._entries.remove(entry)

    def interrupt(self) -> None:
        """From a stop signal's handler: a guarded write of this thread blocked now (a reader that stopped reading)
        is given up. The stream's descriptor is pointed at /dev/null, so that the write the signal interrupted is
        retried there (PEP 475) and returns; the output is abandoned, the stop goes on. No exception is raised in
        the handler: it may run at any point of the writer's code. A write under way that is not blocked (its
        descriptor takes more now: the signal came just before or after the system call) goes on: abandoning it
        lost the rest of the output, "Detaching... DONE" included, of a Ctrl-C that came as a line went out."""
        me = threading.get_ident()
        for ident, stream in list(self._entries):
            if ident == me and stream.error is None and _blocked(stream):
                stream.error = WriteAbandoned("a stop was asked while the output was blocked")
                _to_devnull(stream)


def _blocked(stream: GuardedStream) -> bool:
    """Whether a write to the stream's descriptor would wait now (a pipe or terminal that takes nothing more); a
    reader that left (POLLERR) does not block: the write fails at once, with EPIPE."""
    import select
    try:
        p = select.poll()
        p.register(stream.fileno(), select.POLLOUT)
        return not p.poll(0)
    except (OSError, ValueError, AttributeError):  # no descriptor (a StringIO): nothing can block
        return False


class GuardedStream:
    """A text stream whose write errors end the command, not the code that wrote (see the module's doc)."""

    def __init__(self, stream: TextIO, name: str, writes: WritesInProgress | None = None) -> None:
        self._stream = stream
        self.name = name
        self._writes = writes or WritesInProgress()  # Streams shares one between stdout and stderr
        self.error: BaseException | None = None
        self.listeners: list[Callable[[], object]] = []
        self._pipe_fd = _pipe_fd(stream)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def reader_gone(self) -> bool:
        return isinstance(self.error, OSError) and self.error.errno == errno.EPIPE

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.error is not None:
            return None
        entry = self._writes.enter(self)
        try:
            return fn(*args)
        except (OSError, ValueError) as exc:  # ValueError: a stream closed under us
            self._fail(exc)
            return None
        finally:
            self._writes.leave(entry)

    def interrupt_write(self) -> None:
        """A stop signal's handler: this thread's blocked guarded write, on this stream or its sibling, given up
        (WritesInProgress.interrupt)."""
        self._writes.interrupt()

    def _fail(self, exc: BaseException) -> None:
        if self.error is not None:
            return
        self.error = exc
        for listener in list(self.listeners):
            listener()

    def write(self, text: str) -> int:
        self._call(self._stream.write, text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self, check_reader: bool = True) -> None:
        """With `check_reader`, a pipe whose reader left counts as failed even before a write: how a trace learns
        that `head` has exited. The command's last flush does not ask: output written in full is not a failure."""
        self._call(self._stream.flush)
        if check_reader and self._pipe_fd is not None and self.error is None and _reader_left(self._pipe_fd):
            self._fail(OSError(errno.EPIPE, os.strerror(errno.EPIPE)))

    def on_failure(self, listener: Callable[[], object]) -> None:
        """`listener()` once the stream fails (at once when it already has)."""
        self.listeners.append(listener)
        if self.error is not None:
            listener()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer...: the wrapped stream's
        return getattr(self._stream, name)


def _pipe_fd(stream: TextIO) -> int | None:
    """The descriptor of a stream that is a pipe or FIFO (whose reader can leave), else None."""
    try:
        fd = stream.fileno()
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except (OSError, ValueError, AttributeError):
        return None


def _reader_left(fd: int) -> bool:
    """Whether a pipe's read end is closed: poll() reports POLLERR on the write end then (Linux)."""
    import select
    try:
        p = select.poll()
        p.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in p.poll(0))
    except (OSError, ValueError):
        return False


class Streams:
    """The process's stdout and stderr guarded for one command (cli.main), and its exit code decided by them."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        writes = WritesInProgress()
        self.out = GuardedStream(out, "stdout", writes)
        self.err = GuardedStream(err, "stderr", writes)
        self.interrupt_write = writes.interrupt  # for the run's stop signals (runtime/requests.py)
        self._saved: tuple[TextIO, TextIO] | None = None

    def install(self) -> Streams:
        """sys.stdout and sys.stderr become the guarded ones (print() and argparse write there)."""
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self.out, self.err  # type: ignore[assignment]
        return self

    def exit_code(self, code: int) -> int:
        """The command's exit code once its outputs are counted in; says why stdout failed when it was no EPIPE."""
        self.out.flush(check_reader=False)
        if self.out.reader_gone:
            return EXIT_PIPE.code
        if self.out.failed and not isinstance(self.out.error, WriteAbandoned):  # abandoned: the stop's own doing
            why = self.out.error
            text = (why.strerror or str(why)) if isinstance(why, OSError) else str(why)
            self.err.write(f"retsnoop-otel: cannot write to stdout: {text}\n")
            self.err.flush()
            return EXIT_HOST.code if code in (0, EXIT_PIPE.code) else code
        return code

    def finish(self) -> None:
        """sys.stdout and sys.stderr back; a failed one's descriptor pointed at /dev/null first."""
        for guarded in (self.out, self.err):
            if guarded.failed and not isinstance(guarded.error, WriteAbandoned):  # that one is there already
                _to_devnull(guarded)
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None


def _to_devnull(guarded: GuardedStream) -> None:
    try:
        fd = guarded.fileno()
    except (OSError, ValueError, AttributeError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def exit_of(exc: BaseException) -> int | None:
    """The exit code of a signal's exception (KeyboardInterrupt 130, SignalStop 128+N), else None."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED.code
    if isinstance(exc, SignalStop):
        return exc.exit_code
    return None


_CALLBACKS: set[CodeType] = set()  # the code of Python functions that C calls back (ctypes callbacks)
_installed: list[StartSignals] = []  # the process's start signals (the last installed)


def callback_code(code: CodeType) -> None:
    """Declare a ctypes callback: a start signal that lands in it is not raised there (ctypes would print
    "Exception ignored" and go on, the signal lost) but deferred to raise_deferred(), after the C call returns."""
    _CALLBACKS.add(code)


def raise_deferred() -> None:
    """The start signal that came inside a C callback, raised now (on the main thread; nothing otherwise). Called
    after each libbpf call and once a start is done, so that no start signal is lost."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        return
    s = _installed[-1]
    if s.deferred:
        s.deferred = False
        raise s.exception()


@contextmanager
def start_signals_held() -> Iterator[None]:
    """A start signal that comes during the block is raised right after it (as one in a C callback is), not inside:
    for code whose threads must all end before the caller unwinds (features.py's probes side by side), and around
    Python's threading primitives, which a KeyboardInterrupt raised inside can leave broken ("RuntimeError: release
    unlocked lock" out of Thread.start, seen by a Ctrl-C sweep of `features`). Nothing held without StartSignals."""
    s = _installed[-1] if _installed and threading.current_thread() is threading.main_thread() else None
    if s is None:
        yield
        return
    s.holding += 1
    try:
        yield
    finally:
        s.holding -= 1
    raise_deferred()


class StartSignals:
    """Ctrl-C, SIGTERM and SIGHUP during a start: the first one raises (KeyboardInterrupt, SignalStop), later ones
    are ignored while the start undoes itself. Installed by `trace` before its first step. `passive`: the signals
    that call a function instead of raising (the agent: SIGTERM asks for a stop, SIGHUP for a reload, once the start
    is done), so that only Ctrl-C interrupts its start. One that lands in a C callback is deferred (callback_code)."""

    def __init__(self, passive: dict[int, Callable[[], object]] | None = None) -> None:
        self.fired: int | None = None
        self.deferred = False
        self.holding = 0  # inside start_signals_held(): a signal is deferred, as in a C callback
        self.passive = passive or {}

    def install(self) -> StartSignals:
        """SIGHUP stays ignored when it was ignored at exec (`nohup retsnoop-otel trace ...`)."""
        for sig in STOP_SIGNALS:
            if not (sig == signal.SIGHUP and not self.passive and signal.getsignal(sig) == signal.SIG_IGN):
                signal.signal(sig, self._handle)
        _installed[:] = [self]
        return self

    def exception(self) -> BaseException:
        assert self.fired is not None
        return KeyboardInterrupt() if self.fired == signal.SIGINT else SignalStop(self.fired)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum in self.passive:
            self.passive[signum]()
            return
        if self.fired is not None:
            return
        self.fired = signum
        if self.holding or frame is not None and frame.f_code in _CALLBACKS:
            self.deferred = True
            return
        raise self.exception()

"""The agent's config file watched, so that an update reloads it as SIGHUP does (a ConfigMap update reaches every pod).

A ConfigMap volume never rewrites the file: kubelet writes a new timestamped directory, renames a new `..data`
symlink over the old one and removes the old directory, so `agent.yaml -> ..data/agent.yaml` keeps its own inode and
a watch on the file alone sees nothing. Editors save by renaming a new file over the old one, with the same effect.
So what is compared is the file as the path resolves now: its real path, device, inode, mtime and size, and its bytes
(a touch or a rewrite with the same bytes is no change). inotify on the directories of the path and of
its target wakes the check at once; a stat every `poll_s` stands in where inotify misses something (network file
systems, no inotify instances left). A change is posted once the file has stayed the same for `settle_s`, so a burst
of writes (kubelet's three steps, an editor's save) is one reload, and never a half-written file. A file that is
gone or unreadable posts nothing: the running config stays, and the file is picked up again when it is back.
"""

import ctypes
import errno
import os
import select
import stat as stat_mod
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.inputs.files import MAX_CONFIG_BYTES

POLL_S = 2.0  # the stat fallback, also with inotify: kubelet's sync takes up to a minute anyway
SETTLE_S = 0.5  # quiet time before a change counts
_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
# close-write, attrib, moved from/to, create, delete, delete-self, move-self
_IN_MASK = 0x008 | 0x004 | 0x040 | 0x080 | 0x100 | 0x200 | 0x400 | 0x800


class Seen(NamedTuple):
    """The file as one look found it; None fields: not there or not readable."""

    stat: tuple | None
    content: bytes | None  # kept whole rather than hashed: a config is small (MAX_CONFIG_BYTES at most), and hashlib
    # would load OpenSSL's libcrypto at the agent's start for it


def look(path: str, previous: Seen | None = None, read: bool = True) -> Seen:
    """Stat the path (following its symlinks) and read its bytes; without `read`, an unchanged stat keeps the
    previous bytes (the periodic check costs one stat)."""
    try:
        st = os.stat(path)
        stat = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if not read and previous is not None and previous.stat == stat:
            return previous
        if not stat_mod.S_ISREG(st.st_mode):  # /dev/zero, a FIFO: never read here (the load refuses them)
            return Seen(stat, b"")
        with open(path, "rb") as f:  # bounded as the load is: a file growing without end is not read to its end
            return Seen(stat, f.read(MAX_CONFIG_BYTES + 1))
    except OSError:
        return Seen(None, None)


class _Inotify:
    """A non-blocking inotify descriptor over the directories the path goes through (None when the kernel gives
    none: the stat fallback does it all then)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(_IN_NONBLOCK_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.fd: int = fd

    def watch_dirs_of(self, path: str) -> None:
        """The directory of the path as given (the `..data` swap, a rename over the file) and of its target (an
        in-place write through a symlink); a removed directory's watch ends by itself."""
        for d in {os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))}:
            if os.path.isdir(d):
                self._libc.inotify_add_watch(self.fd, os.fsencode(d), _IN_MASK)  # < 0: the stat fallback covers it

    def drain(self) -> None:
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.fd)


class ConfigWatch:
    """One daemon thread that calls `post()` (the agent's reload request) after each change of the file."""

    def __init__(self, path: str, post: Callable[[], None], log: EventLog | None = None, poll_s: float = POLL_S,
                 settle_s: float = SETTLE_S, use_inotify: bool = True) -> None:
        self.path = path
        self.post = post
        self.log = log or EventLog(level="error")
        self.poll_s, self.settle_s = poll_s, settle_s
        self.seen = look(path)  # taken before the agent loads the file: a change during its start is not missed
        self.loaded = self.seen.content  # the bytes of the last reload asked for or made (or of the start)
        self._lock = threading.Lock()  # `loaded`: compared and set by this thread, set by reloading()
        self.inotify: _Inotify | None = None
        if use_inotify:
            try:
                self.inotify = _Inotify()
            except OSError as exc:
                self.log.warning("config file watched by a stat every few seconds: no inotify",
                                 error=os.strerror(exc.errno or errno.EMFILE), interval_s=poll_s)
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-watch", daemon=True)

    def start(self) -> "ConfigWatch":
        if self.inotify is not None:
            self.inotify.watch_dirs_of(self.path)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ends the thread (at the agent's shutdown) and closes its descriptors."""
        self._stopping.set()
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        if self.inotify is not None:
            self.inotify.close()

    def reloading(self) -> None:
        """A reload (SIGHUP's too) is about to read the file: its bytes count as loaded, so the change that a
        SIGHUP already applied (or refused) is not reloaded a second time when the watch sees it."""
        with self._lock:
            self.loaded = look(self.path).content

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _wait(self, timeout_s: float) -> bool:
        """Sleep until an inotify event, a stop or the timeout; True when woken by an event."""
        p = select.poll()
        p.register(self._wake_r, select.POLLIN)
        if self.inotify is not None:
            p.register(self.inotify.fd, select.POLLIN)
        ready = {fd for fd, _ in p.poll(timeout_s * 1000)}
        if self.inotify is not None and self.inotify.fd in ready:
            self.inotify.drain()
            return True
        return False

    def _run(self) -> None:
        missing = False
        while not self._stopping.is_set():
            woken = self._wait(self.poll_s)
            if self._stopping.is_set():
                return
            now = look(self.path, self.seen, read=woken)
            if now == self.seen:
                continue
            while True:  # settled: no event for settle_s (or a busy directory for 10 times that), the same look
                until = time.monotonic() + 10 * self.settle_s
                while self._wait(self.settle_s) and not self._stopping.is_set() and time.monotonic() < until:
                    pass
                if self._stopping.is_set():
                    return
                later = look(self.path, now)
                if later == now:
                    break
                now = later
            if self.inotify is not None:
                self.inotify.watch_dirs_of(self.path)  # a new target directory (the new ..data)
            self.seen = now
            if now.content is None:
                if not missing:
                    self.log.warning("config file gone or unreadable; the running config stays", config=self.path)
                missing = True
                continue
            missing = False
            with self._lock:
                if now.content != self.loaded:
                    self.loaded = now.content
                    self.post()

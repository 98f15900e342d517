"""libbpf's BPF ring buffer consumer: one Python callback per record the BPF side submitted."""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import select
from collections.abc import Callable

from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_abi as abi


class RingBuffer:
    """Consumes a BPF ring buffer map, calling `callback(bytes)` for each record.

    An exception raised by the callback stops the poll and is re-raised from poll(): it cannot
    cross libbpf's C frames.
    """

    def __init__(self, map_fd: int, callback: Callable[[bytes], None]) -> None:
        self._callback = callback
        self._error: BaseException | None = None
        self._cb = abi.SAMPLE_FN(self._on_sample)  # referenced for as long as libbpf may call it
        ptr = lb.lib().lib.ring_buffer__new(map_fd, self._cb, None, None)
        self._ptr: int | None = lb.check_ptr(ptr, "create ring buffer consumer")
        self._waits: tuple[int, select.poll] | None = None  # (wake fd, its poll object with the ring's epoll fd)

    def _on_sample(self, _ctx: int, data: int, size: int) -> int:
        try:
            self._callback(ctypes.string_at(data, size))
        except BaseException as exc:  # noqa: BLE001 - carried across the C frame, re-raised in poll()
            self._error = exc
            return -1
        return 0

    def poll(self, timeout_ms: int, wake_fd: int | None = None) -> int:
        """Records consumed (0 when none came within the timeout, or on EINTR).

        The BPF side wakes the reader only once a batch is waiting (rb_wakeup() in retsnoop.bpf.c), so
        records that came without a wakeup are read when the wait times out. `wake_fd` (the signal wakeup
        fd, runtime/requests.py) ends the wait too: a signal that lands just before libbpf's epoll_wait
        interrupts nothing, and the stop it asks for waited out the whole timeout (100 ms in 1 of 4 stops)."""
        lib = lb.lib().lib
        if wake_fd is not None and timeout_ms > 0:
            self._wait(timeout_ms, wake_fd)
            rc = lib.ring_buffer__consume(self._ptr)
        else:
            rc = lib.ring_buffer__poll(self._ptr, timeout_ms)
            if rc == 0 and self._error is None:
                rc = lib.ring_buffer__consume(self._ptr)
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if rc < 0 and rc != -_errno.EINTR:
            raise lb.fail("poll ring buffer", -rc)
        return max(rc, 0)

    def _wait(self, timeout_ms: int, wake_fd: int) -> None:
        """Until the ring's epoll fd (libbpf's, for custom polling) or `wake_fd` is readable, or the timeout; the
        wake fd drained (a signal's byte: the loop reads its flag next)."""
        if self._waits is None or self._waits[0] != wake_fd:
            waits = select.poll()
            waits.register(lb.lib().lib.ring_buffer__epoll_fd(self._ptr), select.POLLIN)
            waits.register(wake_fd, select.POLLIN)
            self._waits = (wake_fd, waits)
        if any(fd == wake_fd for fd, _ in self._waits[1].poll(timeout_ms)):
            try:
                while os.read(wake_fd, 512):
                    pass
            except OSError:  # BlockingIOError: drained
                pass

    def free(self) -> None:
        if self._ptr:
            lb.lib().lib.ring_buffer__free(self._ptr)
            self._ptr = None

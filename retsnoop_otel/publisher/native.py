"""The publisher's C library (libotel_thread_ctx.so, built at install time next to this module), through ctypes."""

from __future__ import annotations

import ctypes
import errno
import os
from functools import cache
from pathlib import Path

LIBRARY = Path(__file__).resolve().parent / "libotel_thread_ctx.so"
RECORD_SIZE = 640  # the thread record: 28 bytes of head, then attrs-data (OTEP 4947's recommended maximum)


class PublisherUnavailable(RuntimeError):
    """The C library is missing or cannot be loaded (one line saying why)."""


@cache
def library(path: Path = LIBRARY) -> ctypes.CDLL:
    """Load the library once and declare the signatures of its functions."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise PublisherUnavailable(
            f"retsnoop-otel thread-context publisher: cannot load {path} ({e}); reinstall retsnoop-otel with gcc "
            "available (Debian package 'gcc'), or run `make bpf` in a source tree") from None
    # otel_thread_ctx_set(bytes, bytes, int, bytes | None, int) and otel_thread_ctx_clear() run at every context
    # attach/detach: no argtypes, ctypes' own conversions (bytes: pointer, None: NULL, int: int) take half the time
    lib.otel_thread_ctx_clear.restype = None
    lib.otel_thread_ctx_current.argtypes = []
    lib.otel_thread_ctx_current.restype = ctypes.c_void_p
    lib.otel_thread_ctx_addr.argtypes = []
    lib.otel_thread_ctx_addr.restype = ctypes.c_void_p
    lib.otel_thread_ctx_record_size.argtypes = []
    lib.otel_thread_ctx_record_size.restype = ctypes.c_size_t
    lib.otel_process_ctx_publish.argtypes = [ctypes.c_char_p, ctypes.c_uint32]
    lib.otel_process_ctx_publish.restype = ctypes.c_int
    lib.otel_process_ctx_header.argtypes = []
    lib.otel_process_ctx_header.restype = ctypes.c_void_p
    if lib.otel_thread_ctx_record_size() != RECORD_SIZE:
        raise PublisherUnavailable(f"retsnoop-otel thread-context publisher: {path} is of another version: rebuild it")
    return lib


def current() -> int | None:
    """The address of the calling thread's record, as otel_thread_ctx_v1 holds it (None: no record yet)."""
    return library().otel_thread_ctx_current()


def publish_payload(payload: bytes) -> None:
    """Publish (or update, OTEP 4719's update protocol) the process context with this serialized Resource."""
    err = library().otel_process_ctx_publish(payload, len(payload))
    if err:
        why = "no memfd and the kernel cannot name the mapping" if err == -errno.ENOTSUP else os.strerror(-err)
        raise OSError(-err, f"cannot publish the OTEL_CTX process context: {why}")

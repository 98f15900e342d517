"""tracefs: which kernel functions ftrace (and so fentry and kprobes) can attach to."""

from __future__ import annotations

import errno
import re
from pathlib import Path

_AFF = "available_filter_functions"
_INVALID_PREFIX = "__ftrace_invalid_address__"  # placeholders for records of discarded code
# 'name' or 'name [module]'; anything else after the name (a malformed module part) is ignored
_AFF_LINE = re.compile(r"^[ \t]*(\S+)(?:[ \t]+\[([^\]\s]*)\])?[^\n]*$", re.M)


class TracefsError(Exception):
    """tracefs is missing or refuses reads: one sentence saying what to do."""


def find_tracefs(root: str = "/") -> Path:
    """The tracefs directory: the native mount if it lists functions, else the debugfs path."""
    native = Path(root, "sys/kernel/tracing")
    legacy = Path(root, "sys/kernel/debug/tracing")
    for path in (native, legacy):
        try:
            (path / _AFF).stat()
        except PermissionError:
            return path  # there, but not for us: the read reports EACCES with the fix
        except OSError:
            continue
        return path
    raise TracefsError(
        f"tracefs is not mounted (no {_AFF} under {native} or {legacy}): "
        "mount it with `mount -t tracefs nodev /sys/kernel/tracing` (as root)")


def parse_available_filter_functions(text: str) -> list[tuple[str, str | None]]:
    """'name' / 'name [module]' lines -> (name, module); ftrace's invalid-address placeholders dropped.

    One C-level regex scan: the file has ~40-60k lines and is parsed inside TCG VMs, where a Python
    loop per line costs seconds."""
    return [(name, mod or None) for name, mod in _AFF_LINE.findall(text) if not name.startswith(_INVALID_PREFIX)]


def read_available_filter_functions(root: str = "/") -> list[tuple[str, str | None]]:
    return parse_available_filter_functions(read_available_filter_functions_text(root))


def read_available_filter_functions_text(root: str = "/", limit: int | None = None) -> str:
    """The file's text (its first `limit` bytes only, to check that it can be read)."""
    return read_available_filter_functions_bytes(root, limit).decode("utf-8", "replace")


def read_available_filter_functions_bytes(root: str = "/", limit: int | None = None) -> bytes:
    """The file's bytes (its first `limit` only); raises TracefsError naming the fix."""
    path = find_tracefs(root) / _AFF
    try:
        with path.open("rb") as f:
            text = f.read() if limit is None else f.read(limit)
    except PermissionError as exc:
        if exc.errno == errno.EPERM:
            raise TracefsError(
                f"reading {path} failed with EPERM: this kernel does not allow function tracing here "
                "(lockdown or a restricted container); run retsnoop-otel as root on a kernel that allows "
                "it, for example in a VM") from None
        raise TracefsError(f"reading {path} failed with EACCES: run retsnoop-otel as root") from None
    except OSError as exc:
        raise TracefsError(f"cannot read {path}: {exc.strerror}; function tracing needs tracefs mounted "
                           "at /sys/kernel/tracing and root privileges") from None
    return text

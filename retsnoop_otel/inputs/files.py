"""Reading the files a user names as input (a config, a glob file, a certificate): one bounded, checked read.

Only regular files are read (symlinks to them too). A FIFO, a device such as /dev/zero, a directory or a
socket is refused by name before anything could block or read without end: the path is stat()ed first, then
opened with O_NONBLOCK and the open descriptor fstat()ed again (the file may have been swapped in between).
At most cap+1 bytes are read, so a file over its cap is refused with the cap in the message, and text is
decoded as UTF-8 with the byte offset of the first bad byte in the message rather than a traceback.

Every refusal is one line, `PATH: problem`, raised as the caller's error type (ConfigError for the agent's
config, DiscoveryError for glob files, ...), so each command keeps its exit code.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable

MAX_CONFIG_BYTES = 4 << 20  # the agent's --config / --check file and the web config file
MAX_GLOB_FILE_BYTES = 4 << 20  # -e/-a/-d @FILE and allow: '@FILE'
MAX_PEM_BYTES = 1 << 20  # certificates, keys, CA bundles, tokens

ECHO_LIMIT = 80  # characters of a value echoed in a message

ErrorFactory = Callable[[str], Exception]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def shown(value: object, limit: int = ECHO_LIMIT, quote: bool = True) -> str:
    """A value as a message echoes it: at most `limit` characters, with the full length said when cut, e.g.
    `'xxxx…' (100000 characters)`. Quoted with repr() unless `quote` is false; control characters escaped either
    way."""
    text = str(value)
    if not quote:  # unquoted, control characters still escaped: a message stays one line
        return plain(text, limit)
    if len(text) <= limit:
        return repr(text)
    head = repr(text[:limit])
    return f"{head[:-1]}…{head[-1]} ({len(text)} characters)"


def plain(text: str, limit: int = 2 * ECHO_LIMIT) -> str:
    """A name the user chose (a config key, a probe set, a path) unquoted, with control characters escaped so
    that a message stays one line, cut to `limit` characters."""
    if text.isprintable() and len(text) <= limit:
        return text
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return escaped if len(escaped) <= limit else f"{escaped[:limit]}… ({len(text)} characters)"


def size_text(n: int) -> str:
    """4194304 -> '4 MiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: str | os.PathLike[str], name: str, cap: int, error: ErrorFactory) -> bytes:
    """The whole of a regular file of at most `cap` bytes. `name` is what the file is called in messages
    ('config file', '--check file', 'glob file'), or '' when the caller's message already names it (a config
    key); every refusal is `error(message)`."""
    where = shown(os.fspath(path), quote=False)
    the = f"the {name} is " if name else ""
    cannot = f"cannot read the {name}: " if name else ""

    def refuse(kind: str) -> Exception:
        return error(f"{where}: {the}{kind}, not a regular file")

    if "\x00" in str(os.fspath(path)):  # a YAML string can hold one ("\0"); os.stat() would raise ValueError
        raise error(f"{shown(os.fspath(path))}: not a file name (it holds a NUL character)")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise refuse(_kind(st.st_mode))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{where}: {cannot}{exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise refuse(_kind(st.st_mode))
        chunks: list[bytes] = []
        left = cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise error(f"{where}: {cannot}{exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        raise error(f"{where}: {the}larger than {size_text(cap)}, the limit for it")
    return data


def read_text(path: str | os.PathLike[str], name: str, cap: int, error: ErrorFactory) -> str:
    """read_bytes() decoded as UTF-8; bytes that are not UTF-8 are refused with the offset of the first one."""
    data = read_bytes(path, name, cap, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{shown(os.fspath(path), quote=False)}: not a text file ({exc.reason} at byte {exc.start}); "
                    f"{f'the {name}' if name else 'it'} must be UTF-8") from None


def expand_at_files(values: Iterable[str], name: str, cap: int, error: ErrorFactory,
                    read: dict[str, list[str]] | None = None) -> list[str]:
    """Values in order, each '@file' replaced by its lines (blank lines and '#' comments skipped), as retsnoop reads
    its glob and name files. `read`: the files one input (a command line, a config) already read, by '@file', shared
    by the calls that expand it, so that a file it names twice is read once."""
    out: list[str] = []
    seen: dict[str, list[str]] = {} if read is None else read
    for value in values:
        if not value.startswith("@"):
            out.append(value)
            continue
        if value not in seen:
            lines = read_text(value[1:], name, cap, error).splitlines()
            seen[value] = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
        out.extend(seen[value])
    return out

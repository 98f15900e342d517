"""On-disk caches of what is slow to read from the running kernel, each valid only under its key.

Parsing kallsyms, available_filter_functions and BTF takes seconds under emulation and on large
hosts, at every `trace` run and every agent reload, for facts that do not change while their key
holds: the kernel build (BTF), or the boot and the set of loaded modules (symbols and traceable
functions). A cache entry is one file holding (format, key, payload); an entry whose key differs
is ignored and replaced. The cache is an accelerator only: an unwritable or missing directory, a
corrupt file or one not owned by this user (or writable by others) reads as a miss, and nothing
fails because of it.
"""

import marshal
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from retsnoop_otel.inputs.files import shown
from retsnoop_otel.kernel.build_id import parse_notes_build_id

FORMAT = 3  # 2: kallsyms and traceable functions as flat columns (symbols/kallsyms.py); 3: with their layout
AGENT_CACHE_DIR = "/var/cache/retsnoop-otel"


def cache_base(configured: str | None, environ: Mapping[str, str]) -> Path:
    """RETSNOOP_OTEL_CACHE, else the configured directory (the agent's /var/cache), else the XDG cache. `environ`:
    the run's (runtime/settings.py resolves the directory once, into SymbolsConfig.cache_dir)."""
    if environ.get(CACHE_VARIABLE):
        return Path(environ[CACHE_VARIABLE])
    if configured:
        return Path(configured)
    home = environ.get("HOME") or os.path.expanduser("~")  # no HOME: the user's home from the password database
    return Path(environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "retsnoop-otel")


CACHE_VARIABLE = "RETSNOOP_OTEL_CACHE"
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a file"))


def cache_dir_problem(path: str) -> str | None:
    """What makes RETSNOOP_OTEL_CACHE unusable as the cache's directory, None when it is one or can be made:
    a file or a device (/dev/null) in its place, or a path whose nearest existing directory is / (the cache would
    create a new top-level directory, a typo such as /vat/cache more likely than a wish)."""
    full = os.path.abspath(path)
    probe = full
    while True:
        try:
            st = os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            parent = os.path.dirname(probe)
            if parent == probe:
                return None  # nothing exists, not even /: nothing to say here
            probe = parent
        except OSError:
            return None  # no permission to look: the cache, an accelerator only, reads that as a miss
    if not stat.S_ISDIR(st.st_mode):
        what = next((name for test, name in _KINDS if test(st.st_mode)), "not a directory")
        where = "it is" if probe == full else f"{shown(probe, quote=False)} is"
        return f"{where} {what}, not a directory"
    if probe != full and probe == os.path.dirname(probe):  # the first missing part would be made under /
        top = full.split(os.sep)[1]
        return (f"it does not exist, and would be made as a new top-level directory /{shown(top, 40, False)}; "
                "give an existing directory, or one under an existing directory other than /")
    return None


class KernelIdentity(NamedTuple):
    """What the cached facts depend on: the kernel build, this boot, and the loaded modules."""

    build_id: str  # GNU build-id of the running kernel ('' when /sys/kernel/notes cannot say)
    boot_id: str
    modules: str  # the loaded modules (name, size, state, address), one per line

    def build_key(self) -> str | None:
        return f"{self.build_id}:{sys.version_info[:2]}" if self.build_id else None

    def boot_key(self) -> str | None:
        if not (self.build_id and self.boot_id):
            return None
        return f"{self.build_id}:{self.boot_id}:{self.modules}:{sys.version_info[:2]}"

    def layout_key(self) -> str | None:
        """The build and the loaded modules without their addresses: while it holds, the symbols of another boot
        (or of a module reloaded elsewhere) are these, moved (symbols/kernel_facts.py)."""
        if not self.build_id:
            return None
        rows = "\n".join(row.rsplit(" ", 1)[0] for row in self.modules.splitlines())
        return f"{self.build_id}:{rows}:{sys.version_info[:2]}"

    def module_bases(self) -> dict[str, int] | None:
        """Where each module's text begins; None when /proc/modules hides the addresses (not root)."""
        bases = {}
        for row in self.modules.splitlines():
            name, _, _, addr = row.split(" ")
            try:
                bases[name] = int(addr, 16)
            except ValueError:
                return None
            if not bases[name]:
                return None
        return bases


def _read(path: str, mode: str = "r") -> str | bytes | None:
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def modules_state(text: str) -> str:
    """/proc/modules without what changes all the time (reference counts, users): loading, unloading or
    reloading a module (or it finishing its init) changes kallsyms and the traceable functions, and its
    name, size, state or load address with them. Kept whole in the key (a few kB): no hash to import."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6:
            rows.append(f"{f[0]} {f[1]} {f[4]} {f[5]}")
    return "\n".join(sorted(rows))


def kernel_identity(root: str = "/") -> KernelIdentity:
    notes = _read(os.path.join(root, "sys/kernel/notes"), "rb")
    build_id = (parse_notes_build_id(notes) if isinstance(notes, bytes) else None) or ""
    boot = _read(os.path.join(root, "proc/sys/kernel/random/boot_id"))
    mods = _read(os.path.join(root, "proc/modules"))
    return KernelIdentity(build_id, boot.strip() if isinstance(boot, str) else "",
                          modules_state(mods) if isinstance(mods, str) else "")


class KernelCache:
    """One directory of cache entries (`None`: caching off)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @classmethod
    def at(cls, base: str | Path) -> "KernelCache":
        """The kernel facts' directory under the run's cache directory (cache_base)."""
        return cls(Path(base) / "kernel")

    def _path(self, name: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{name}.marshal"

    def read(self, name: str, key: str | None) -> object | None:
        """The payload stored under `name` when its key is `key`; None on any mismatch or problem."""
        if key is None:
            return None
        stored = self.read_keyed(name)
        return stored[1] if stored is not None and stored[0] == key else None

    def read_keyed(self, name: str) -> tuple[str, object] | None:
        """(key, payload) stored under `name`, whatever its key; None when there is none or it is unusable."""
        path = self._path(name)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                if not _trusted(os.fstat(f.fileno())) or not _trusted(os.stat(path.parent)):
                    return None
                fmt, stored_key, payload = marshal.loads(f.read())
        except (OSError, EOFError, ValueError, TypeError):
            return None
        return (stored_key, payload) if fmt == FORMAT and isinstance(stored_key, str) else None

    def write(self, name: str, key: str | None, payload: object) -> bool:
        """Store atomically (a reader never sees half a file); False when the directory is unwritable."""
        path = self._path(name)
        if path is None or key is None:
            return False
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not _trusted(os.stat(path.parent)):
                return False
            data = marshal.dumps((FORMAT, key, payload))
            # a fresh name, created exclusively and private (what tempfile.mkstemp does, without importing
            # tempfile, shutil, bz2, lzma and random: 0.44 s of the first start after a boot, emulated)
            tmp = str(path.parent / f".{name}.{os.getpid()}.{os.urandom(6).hex()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except (OSError, ValueError):
            return False
        _sweep(path.parent, name)
        return True


def _sweep(directory: Path, name: str) -> None:
    """Remove what writers of `name` that ended mid-write left (a process killed, or one that exited while its
    read-ahead thread wrote, symbols/read_ahead.py): temporary files of processes no longer running."""
    try:
        left = [f for f in os.listdir(directory) if f.startswith(f".{name}.")]
    except OSError:
        return
    for tmp in left:
        pid = tmp[len(name) + 2:].split(".")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(directory / tmp)
            except OSError:
                pass
        except OSError:
            pass  # running, as another user: not ours to remove


def _trusted(st: os.stat_result) -> bool:
    """Ours and not writable by anyone else: a cache others can write could name wrong addresses."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)

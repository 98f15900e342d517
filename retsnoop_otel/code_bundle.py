"""The package's compiled modules in one file, read once at the package's import.

A module imported the usual way costs a directory check, a stat of its source and an open and read of its .pyc:
round trips where the package sits on the VM's 9p, network storage or a cold disk, and a `trace` start imports
~120 of ours. From a checked bundle it costs one stat of its source (an edit since the bundle was written is seen,
and that module is imported the usual way); from an unchecked one, nothing: the container image's, whose sources
cannot change (the Dockerfile's .pyc files are unchecked for the same reason). 7.2 under emulation, pinned,
medians of 5 (bench/RESULTS.md): imports 0.78 against 1.12 s warm (checked); with the page cache dropped 1.96
against 2.16 s checked, each source's stat a round trip again, and 0.94 against 2.20 s unchecked.

The bundle is `__pycache__/bundle.<cache tag>.marshal` in the package's directory, for the interpreter that wrote
it (`write`: tests/vm/run and the container image's build call it); none, an unreadable one or one of another
format or bytecode version leaves every import to Python's own finders.
"""

from __future__ import annotations

import marshal
import os
import sys
from importlib.machinery import ModuleSpec
from importlib.util import MAGIC_NUMBER
from types import ModuleType

FORMAT = 2
# name -> (is a package, path under the package's parent, source mtime_ns, source size, marshalled code)
Entry = tuple[bool, str, int, int, bytes]


def bundle_path(package_dir: str) -> str:
    return os.path.join(package_dir, "__pycache__", f"bundle.{sys.implementation.cache_tag}.marshal")


class BundleFinder:
    """A meta path finder and loader for the modules of one bundle whose sources are as it recorded them."""

    def __init__(self, base: str, entries: dict[str, Entry], checked: bool = True) -> None:
        self.base = base  # the directory holding the package
        self.entries = entries
        self.checked = checked  # False: the sources cannot change (the image), their stats are not taken

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        entry = self.entries.get(name)
        if entry is None:
            return None
        is_pkg, rel, mtime_ns, size, _code = entry
        origin = os.path.join(self.base, rel)
        if self.checked:
            try:
                st = os.stat(origin)
            except OSError:
                return None
            if st.st_mtime_ns != mtime_ns or st.st_size != size:
                return None  # edited since: Python's finders compile it
        spec = ModuleSpec(name, self, origin=origin, is_package=is_pkg)
        if is_pkg:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        spec.has_location = True
        return spec

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.get_code(module.__name__), module.__dict__)  # noqa: S102 - the package's own compiled code

    def get_code(self, name: str) -> object:
        """Also what runpy asks for `python -m retsnoop_otel`."""
        return marshal.loads(self.entries[name][4])

    def is_package(self, name: str) -> bool:
        return self.entries[name][0]

    def get_source(self, name: str) -> str:
        with open(os.path.join(self.base, self.entries[name][1]), encoding="utf-8") as f:
            return f.read()


def install(package_dir: str) -> BundleFinder | None:
    """The finder of the package's bundle, first on sys.meta_path; None (and nothing changed) without a usable one."""
    if any(isinstance(f, BundleFinder) for f in sys.meta_path):
        return None
    try:
        with open(bundle_path(package_dir), "rb") as f:
            fmt, magic, checked, entries = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if fmt != FORMAT or magic != MAGIC_NUMBER or not isinstance(entries, dict):
        return None
    finder = BundleFinder(os.path.dirname(package_dir), entries, checked is not False)
    sys.meta_path.insert(0, finder)
    return finder


def write(package_dir: str, checked: bool = True) -> str:
    """Compiles every module of the package into its bundle (written whole, then renamed into place); unchecked only
    where the sources cannot change."""
    package_dir = os.path.abspath(package_dir)
    base, entries = os.path.dirname(package_dir), {}
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, filename)
            rel = os.path.relpath(path, base)
            parts = rel[:-3].split(os.sep)
            is_pkg = parts[-1] == "__init__"
            with open(path, "rb") as f:
                source = f.read()
            st = os.stat(path)
            code = compile(source, path, "exec", dont_inherit=True)
            entries[".".join(parts[:-1] if is_pkg else parts)] = (is_pkg, rel, st.st_mtime_ns, st.st_size,
                                                                   marshal.dumps(code))
    out = bundle_path(package_dir)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(marshal.dumps((FORMAT, MAGIC_NUMBER, checked, entries)))
    os.replace(tmp, out)
    return out

"""The package's code bundle (retsnoop_otel/code_bundle.py): its modules are imported from it while their sources are
as it recorded them, and from their files otherwise; a bundle that cannot be used changes nothing."""

from __future__ import annotations

import importlib
import marshal
import subprocess
import sys
from pathlib import Path

import pytest

from retsnoop_otel import code_bundle
from retsnoop_otel.code_bundle import BundleFinder, bundle_path, install, write

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package `bundled_pkg` (a module, a sub-package) on sys.path, and a meta path without our own finder."""
    pkg = tmp_path / "bundled_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("WHERE = 'init'\n")
    (pkg / "one.py").write_text("VALUE = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "two.py").write_text("from bundled_pkg.one import VALUE\nVALUE2 = VALUE + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, BundleFinder)])
    yield pkg
    for name in [m for m in sys.modules if m == "bundled_pkg" or m.startswith("bundled_pkg.")]:
        del sys.modules[name]


def test_modules_come_from_the_bundle_with_their_files_names(package: Path) -> None:
    write(str(package))
    finder = install(str(package))
    assert finder is not None and sys.meta_path[0] is finder
    two = importlib.import_module("bundled_pkg.sub.two")
    assert two.VALUE2 == 2 and two.__spec__.loader is finder and two.__file__ == str(package / "sub" / "two.py")
    sub = sys.modules["bundled_pkg.sub"]
    assert sub.__spec__.loader is finder and sub.__path__ == [str(package / "sub")]
    assert finder.get_source("bundled_pkg.one") == "VALUE = 1\n"
    assert install(str(package)) is None  # one finder per process


def test_a_module_edited_since_is_imported_from_its_file(package: Path) -> None:
    write(str(package))
    (package / "one.py").write_text("VALUE = 10\n")
    finder = install(str(package))
    assert finder is not None and finder.find_spec("bundled_pkg.one") is None
    assert importlib.import_module("bundled_pkg.sub.two").VALUE2 == 11  # the other modules still from the bundle
    assert sys.modules["bundled_pkg.sub.two"].__spec__.loader is finder
    assert sys.modules["bundled_pkg.one"].__spec__.loader is not finder


def test_an_unchecked_bundle_takes_no_stat_of_the_sources(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's: its sources cannot change, so an edit (which only a test makes there) is not looked for."""
    write(str(package), checked=False)
    (package / "one.py").write_text("VALUE = 10\n")
    finder = install(str(package))
    assert finder is not None and not finder.checked

    def no_stat(*args: object, **kwargs: object) -> None:
        raise AssertionError("a source was stat'ed")

    monkeypatch.setattr(code_bundle.os, "stat", no_stat)
    assert importlib.import_module("bundled_pkg.sub.two").VALUE2 == 2


def test_a_bundle_that_cannot_be_used_changes_nothing(package: Path) -> None:
    meta_path = list(sys.meta_path)
    assert install(str(package)) is None  # none written
    out = Path(write(str(package)))
    _fmt, magic, checked, entries = marshal.loads(out.read_bytes())
    for payload in (b"not marshal", marshal.dumps((code_bundle.FORMAT + 1, magic, checked, entries)),
                    marshal.dumps((code_bundle.FORMAT, b"\0\0\r\n", checked, entries)), marshal.dumps([1, 2]),
                    marshal.dumps((code_bundle.FORMAT, magic, entries))):
        out.write_bytes(payload)
        assert install(str(package)) is None and sys.meta_path == meta_path


def test_the_written_bundle_is_the_interpreters_and_holds_every_module(tmp_path: Path) -> None:
    out = write(str(REPO / "retsnoop_otel"))
    assert out == bundle_path(str(REPO / "retsnoop_otel")) and sys.implementation.cache_tag in out
    _fmt, _magic, checked, entries = marshal.loads(Path(out).read_bytes())
    assert checked
    sources = {p.relative_to(REPO).with_suffix("") for p in (REPO / "retsnoop_otel").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {Path(e[1]).with_suffix("") for e in entries.values()} == sources


def test_the_commands_modules_come_from_the_bundle(tmp_path: Path) -> None:
    """In a fresh interpreter: the commands' modules, and `python -m retsnoop_otel`'s __main__ (runpy asks the loader
    for its code), come from the bundle; only the package and the bundle's own loader are read the usual way."""
    write(str(REPO / "retsnoop_otel"))
    probe = ("import importlib.util, sys\n"
             "import retsnoop_otel.cli, retsnoop_otel.trace.main, retsnoop_otel.agent.main\n"
             "from retsnoop_otel.code_bundle import BundleFinder\n"
             "main = importlib.util.find_spec('retsnoop_otel.__main__').loader\n"
             "assert isinstance(main, BundleFinder) and main.get_code('retsnoop_otel.__main__').co_filename"
             ".endswith('__main__.py')\n"
             "ours = [m for n, m in sys.modules.items() if n.startswith('retsnoop_otel')]\n"
             "assert len(ours) > 100, len(ours)\n"
             "print(sorted(m.__name__ for m in ours if not isinstance(m.__spec__.loader, BundleFinder)))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['retsnoop_otel', 'retsnoop_otel.code_bundle']"

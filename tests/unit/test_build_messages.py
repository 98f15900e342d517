"""What a user sees when a build or run-time dependency is missing: one line naming the package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retsnoop_otel.kernel import libbpf as lb

ROOT = Path(__file__).resolve().parents[2]


def test_build_without_clang_names_the_package(tmp_path: Path) -> None:
    """setup.py's check runs before anything is compiled (PATH without clang)."""
    code = ("import sys; sys.argv = ['setup.py', 'build_py']; import runpy; "
            f"runpy.run_path({str(ROOT / 'setup.py')!r}, run_name='__main__')")
    env = {**os.environ, "PATH": str(tmp_path)}  # no clang, no make
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "error: 'clang' not found: install the Debian package 'clang' (apt-get install clang)" in proc.stderr


def test_missing_or_old_libbpf_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The package loads its own libbpf by path: a build without it, or one that cannot load, says how to mend it."""
    missing = tmp_path / "libbpf.so.1"
    with pytest.raises(lb.LibbpfUnavailable, match=f"{missing} is missing: .*rebuild the package"):
        lb._Libbpf(str(missing))
    missing.write_bytes(b"not an ELF")
    with pytest.raises(lb.LibbpfUnavailable, match="cannot load .*libelf1 and zlib1g"):
        lb._Libbpf(str(missing))
    monkeypatch.setattr(lb, "MIN_VERSION", (99, 0))
    with pytest.raises(lb.LibbpfUnavailable, match=r"is libbpf 1\.\d+, too old: retsnoop-otel needs libbpf 99\.0"):
        lb._Libbpf()


def test_the_loader_is_our_own_libbpf_not_the_hosts() -> None:
    """Every host runs the pinned loader: the process maps the package's copy, whatever /usr/lib holds."""
    lib = lb.lib()
    assert lib.path == lb.library_path() and lib.version >= (1, 7)
    maps = Path("/proc/self/maps").read_text()
    assert os.path.realpath(lb.library_path()) in maps  # as mapped: a symlinked build (a git worktree's) resolved
    assert not [line for line in maps.splitlines() if "/usr/lib" in line and "libbpf.so" in line]

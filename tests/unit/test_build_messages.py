"""What a user sees when a build or run-time dependency is missing: one line naming the package."""

from __future__ import annotations

import ctypes
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


def test_missing_or_old_libbpf_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_cdll = ctypes.CDLL

    def no_libbpf(name, *a, **kw):
        if name == "libbpf.so.1":
            raise OSError("libbpf.so.1: cannot open shared object file")
        return real_cdll(name, *a, **kw)

    monkeypatch.setattr(ctypes, "CDLL", no_libbpf)
    with pytest.raises(lb.LibbpfUnavailable, match="install the Debian package 'libbpf1' \\(version 1.1 or newer\\)"):
        lb._Libbpf()
    monkeypatch.setattr(ctypes, "CDLL", real_cdll)
    monkeypatch.setattr(lb, "MIN_VERSION", (99, 0))
    with pytest.raises(lb.LibbpfUnavailable, match=r"libbpf 1\.\d+ is too old: retsnoop-otel needs libbpf 99\.0"):
        lb._Libbpf()

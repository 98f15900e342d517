"""Fixtures shared by the native (uprobe-driven) tests of the BPF side."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def simkern(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ctypes.CDLL]:
    """simkern.c built as a shared library: user-space stand-ins for kernel call chains, for uprobes."""
    out = tmp_path_factory.mktemp("simkern") / "libsimkern.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(Path(__file__).parent / "simkern.c")],
                   check=True)
    return str(out), ctypes.CDLL(str(out))

"""Compile the BPF objects (CO-RE) and the publisher's C library into the package at build time, so no compiler is
needed at run time."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        sys.exit(f"error: '{tool}' not found: install the Debian package '{package}' (apt-get install {package})")


class BuildBpf(build_py):
    """Run `make -C bpf` (and build the publisher library) and put them next to the Python modules that load them."""

    def run(self) -> None:
        _need("clang", "clang")
        _need("make", "make")
        _need("gcc", "gcc")  # the thread-context publisher's C library (Makefile rule PUBLISHER_SO)
        if not Path("/usr/include/bpf/bpf_helpers.h").exists():
            sys.exit("error: libbpf headers not found: install the Debian package 'libbpf-dev'")
        out = ROOT / "retsnoop_otel" / "bpf"
        out.mkdir(exist_ok=True)
        subprocess.run(["make", "-s", "-C", str(ROOT / "bpf"), f"OUT={out}"], check=True, env=os.environ)
        subprocess.run(["make", "-s", "-C", str(ROOT), "retsnoop_otel/publisher/libotel_thread_ctx.so"], check=True,
                       env=os.environ)
        super().run()


setup(cmdclass={"build_py": BuildBpf})

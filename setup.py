"""Build our own libbpf, the BPF objects (CO-RE) and the publisher's C library into the package at build time, so no
compiler, and no libbpf of the host's, is needed at run time."""

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
    """Run `make bpf` (libbpf, BPF objects, publisher library): they land next to the Python modules that load them."""

    def run(self) -> None:
        _need("clang", "clang")
        _need("make", "make")
        _need("gcc", "gcc")  # the thread-context publisher's C library (Makefile rule PUBLISHER_SO)
        for header, package in (("libelf.h", "libelf-dev"), ("zlib.h", "zlib1g-dev")):  # what libbpf builds with
            if not Path("/usr/include", header).exists():
                sys.exit(f"error: /usr/include/{header} not found: install the Debian package '{package}'")
        subprocess.run(["make", "-s", "-C", str(ROOT), "bpf"], check=True, env=os.environ)
        super().run()


setup(cmdclass={"build_py": BuildBpf})

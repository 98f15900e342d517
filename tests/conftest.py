"""Suite-wide pytest options: the `vm` marker and which kernels the VM tests boot."""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

from tests.vm.kernel_pins import load_series

HOST_KERNELS = tuple(load_series())  # oldest to newest, as tests/vm/kernels.pins lists them
# then the emulated ones of other architectures (7.2-arm64): booted only for the tests that name them
VM_KERNELS = HOST_KERNELS + tuple(k for k in load_series(arch=None) if k not in HOST_KERNELS)


# CI explores the same examples at every run (reproducible); elsewhere hypothesis keeps searching anew.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vm", "real-kernel VM tests (tests/vm, one boot per kernel)")
    group.addoption("--vm-kernels", default=",".join(VM_KERNELS),
                    help="comma-separated kernel series to boot (default: %(default)s); tests for the others "
                         "are reported as deselected. Leave out all VM tests only with -m 'not vm'.")
    group.addoption("--vm-parallel", action=argparse.BooleanOptionalAction, default=False,
                    help="boot the kernels at once, one guest CPU each (about 40%% less time; one-CPU guests make "
                         "Prometheus's 1 s scrapes in prometheus_e2e time out), or one after the other with two "
                         "CPUs each (default)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "artifacts: builds what users install (the container image, the wheel): "
                            "left out of `make lowest`, which checks library versions")
    config.addinivalue_line("markers", "vm: runs inside a real-kernel VM (tests/vm/run), one boot per kernel")
    config.addinivalue_line("markers", "kernels(*series): the kernels whose boots run a VM test that uses "
                            "`vm_batch` ('oldest', 'newest' or a series; default: the newest only)")
    config.addinivalue_line("markers", "crash_drill: panics the guest kernel on purpose; deselected unless "
                            "RETSNOOP_OTEL_VM_CRASH_DRILL=1")
    chosen = [k.strip() for k in config.getoption("--vm-kernels").split(",") if k.strip()]
    bad = [k for k in chosen if k not in VM_KERNELS]
    if bad or not chosen:
        raise pytest.UsageError(f"--vm-kernels: expected some of {', '.join(VM_KERNELS)}, got {chosen!r}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    from tests.container_image import SUMMARY
    for line in config.stash.get(SUMMARY, []):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def kustomize() -> Callable[[str], list[dict]]:
    """`kustomize build` of a folder under config/k8s, with Debian's kustomize (tests/fetch-kustomize): the
    manifests' and the Helm chart's tests compare against the same renders."""
    repo = Path(__file__).resolve().parent.parent
    tool = subprocess.run([str(repo / "tests" / "fetch-kustomize")], capture_output=True, text=True, timeout=300)
    assert tool.returncode == 0, tool.stderr

    def build(folder: str) -> list[dict]:
        res = subprocess.run([tool.stdout.strip(), "build", str(repo / "config" / "k8s" / folder)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return [d for d in yaml.safe_load_all(res.stdout) if d]
    return build

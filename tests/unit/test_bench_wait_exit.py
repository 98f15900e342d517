"""bench/harness.py wait_exit: the exit time of a stopped child, read from a pidfd rather than Popen.wait's polling."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.harness import wait_exit


def test_the_exit_is_seen_when_it_happens_and_the_child_is_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    t0 = time.monotonic()
    t = wait_exit(proc, 120)
    assert proc.returncode == 0 and t0 <= t <= time.monotonic()


def test_a_child_still_running_times_out_and_stays_running() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exit(proc, 0.05)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()

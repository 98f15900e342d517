"""Stopping a child process a bench started: its stop signal, then a kill if it does not exit in time."""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

"""The host side's reading of a guest that hangs: silent for longer than what runs in it may take.

A guest kernel that locks up (seen under TCG as well as crashes) prints nothing more, and tests/vm/run would wait
for the boot's whole timeout, the sum of every scenario's budget: hours. The batch prints a line when a scenario
starts (with its budget) and when it ends, and kills a scenario at its budget, so silence beyond that, plus a margin,
is a hang.
"""

from __future__ import annotations

import subprocess
import threading
import time

from tests.vm import batch_lines


class Stall:
    """When a guest's silence means it hangs: no line for the running scenario's budget (the guest's batch kills a
    scenario at its budget and prints a line), or for the boot's margin before the first one, plus `margin`."""

    def __init__(self, boot_s: float, margin_s: float, poll_s: float = 5.0, grace_s: float = 60.0) -> None:
        self.margin_s = margin_s
        self.poll_s = poll_s
        self.grace_s = grace_s  # from SIGTERM (tests/vm/run stops QEMU) to SIGKILL
        self.allowed_s = boot_s  # what the guest may take before its next line
        self.scenario = "booting"
        self.last = time.monotonic()
        self.why = ""
        self.done = threading.Event()

    def saw(self, line: str) -> None:
        self.last = time.monotonic()
        p = batch_lines.parse(line)
        if p and p.started:
            self.scenario, self.allowed_s = p.name, p.budget_s
        elif p and p.name == self.scenario:  # its outcome
            self.scenario, self.allowed_s = f"after {self.scenario}", 0.0

    def watch(self, proc: subprocess.Popen) -> None:
        while not self.done.wait(self.poll_s):
            silent = time.monotonic() - self.last
            if silent > self.allowed_s + self.margin_s and proc.poll() is None:
                self.why = (f"no output for {silent:.0f} s ({self.scenario}; the guest may take {self.allowed_s:.0f} s "
                            f"+ {self.margin_s:.0f} s): the guest hangs")
                proc.terminate()  # tests/vm/run stops QEMU on SIGTERM
                deadline = time.monotonic() + self.grace_s
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(min(self.poll_s, 1.0))
                if proc.poll() is None:
                    proc.kill()
                return

"""Guest side of the crash drill (tests/vm/test_crash_drill.py, run only with RETSNOOP_OTEL_VM_CRASH_DRILL=1):
crash_drill panics the guest kernel (sysrq 'c') the first time it runs, so that the host's harness has a real
crash to find and one fresh boot to run it and crash_drill_after in. Every scenario returns its boot's id."""

from __future__ import annotations

import os
from pathlib import Path

FIRED = "crash-drill-fired"  # in the shared read-write folder: survives the crash, so the fresh boot goes on


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def scenario_crash_drill_before(ctx) -> dict:
    return {"boot_id": _boot_id()}


def scenario_crash_drill(ctx) -> dict:
    marker = Path(os.environ["RETSNOOP_OTEL_RWDIR"]) / FIRED
    if not marker.exists():
        marker.write_text(_boot_id())
        os.sync()
        ctx.log("panicking the guest kernel: echo c > /proc/sysrq-trigger")
        Path("/proc/sysrq-trigger").write_text("c")
        raise RuntimeError("still running after sysrq 'c'")
    return {"boot_id": _boot_id(), "crashed_boot_id": marker.read_text()}


def scenario_crash_drill_after(ctx) -> dict:
    return {"boot_id": _boot_id()}

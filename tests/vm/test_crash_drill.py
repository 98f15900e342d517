"""A real guest kernel crash and the harness's one fresh boot after it (tests/vm/conftest.py, tests/vm/guest_crash.py).

Selected only by hand, it panics the guest: RETSNOOP_OTEL_VM_CRASH_DRILL=1 .venv/bin/python -m pytest
tests/vm/test_crash_drill.py --vm-kernels 6.1 (about two minutes: two 6.1 boots). Without that variable its tests
are deselected, so no batch of the normal suite runs its scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

CRASH_LOG = Path(__file__).resolve().parents[2] / "build" / "test-logs" / "guest-crashes.txt"
pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1"), pytest.mark.crash_drill]


def test_the_crashed_scenario_and_the_ones_after_it_ran_in_a_fresh_boot(vm_batch, vm_batches) -> None:
    before, drill, after = (vm_batch[n] for n in ("crash_drill_before", "crash_drill", "crash_drill_after"))
    assert drill["crashed_boot_id"] == before["boot_id"]  # it panicked the first boot...
    assert drill["boot_id"] == after["boot_id"] != before["boot_id"]  # ...and ran again, with the one after, anew
    assert vm_batch.crash is None
    (crash,) = [c for c in vm_batch.crashes if not c.before_scenarios]  # a crash while booting may come first
    assert (crash.scenario, crash.line) == ("crash_drill", "Kernel panic - not syncing: sysrq triggered crash")
    lines = [line for line in vm_batches.crashes if line.startswith(f"kernel {vm_batch.series} ")]
    assert any("during scenario 'crash_drill': Kernel panic - not syncing: sysrq triggered crash" in line
               and line.endswith("recovered: a fresh boot ran the scenarios left") for line in lines), lines
    assert "sysrq triggered crash" in CRASH_LOG.read_text()

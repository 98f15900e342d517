"""Issue 45 on a real kernel: the agent reloads by itself when its ConfigMap-style directory is updated.

Guest side: tests/vm/scenarios/agent_config_swap.py.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12")]
DETECT_S = 10.0  # the watch settles for 0.5 s; inotify wakes it at once (the stat fallback: every 2 s)


@pytest.fixture(scope="module")
def r(vm_batch) -> dict:
    return vm_batch["agent_config_swap"]


def test_the_first_config_is_attached(r) -> None:
    m = r["start_metrics"]
    assert m.get("attached:first", 0) > 0 and m["reloads:success"] == 0, (m, r["agent_output"][-3000:])


def test_a_swapped_directory_reloads_within_seconds_and_attaches_the_new_set(r) -> None:
    s = r["swap"]
    assert s["detect_s"] < DETECT_S, s
    assert '"trigger": "file change"' in s["line"] or '"trigger":"file change"' in s["line"], s["line"]
    m = s["metrics"]
    assert m.get("attached:second", 0) > 0 and "attached:first" not in m, m
    assert m["reloads:success"] == 1 and m["reloads:failure"] == 0, m


def test_a_broken_file_keeps_the_running_set_and_counts_a_failure(r) -> None:
    b = r["broken"]
    assert b["detect_s"] < DETECT_S, b
    assert "mode" in b["line"] and "file change" in b["line"], b["line"]
    m = b["metrics"]
    assert m.get("attached:second", 0) > 0 and "attached:third" not in m, m
    assert m["reloads:success"] == 1 and m["reloads:failure"] == 1, m
    assert b["progs"] == r["swap"]["progs"] and b["progs"], b


def test_sigterm_leaves_nothing_attached(r) -> None:
    assert r["agent_rc"] == 0, r["agent_output"][-3000:]
    assert r["progs_after_sigterm"] == []

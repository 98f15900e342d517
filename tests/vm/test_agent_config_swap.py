"""Issue 45 on a real kernel: the agent reloads by itself when its ConfigMap-style directory is updated.

Guest side: tests/vm/scenarios/agent_config_swap.py.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12")]


@pytest.fixture(scope="module")
def r(vm_batch) -> dict:
    return vm_batch["agent_config_swap"]


def test_the_first_config_is_attached(r) -> None:
    m = r["start_metrics"]
    assert m.get("attached:first", 0) > 0 and m["reloads:success"] == 0, (m, r["agent_output"][-3000:])


def test_a_swapped_directory_reloads_by_itself_and_attaches_the_new_set(r) -> None:
    """The watch, not a signal, starts the reload (its trigger says so); how soon is the log's and a bench's
    business, not an assertion's (a loaded machine stretches it)."""
    s = r["swap"]
    assert '"trigger": "file change"' in s["line"] or '"trigger":"file change"' in s["line"], s["line"]
    m = s["metrics"]
    assert m.get("attached:second", 0) > 0 and "attached:first" not in m, m
    assert m["reloads:success"] == 1 and m["reloads:failure"] == 0, m


def test_a_broken_file_keeps_the_running_set_and_counts_a_failure(r) -> None:
    b = r["broken"]
    assert "mode" in b["line"] and "file change" in b["line"], b["line"]
    m = b["metrics"]
    assert m.get("attached:second", 0) > 0 and "attached:third" not in m, m
    assert m["reloads:success"] == 1 and m["reloads:failure"] == 1, m
    assert b["progs"] == r["swap"]["progs"] and b["progs"], b


def test_sigterm_leaves_nothing_attached(r) -> None:
    assert r["agent_rc"] == 0, r["agent_output"][-3000:]
    assert r["progs_after_sigterm"] == []

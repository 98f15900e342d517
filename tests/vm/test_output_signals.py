"""Issue 47 point 2 on a real kernel: a closed or full stdout and stop signals end `trace` as Unix tools end, with
nothing left attached, no traceback; SIGHUP still reloads the agent.

Guest side: tests/vm/scenarios/output_signals.py. The host-side checks that need no kernel:
tests/test_process_streams_host.py and tests/unit/test_process_streams.py.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12")]

NOISE = ("Traceback", "Exception ignored", "BrokenPipeError", "OSError")


def quiet(text: str) -> bool:
    return not any(n in text for n in NOISE)


def test_reader_gone_is_141_quiet_and_detached(vm_batch) -> None:
    r = vm_batch["streams_head"]
    assert r["first_line"] == "Receiving data...\n", r
    assert r["progs_while_attached"], "nothing was attached while receiving"
    assert r["rc"] == 141, r
    assert r["stderr"] == "", r["stderr"]
    assert r["progs_after"] == []


def test_full_stdout_is_one_line_exit_1_and_detached(vm_batch) -> None:
    r = vm_batch["streams_full"]
    lines = r["stderr"].splitlines()
    assert r["rc"] == 1, r
    assert any(line.startswith("Successfully attached") for line in lines), r["stderr"][-2000:]  # it did attach
    assert lines[-1] == "retsnoop-otel: cannot write to stdout: No space left on device", r["stderr"][-2000:]
    assert [line for line in lines if line.startswith("retsnoop-otel:")] == [lines[-1]]
    assert quiet(r["stderr"]), r["stderr"][-3000:]
    assert r["progs_after"] == []


def test_ctrl_c_during_a_large_attach_is_130_and_detached(vm_batch) -> None:
    r = vm_batch["streams_sigint_attach"]
    print(f"sigint_attach: {r['functions']} functions found, attached before the signal: {r['attached']}, "
          f"exit {r['rc']} after {r['exit_s']:.1f} s")
    assert r["functions"] >= 1000, r
    assert not r["received"], "the signal came after the start: the scenario did not test the start"
    assert r["rc"] == 130, r["output"][-3000:]
    assert quiet(r["output"]), r["output"][-3000:]
    assert r["progs_after"] == []


def test_sighup_on_a_running_trace_detaches_and_flushes(vm_batch) -> None:
    r = vm_batch["streams_sighup_running"]
    assert r["started"] and r["progs_while_attached"], r
    assert "array_map_alloc_check" in r["output"]
    assert r["rc"] == 0, r["output"][-3000:]
    assert "Detaching... " in r["output"] and "DONE in" in r["output"], r["output"][-3000:]
    assert quiet(r["output"]), r["output"][-3000:]
    assert r["progs_after"] == []


def test_sighup_still_reloads_the_agent(vm_batch) -> None:
    r = vm_batch["streams_agent_sighup"]
    assert r["reload_line"] == "config reloaded", r["output"][-3000:]
    assert r["running_after_sighup"]
    assert r["rc"] == 0, r["output"][-3000:]
    assert "Traceback" not in r["output"]
    assert r["progs_after"] == []


def test_a_stop_signal_handled_before_the_wait_still_ends_it(vm_batch) -> None:
    """Within the 30 s the wait allows (it returned: the outcome, not a speed), and the same wait without a signal
    lasts its 300 ms: the wake fd ends a wait only when a signal came."""
    r = vm_batch["streams_signal_before_wait"]
    assert r["rc"] == 0, r["err"]
    assert r["stop"] and r["drained"], r
    assert r["returned_s"] < 15 and r["control_s"] >= 0.25, r

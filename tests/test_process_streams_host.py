"""Issue 47 point 2's reproducers that need no kernel, through the installed command as a user runs it: what the
one line says and the exit code. The fuzz (tests/test_fuzz_commands.py) runs the same classes wholesale; the VM
test (tests/vm/test_output_signals.py) the ones that trace.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.command_runs import Case, run_case

TIMEOUT_S = 15.0
CONFIG = "probe_sets:\n  - name: errs\n    entry: ['*sys_bpf']\n    mode: calls\nexporter:\n  file: '{tmp}/f'\n"
FIFO = {"f": {"kind": "fifo"}}


def run(case: Case):
    with tempfile.TemporaryDirectory(prefix="streams-") as tmp:
        return run_case(case, Path(tmp), TIMEOUT_S)


@pytest.mark.parametrize(("argv", "files", "says"), [
    (("trace", "-e", "*sys_bpf", "-J", "@{tmp}/f"), FIFO, "-J @"),
    (("trace", "-e", "*sys_bpf", "-T", "--trace-json", "{tmp}/f"), FIFO, "--trace-json "),
    (("agent", "--config", "{tmp}/a.yaml"), {**FIFO, "a.yaml": CONFIG}, "exporter.file"),
    (("agent", "--check", "{tmp}/a.yaml"), {**FIFO, "a.yaml": CONFIG}, "exporter.file"),
])
def test_a_fifo_output_or_input_is_refused_by_kind_naming_its_flag(argv, files, says) -> None:
    out = run(Case(argv, files=files))
    lines = out.stderr.splitlines()
    assert out.code == 2, out
    assert len(lines) == 1 and says in lines[0] and "FIFO" in lines[0], lines


def test_features_json_to_dev_full_is_one_line_and_exit_1() -> None:
    out = run(Case(("features", "--json"), stdout="full"))
    assert out.code == 1 and out.stderr == "retsnoop-otel: cannot write to stdout: No space left on device\n", out


def test_features_json_to_a_closed_pipe_is_quiet_141() -> None:
    out = run(Case(("features", "--json"), stdout="closed"))
    assert (out.code, out.stderr) == (141, ""), out


def test_bad_glob_with_stderr_full_is_still_bad_input() -> None:
    assert run(Case(("trace", "-e", "["), stderr="full")).code == 2

"""Issue 3 bad input on real kernels: one clear line on stderr, a non-zero exit, nothing attached. An OTEL_* variable
is not the tool's own input: its bad value is one warning line before that (WARNED), and ignored.

Guest side: tests/vm/scenarios/bad_input.py.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vm

# case -> (exit code, what the one line must say)
EXPECTED = {
    "unknown_flag": (2, "unrecognized arguments: --no-such-flag"),
    "unknown_errno": (2, "unknown errno name '-EWHATEVER'"),
    "unbalanced_module_glob": (2, "bad glob 'array_map_* [bpf'"),
    "empty_glob": (2, "bad glob ''"),
    "entry_matches_nothing": (2, "Entry glob 'retsnoop_otel_no_such_func*' doesn't match any kernel function"),
    "vmlinux_other_build": (2, "belongs to another kernel build"),
    "vmlinux_not_elf": (2, "not an ELF vmlinux"),
    "not_root": (1, "needs root or the CAP_BPF and CAP_PERFMON capabilities"),
    "lbr_unavailable": (1, "--lbr needs last branch records, but opening a branch-stack perf event was refused"),
    "lbr_bad_spec": (2, "unknown --lbr value 'sometimes'"),
    "endpoint_scheme": (2, "--otlp-endpoint='ftp://collector:4317': not an http:// or https:// URL"),
    "endpoint_env": (1, "needs root or the CAP_BPF and CAP_PERFMON capabilities"),
    "metrics_port_busy": (1, "the address is already in use"),
    "metrics_port_privileged": (1, "permission denied"),
    "trace_json_unwritable": (2, "--trace-json /proc/version/t.json: Not a directory"),
    "agent_config": (2, "agent.yaml:3: probe_sets[0].entry: expected a list of globs"),
    "web_config_key_mismatch": (2, "web-mismatch.yml:3: tls_server_config.key_file: "),
    "agent_web_config": (2, "web-hash.yml:2: basic_auth_users.alice: the value for user 'alice' is a string that "
                            "is not a bcrypt hash (not shown"),
    "agent_check_all_denied": (2, "It matched only functions that cannot be attached: "),
    "agent_all_denied": (2, "It matched only functions that cannot be attached: "),
}
ALWAYS = set(EXPECTED) - {"vmlinux_not_elf"}  # that one needs the other kernel's image in the cache
WARNED = {"endpoint_env": "retsnoop-otel: warning: OTEL_EXPORTER_OTLP_TIMEOUT='soon': not a positive number"}


def test_every_bad_input_case_ran(vm_batch) -> None:
    r = vm_batch["bad_input"]
    assert ALWAYS <= set(r["cases"]), sorted(r["cases"])
    assert set(r["cases"]) <= set(EXPECTED)
    assert r["progs_before"] == []


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_one_clear_line_and_nothing_attached(vm_batch, case: str) -> None:
    cases = vm_batch["bad_input"]["cases"]
    if case not in cases:
        assert case not in ALWAYS
        return
    c = cases[case]
    rc, phrase = EXPECTED[case]
    lines = [x for x in c["stderr"].splitlines() if x.strip()]
    warned = [x for x in lines if x.startswith("retsnoop-otel: warning: ")]
    assert [w.startswith(WARNED[case]) for w in warned] == ([True] if case in WARNED else []), c["stderr"]
    lines = [x for x in lines if x not in warned]
    assert c["rc"] == rc, c
    assert len(lines) == 1, c["stderr"]
    assert (lines[0].startswith("retsnoop-otel") or case.startswith("agent")) and phrase in lines[0], lines[0]
    assert "Traceback" not in c["stderr"] + c["stdout"]
    assert "Receiving data" not in c["stdout"]
    assert c["progs_after"] == []


def test_check_and_run_refuse_a_set_whose_entries_are_all_denied_alike(vm_batch) -> None:
    """agent --check gives the run's exit code and the run's reason (issue 47: it said 1 on stdout, the run 2)."""
    cases = vm_batch["bad_input"]["cases"]
    check, run = cases["agent_check_all_denied"], cases["agent_all_denied"]
    assert check["rc"] == run["rc"] == 2, (check, run)
    reason = "Entry glob '*sys_bpf' doesn't match any kernel function! It matched only functions that cannot be "
    assert reason in check["stderr"] and reason in run["stderr"], (check["stderr"], run["stderr"])
    assert "denied by '*sys_bpf'" in check["stderr"] and "denied by '*sys_bpf'" in run["stderr"]
    assert check["stdout"].strip() == "", check["stdout"]

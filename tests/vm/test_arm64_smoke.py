"""arm64: Debian's newest arm64 kernel under emulation runs the aarch64 wheel's package (its libbpf, its BPF object
built for arm64's registers): the features report, and a failing bpf() call captured with its arguments and
exported over OTLP, in the default attach mode and with fentry."""

from __future__ import annotations

import json
import re

import pytest

from retsnoop_otel.kernel.tracer import PROGRAM_NAMES
from tests.otlp_json import spans as otlp_spans


@pytest.fixture(scope="module")
def smoke(vm_batch_arm64) -> dict:
    return vm_batch_arm64["arm64_smoke"]


def test_the_guest_runs_the_aarch64_wheel(smoke) -> None:
    assert smoke["machine"] == "aarch64"
    assert smoke["package"].endswith("/build/arm64-site/retsnoop_otel"), smoke["package"]


def test_features_report_on_arm64(smoke) -> None:
    rc, out, err = smoke["features"]
    assert rc == 0, err
    report = json.loads(out)
    assert report["kernel_release"].endswith("-arm64"), report["kernel_release"]
    features = report["features"]
    # what the stack-mode captures below use, found working by loading and attaching real programs
    for name in ("btf", "fentry", "kprobes", "kprobe_multi", "kprobe_session", "ringbuf", "func_ip", "bpf_cookie"):
        assert features[name]["available"], (name, features[name])
    assert report["libbpf_version"] == "1.7"


@pytest.mark.parametrize("mode", ["default", "fentry"])
def test_failing_syscall_captured_and_exported(smoke, mode: str) -> None:
    run = smoke[mode]
    out = run["tracer_output"]
    assert run["simfail_rc"] == 0 and run["tracer_rc"] == 0, out[-3000:]
    assert "__arm64_sys_bpf" in out and "array_map_alloc_check" in out, out[-3000:]
    spans = otlp_spans(run["otlp"])
    errors = {s["name"]: s for s in spans if s["attrs"].get("error.type") == "EINVAL"}
    assert {"__arm64_sys_bpf", "array_map_alloc_check"} <= errors.keys(), sorted(errors)
    # -A: the first argument, read from x0 (kprobe modes: arm64's pt_regs; fentry: the trampoline's context)
    args = errors["array_map_alloc_check"]["attrs"].get("retsnoop.args", [])  # an array attribute: a list
    assert args and args[0].startswith("attr=&{map_type=2,key_size=4,value_size=4,max_entries=0,"), args
    sys_bpf = errors["__arm64_sys_bpf"]
    assert errors["array_map_alloc_check"]["trace"] == sys_bpf["trace"]


ROUND = re.compile(r"round (\d+) tid=(\d+) trace=([0-9a-f]{32}) span=([0-9a-f]{16}) ret=(-?\d+)")


@pytest.mark.parametrize("where", ["exe", "lib"])
def test_sessions_join_the_writers_traces(smoke, where: str) -> None:
    """The thread context read on arm64 (TPIDR_EL0, TLS variant I): the variable in the executable and in a
    TLSDESC library linked at start (static TLS), each found by the user-space locator and read by BPF."""
    run = smoke["app_context"]
    assert run["tracer_rc"] == 0, run["tracer_output"][-3000:]
    rounds = [m for m in map(ROUND.match, run["rounds"][where]) if m]
    assert rounds and all(m[5] == "-1" for m in rounds), run["rounds"][where]  # syscall(): -1, errno EINVAL
    roots = [s for s in otlp_spans(run["otlp"]) if s["name"] == "__arm64_sys_bpf"]
    joined = [(m[3], m[4]) for m in rounds if any(s["trace"] == m[3] and s["parent"] == m[4] for s in roots)]
    # the last round at least: the first ones may run before the background look at running processes
    assert joined and joined[-1] == (rounds[-1][3], rounds[-1][4]), (joined, [(m[3], m[4]) for m in rounds])


def test_nothing_left_attached(smoke) -> None:
    assert not set(smoke["progs_after"]) & PROGRAM_NAMES, smoke["progs_after"]

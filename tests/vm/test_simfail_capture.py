"""Issue 3: every simfail case is captured with the errno it is known to produce, on 6.1 and 6.12.

Guest side: tests/vm/scenarios/simfail_capture.py (one tracer, one `simfail --all` process).
"""

from __future__ import annotations

import pytest

from retsnoop_otel import simfail
from retsnoop_otel.capture.errnos import errno_name

pytestmark = pytest.mark.vm

BPF, PERF = "__x64_sys_bpf", "__x64_sys_perf_event_open"
# case -> (entry function, errno name; per kernel series where they differ), None: the case succeeds
EXPECTED: dict[str, dict[str, tuple[str, str] | None]] = {
    "bpf-bad-map-type": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-create-flags": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-key-size-array": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-key-size-stackmap": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-key-size-ringbuf": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-val-size-percpu-array": {"*": (BPF, "E2BIG")},
    "bpf-bad-map-max-entries-array": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-max-entries-ringbuf": {"*": (BPF, "EINVAL")},
    "bpf-bad-map-lookup-key": {"*": (BPF, "EFAULT")},
    "bpf-bad-map-lookup-value": {"*": (BPF, "EFAULT")},
    "bpf-kprobe-bad-kfunc": {"*": (PERF, "ENOENT")},
    # 8 arguments: x86 trampolines took at most 6 before Linux 6.6 (this module runs on the newest kernel)
    "bpf-fentry-unsupp-func": {"6.1": (BPF, "ENOTSUPP"), "*": None},
    "bpf-simple-obj": {"*": None},
    "bpf-good-map-array": {"*": None},
    "syscall-long-sleep": {"*": None},
    "syscall-short-sleep": {"*": None},
}
# where array_map_alloc_check (in the traced set) is the function that starts the error
ARRAY_CHECK = {"bpf-bad-map-key-size-array": "EINVAL", "bpf-bad-map-max-entries-array": "EINVAL",
               "bpf-bad-map-val-size-percpu-array": "E2BIG"}


def _expected(case: str, series: str) -> tuple[str, str] | None:
    by = EXPECTED[case]
    return by[series] if series in by else by["*"]


def _failing_cases(series: str) -> list[str]:
    return [c for c in simfail.CASES if _expected(c, series) is not None]


def test_table_covers_every_case() -> None:
    assert set(EXPECTED) == set(simfail.CASES)


def test_workload_ran_every_case_with_the_known_errno(vm_batch) -> None:
    r = vm_batch["simfail_capture"]
    results = r["workload"]["results"]
    assert [x["case"] for x in results] == list(simfail.CASES)
    for x in results:
        want = _expected(x["case"], vm_batch.series)
        got = errno_name(x["errno"]) if x["errno"] else None
        assert got == (want[1] if want else None), x


def test_every_failing_case_is_captured_in_order_with_its_errno(vm_batch) -> None:
    r = vm_batch["simfail_capture"]
    sessions = r["sessions"]
    cases = _failing_cases(vm_batch.series)
    # one error session per failing case, none for the successful ones (no -S)
    assert len(sessions) == len(cases), [[c["function"] for c in s["chain"]] for s in sessions]
    for case, s in zip(cases, sessions, strict=True):
        entry, err = _expected(case, vm_batch.series)  # type: ignore[misc]
        assert s["is_err"], (case, s)
        assert s["chain"][0]["function"] == entry, (case, s["chain"])
        # every traced level on the error chain carries the same errno
        assert [c["error"] for c in s["chain"]] == [err] * len(s["chain"]), (case, s["chain"])
        if entry == BPF and "lookup" not in case and case != "bpf-fentry-unsupp-func":
            assert "map_create" in [c["function"] for c in s["chain"]], (case, s["chain"])
        if case == "bpf-fentry-unsupp-func":  # the trampoline refuses the 8-argument function
            assert s["chain"][-1]["function"] == "bpf_trampoline_link_prog", s["chain"]
        if case in ARRAY_CHECK:
            assert s["chain"][-1]["function"] == "array_map_alloc_check", (case, s["chain"])
            assert s["chain"][-1]["result"] == f"-{ARRAY_CHECK[case]}"


def test_tracer_detached_cleanly(vm_batch) -> None:
    t = vm_batch["simfail_capture"]["tracer"]
    assert t["rc"] == 0 and "Traceback" not in t["output"]
    assert t["progs_after"] == []

"""Issue 46 point 5 on real kernels: `trace --syscalls` attaches every syscall entry and its errno-returning allow
set in the kernel's multi-attach mode, and captures a failing bpf() with its entry syscall and its error origin.

Guest side: tests/vm/scenarios/syscalls_preset.py (one tracer run per kernel).
"""

from __future__ import annotations

import re

import pytest

from tests.vm.scenarios.syscalls_preset import FAILS

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12", "newest")]


def _run(vm_batch) -> dict:
    return vm_batch["syscalls_preset"]


def test_the_workload_failed_as_planned(vm_batch) -> None:
    assert _run(vm_batch)["workload"] == [0, f"{FAILS} True"], _run(vm_batch)["workload"]


def test_the_preset_attached_every_syscall_entry_and_an_allow_set_in_one_call(vm_batch) -> None:
    log = "\n".join(_run(vm_batch)["log"])
    m = re.search(r"would attach (\d+) \((\d+) entry\) in (\w+) mode", log)
    assert m, log
    total, entries = int(m.group(1)), int(m.group(2))
    assert entries > 300 and total - entries > 500, log
    assert m.group(3) == "kprobe_session", log  # the cheapest multi-attach mode both kernels have
    assert re.search(rf"^Phase discovery: \d+ ms \({total} functions \({entries} syscall entries\)\)", log, re.M), log


def test_the_syscall_entries_start_their_sessions_at_the_syscall_tracepoints(vm_batch) -> None:
    """Every native syscall entry the preset takes is hooked by number (bpf/syscalls.bpf.h). The rest stay on
    kprobe.session: what the number table does not know (sys_ni_syscall, syscalls newer than the table) and the
    `__x64_sys_*` stubs of syscalls only other ABIs have (waitpid, stime, ...), which never run here."""
    log = "\n".join(_run(vm_batch)["log"])
    entries = int(re.search(r"would attach \d+ \((\d+) entry\)", log).group(1))
    m = re.search(r"^Phase attach: .*, (\d+) syscall entries at the sys_enter and sys_exit tracepoints", log, re.M)
    assert m, log
    assert 300 <= int(m.group(1)) <= entries, log  # 347 of 445 on 7.2


def test_a_32_bit_syscall_is_not_taken_for_the_native_one_of_its_number(vm_batch) -> None:
    run = _run(vm_batch)
    assert run["ia32_rc"] == 2, run["ia32_rc"]  # its open failed with ENOENT: the ia32 syscall did run
    entries = {s["chain"][0]["function"] for s in run["sessions"] if s["chain"]}
    assert "__x64_sys_newfstat" not in entries, entries


def test_each_failing_bpf_call_is_captured_with_its_entry_and_origin(vm_batch) -> None:
    sessions = _run(vm_batch)["sessions"]
    bpf = [s for s in sessions if s["chain"] and s["chain"][0]["function"] == "__x64_sys_bpf"]
    assert len(bpf) == FAILS, [[c["function"] for c in s["chain"]] for s in sessions]
    for s in bpf:
        assert s["is_err"] and s["origin"] == {"function": "array_map_alloc_check", "error": "EINVAL"}, s
        assert s["chain"][-1]["function"] == "array_map_alloc_check", s["chain"]


def test_the_failing_open_is_captured_with_its_entry_and_an_origin(vm_batch) -> None:
    sessions = _run(vm_batch)["sessions"]
    opens = [s for s in sessions if s["chain"] and s["chain"][0]["function"] in ("__x64_sys_openat", "__x64_sys_open")]
    assert opens, [[c["function"] for c in s["chain"]] for s in sessions]
    assert any(s["origin"]["error"] == "ENOENT" for s in opens), opens


def test_the_tracer_detached_cleanly(vm_batch) -> None:
    t = _run(vm_batch)["tracer"]
    assert t["rc"] == 0 and "Traceback" not in t["output"], t["output"][-3000:]
    assert t["progs_after"] == []


def _origins_only(vm_batch) -> dict:
    return vm_batch["syscalls_origins_only"]


def test_origins_only_attaches_the_preset_by_its_returns(vm_batch) -> None:
    """--origins-only: the same functions, the numbered syscall entries ended at the sys_exit tracepoint (no
    sys_enter, no session), the others' returns in one kretprobe.multi call per group, or on 7.2 the inner
    functions' in one fexit.multi link per group (origin_fexits)."""
    run = _origins_only(vm_batch)
    log = "\n".join(run["log"])
    assert run["workload"] == [0, f"{FAILS} True"], run["workload"]
    mode = "origin_fexits" if vm_batch.at_least(7, 2) else "origin_exits"
    m = re.search(rf"would attach (\d+) \((\d+) entry\) in {mode} mode", log)
    assert m and int(m.group(2)) > 300 and int(m.group(1)) - int(m.group(2)) > 500, log
    tp = re.search(rf"^Phase attach: \d+ ms \({m.group(1)} functions, {mode}, (\d+) syscall entries at the "
                   r"sys_exit tracepoint\)$", log, re.M)
    assert tp and 300 <= int(tp.group(1)) <= int(m.group(2)), log
    assert run["sessions"] == [], run["sessions"][:3]  # counts only
    t = run["tracer"]
    assert t["rc"] == 0 and "Traceback" not in t["output"] and t["progs_after"] == [], t["output"][-3000:]


def test_origins_only_counts_each_failing_call_where_the_sessions_find_its_origin(vm_batch) -> None:
    """The chain rebuilt from the returns alone names the origin the preset's sessions name (the scenario before,
    in the same boot): the failing bpf() calls' map callback, and the failing open's deepest failing function, deep
    in the path walk. The 32-bit open goes through another entry function, which the preset does not take."""
    (table,) = _origins_only(vm_batch)["table"]
    rows = {(r["entry"], r["origin"], r["error"]): r["count"] for r in table["origins"]}
    assert rows.get(("__x64_sys_bpf", "array_map_alloc_check", "EINVAL")) == FAILS, rows
    opens = [s for s in _run(vm_batch)["sessions"]
             if s["chain"] and s["chain"][0]["function"] in ("__x64_sys_openat", "__x64_sys_open")]
    want = {(s["chain"][0]["function"], s["origin"]["function"], s["origin"]["error"]) for s in opens}
    assert want and all(rows.get(k) == 1 for k in want), (rows, want)
    assert not any(entry == "__x64_sys_newfstat" for entry, _, _ in rows), rows  # the 32-bit open's number (5)
    failing = [s for s in _run(vm_batch)["sessions"] if s["is_err"]]  # of the same comm, and the same workload
    assert sum(rows.values()) == len(failing), (rows, [[c["function"] for c in s["chain"]] for s in failing])


def test_a_fexit_programs_stack_position_is_the_one_a_kretprobe_reads(vm_batch) -> None:
    """Where the trampoline refuses a function, --origins-only links it by kretprobe.multi beside fexit.multi links:
    the stack pointer derived in the trampoline (FEXIT_RET_SLOT) must equal kretprobe's at every return, for
    functions with arguments in registers and on the stack. Before 7.2 the feature check finds no fexit.multi."""
    r = vm_batch["stack_position"]
    available, detail = r["fexit_multi"]
    assert available == vm_batch.at_least(7, 2), detail
    if not available:
        assert "Linux 7.2+ needed" in detail, detail
        return
    assert min(r["args"].values()) == 1 and max(r["args"].values()) > 6, r["args"]  # do_mmap: stack arguments
    assert all(all(fexit) and all(kret) for fexit, kret in r["sp"].values()), r["sp"]  # each return seen by both
    apart = {name: [f - k for f, k in zip(fexit, kret, strict=True)] for name, (fexit, kret) in r["sp"].items()}
    assert apart == {name: [0] * len(fexit) for name, (fexit, _) in r["sp"].items()}, (apart, r["args"])

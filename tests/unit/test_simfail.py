"""simfail: listing, argument errors, the judging of outcomes, and the map cases against the host kernel.

The host kernel lets root create maps and load socket-filter programs, so the map cases and the
hand-assembled counter program run for real here; kprobe/fentry cases are checked in the VM.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from retsnoop_otel import simfail
from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel.caps import can_trace, effective_caps

needs_bpf = pytest.mark.skipif(not can_trace(effective_caps()),
                               reason="creating BPF maps needs CAP_BPF (run the tests as root)")

# What kernels 6.1, 6.12 and the host's 6.18 answer (verified on all three).
MAP_CASES = {
    "bpf-bad-map-type": errno.EINVAL,
    "bpf-bad-map-create-flags": errno.EINVAL,
    "bpf-bad-map-key-size-array": errno.EINVAL,
    "bpf-bad-map-key-size-stackmap": errno.EINVAL,
    "bpf-bad-map-key-size-ringbuf": errno.EINVAL,
    "bpf-bad-map-val-size-percpu-array": errno.E2BIG,
    "bpf-bad-map-max-entries-array": errno.EINVAL,
    "bpf-bad-map-max-entries-ringbuf": errno.EINVAL,
    "bpf-bad-map-lookup-key": errno.EFAULT,
    "bpf-bad-map-lookup-value": errno.EFAULT,
}


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_every_retsnoop_case_is_registered() -> None:
    retsnoop_cases = set(MAP_CASES) | {"bpf-kprobe-bad-kfunc", "bpf-fentry-unsupp-func", "bpf-simple-obj",
                                       "syscall-long-sleep"}
    assert set(simfail.CASES) == retsnoop_cases | {"bpf-good-map-array", "syscall-short-sleep"}
    for name, errno_value in MAP_CASES.items():
        assert simfail.CASES[name].expected_errno == errno_value, name


def test_list_shows_every_case_with_description(capsys) -> None:
    assert simfail.main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(simfail.CASES)
    for line, case in zip(out, simfail.CASES.values(), strict=True):
        assert line.startswith(case.name + " ")
        assert case.description in line
    assert any("bpf-bad-map-max-entries-array" in x and "-EINVAL" in x for x in out)
    assert any("bpf-simple-obj" in x and "[succeeds]" in x for x in out)


def test_unknown_case_is_one_clear_error(capsys) -> None:
    assert simfail.main(["bpf-bad-map-type", "no-such-case"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [
        "retsnoop-otel simfail: unknown case 'no-such-case' (retsnoop-otel simfail --list shows the cases)"]


def test_no_case_and_bad_repeat_are_usage_errors(capsys) -> None:
    assert simfail.main([]) == 2
    assert simfail.main(["-r", "0", "bpf-bad-map-type"]) == 2
    assert "no case given" in capsys.readouterr().err


def test_sleep_cases_take_their_time(capsys) -> None:
    t0 = time.monotonic()
    assert simfail.main(["syscall-short-sleep"]) == 0
    short = time.monotonic() - t0
    assert capsys.readouterr().out.startswith("syscall-short-sleep: succeeded as expected: slept 0.0")
    assert 0.001 <= short < 0.5
    assert simfail.CASES["syscall-long-sleep"].fails_at is None


def test_comm_sets_the_thread_name_the_kernel_reports(capsys) -> None:
    comm = Path("/proc/thread-self/comm")
    before = comm.read_text().strip()
    try:
        assert simfail.main(["--comm", "sfa", "syscall-short-sleep"]) == 0
        assert comm.read_text().strip() == "sfa"
    finally:
        simfail.set_thread_name(before)
    assert comm.read_text().strip() == before


def test_comm_longer_than_the_kernel_keeps_is_refused(capsys) -> None:
    assert simfail.main(["--comm", "x" * 16, "syscall-short-sleep"]) == 2
    assert simfail.main(["--comm", "", "syscall-short-sleep"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("--comm needs 1 to 15 bytes" in x for x in err)


def test_wait_signal_prints_pid_and_runs_only_after_sigusr1() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "simfail", "--comm", "sfwait", "--wait-signal",
                             "syscall-short-sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == f"PID {proc.pid}"
        time.sleep(0.3)
        assert proc.poll() is None, "must wait for SIGUSR1"
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sfwait"
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.startswith("syscall-short-sleep: succeeded as expected: slept ")


def test_kernel_series() -> None:
    assert simfail.kernel_series("6.12.117+deb12-amd64") == "6.12"
    assert simfail.kernel_series("6.1.0-56-amd64") == "6.1"


def _case(run, fails_at, expected, by_series=None) -> simfail.Case:
    return simfail.Case("t", "test", run, fails_at, expected, by_series or {})


def _fail_at(step: str, err: int):
    def run(res: ExitStack) -> str:
        raise simfail.StepFailed(step, err)
    return run


def test_judging_outcomes() -> None:
    r = simfail.run_case(_case(_fail_at(simfail.S_CREATE, errno.EINVAL), simfail.S_CREATE, errno.EINVAL), "6.1")
    assert (r.as_designed, r.errno) == (True, errno.EINVAL)
    assert r.message == "t: bpf(BPF_MAP_CREATE) failed as expected: -EINVAL"
    # Right call, other errno: still the designed failure, and the message says what was expected.
    r = simfail.run_case(_case(_fail_at(simfail.S_CREATE, errno.ENOMEM), simfail.S_CREATE, errno.E2BIG), "6.1")
    assert r.as_designed and "-ENOMEM" in r.message and "-E2BIG" in r.message
    # Per-series expectation.
    r = simfail.run_case(_case(_fail_at(simfail.S_LINK, errno.EBUSY), simfail.S_LINK, 524, {"6.12": errno.EBUSY}),
                         "6.12")
    assert r.message == "t: bpf(BPF_LINK_CREATE) failed as expected: -EBUSY"
    # Failing earlier than designed (e.g. the load refused with EPERM) is not the case's failure.
    r = simfail.run_case(_case(_fail_at(simfail.S_LOAD, errno.EPERM), simfail.S_LINK, 524), "6.1")
    assert not r.as_designed and r.step == simfail.S_LOAD and "-EPERM" in r.message
    r = simfail.run_case(_case(lambda res: "attached", simfail.S_LINK, 524), "6.12")
    assert not r.as_designed and "unexpectedly succeeded" in r.message
    r = simfail.run_case(_case(lambda res: "fine", None, None), "6.1")
    assert r.as_designed and r.message == "t: succeeded as expected: fine"
    r = simfail.run_case(_case(_fail_at(simfail.S_LOAD, errno.EPERM), None, None), "6.1")
    assert not r.as_designed


def test_cannot_run_is_not_as_designed() -> None:
    def run(res: ExitStack) -> str:
        raise simfail.CannotRun("no kprobe PMU")
    r = simfail.run_case(_case(run, simfail.S_KPROBE, errno.ENOENT), "6.18")
    assert not r.as_designed and r.message == "t: cannot run here: no kprobe PMU"


def test_fds_are_closed_when_a_later_step_fails() -> None:
    opened: list[int] = []

    def run(res: ExitStack) -> str:
        fd = os.open("/dev/null", os.O_RDONLY)
        opened.append(fd)
        res.callback(os.close, fd)
        raise simfail.StepFailed(simfail.S_LINK, 524)
    simfail.run_case(_case(run, simfail.S_LINK, 524), "6.1")
    with pytest.raises(OSError):
        os.fstat(opened[0])


@needs_bpf
@pytest.mark.parametrize("name", sorted(MAP_CASES))
def test_map_case_on_host_kernel(name: str, capsys) -> None:
    before = _open_fds()
    assert simfail.main([name]) == 0
    out = capsys.readouterr().out.strip()
    step = simfail.S_LOOKUP if "lookup" in name else simfail.S_CREATE
    assert out == f"{name}: {step} failed as expected: -{errno.errorcode[MAP_CASES[name]]}"
    assert _open_fds() == before


@needs_bpf
@pytest.mark.parametrize("name", ["bpf-good-map-array", "bpf-simple-obj"])
def test_success_cases_on_host_kernel(name: str, capsys) -> None:
    before = _open_fds()
    assert simfail.main([name]) == 0
    assert capsys.readouterr().out.startswith(f"{name}: succeeded as expected: ")
    assert _open_fds() == before


@needs_bpf
def test_repeat_with_delay_summarises(capsys) -> None:
    assert simfail.main(["-r", "3", "--delay-ms", "1", "bpf-bad-map-max-entries-array"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["bpf-bad-map-max-entries-array: bpf(BPF_MAP_CREATE) failed as expected: -EINVAL",
                     "bpf-bad-map-max-entries-array: 3/3 runs behaved as designed"]


class _TestRunAttr(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("data_size_in", ctypes.c_uint32),
                ("data_size_out", ctypes.c_uint32), ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32)]


@needs_bpf
def test_counter_program_really_counts() -> None:
    """Run simfail's hand-assembled program (as a socket filter, which BPF_PROG_TEST_RUN supports)."""
    with ExitStack() as res:
        var = bpfsys.map_create(bpfsys.MAP_ARRAY, 4, 8, 1, name=b"test_counter")
        res.callback(os.close, var)
        prog = bpfsys.prog_load(1, bpfsys.counter_prog(var), log=True)  # BPF_PROG_TYPE_SOCKET_FILTER
        res.callback(os.close, prog)
        packet = ctypes.create_string_buffer(64)
        attr = _TestRunAttr(prog_fd=prog, data_size_in=64, data_in=ctypes.addressof(packet), repeat=5)
        bpfsys.sys_bpf(10, attr, "bpf(BPF_PROG_TEST_RUN)")
        key, value = ctypes.c_uint32(0), ctypes.c_uint64(0)
        bpfsys.map_lookup_elem(var, ctypes.addressof(key), ctypes.addressof(value))
        assert (attr.retval, value.value) == (0, 5)


@needs_bpf
def test_bad_program_carries_the_verifier_log() -> None:
    with pytest.raises(bpfsys.BpfLoadError) as info:
        bpfsys.prog_load(bpfsys.PROG_KPROBE, bpfsys.exit_insn(), log=True)  # r0 never set
    assert info.value.errno == errno.EACCES
    assert "R0" in info.value.log


def test_syscall_numbers_per_machine() -> None:
    assert bpfsys._numbers("x86_64") == (321, 298)
    assert bpfsys._numbers("aarch64") == (280, 241)
    with pytest.raises(OSError) as info:
        bpfsys._numbers("riscv64")
    assert info.value.errno == errno.ENOSYS


def test_instruction_encoding() -> None:
    assert bpfsys.RETURN_ZERO == bytes.fromhex("b700000000000000" "9500000000000000")
    # ld_imm64 r1 = map fd 7: src_reg BPF_PSEUDO_MAP_FD in the high nibble, then an empty second slot.
    assert bpfsys.ld_map_fd(bpfsys.R1, 7) == bytes.fromhex("1811000007000000" "0000000000000000")
    assert len(bpfsys.counter_prog(3)) == 11 * 8

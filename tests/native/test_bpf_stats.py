"""BPF program cost (bpf_stats) read from the host kernel: struct layout, real run counts, exposition.

The programs are the real BPF object's, attached through uprobes to tests/native/simkern.c (the
host forbids kernel tracing); kernel.bpf_stats_enabled is switched on for the test and restored.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.utils import floatToGoString

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.libbpf_btf import BTF_KIND_STRUCT, Btf
from retsnoop_otel.kernel.libbpf_progs import ProgInfo, prog_info
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.metrics.kernel_families import KernelCollector, read_bpf_stats_enabled
from retsnoop_otel.metrics.runtime_families import RunCounters, RuntimeCollector
from retsnoop_otel.symbols.user_funcs import in_binary
from tests.fakes import FakeProbeSet, make_registry

HERE = Path(__file__).parent
SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
# sk_syscall(5) runs sk_syscall, sk_create, sk_check, sk_alloc, sk_flag and sk_log: six traced calls
FUNCS = [TracedFunc(0, "sk_syscall", 0, RetKind.SIGNED, True), TracedFunc(1, "sk_create", 0, RetKind.SIGNED, False),
         TracedFunc(2, "sk_check", 0, RetKind.INT32, False), TracedFunc(3, "sk_alloc", 0, RetKind.POINTER, False),
         TracedFunc(4, "sk_log", 0, RetKind.VOID, False), TracedFunc(5, "sk_flag", 0, RetKind.BOOL, False)]
CALLS_PER_SYSCALL = 6


@pytest.fixture(scope="module")
def simkern(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ctypes.CDLL]:
    out = tmp_path_factory.mktemp("simkern") / "libsimkern.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(HERE / "simkern.c")], check=True)
    return str(out), ctypes.CDLL(str(out))


@pytest.fixture()
def bpf_stats_on():
    """kernel.bpf_stats_enabled=1 for the test, then the previous value again."""
    try:
        before = SYSCTL.read_text()
        SYSCTL.write_text("1\n")
    except OSError as exc:
        pytest.skip(f"cannot set kernel.bpf_stats_enabled: {exc}")
    try:
        yield
    finally:
        SYSCTL.write_text(before)


def test_prog_info_layout_matches_kernel_btf():
    btf = Btf.load_vmlinux()
    try:
        sid = btf.find("bpf_prog_info", BTF_KIND_STRUCT)
        assert sid
        kernel = {name: bit_off // 8 for name, _t, bit_off, _bits in btf.members(sid)}
    finally:
        btf.free()
    ours = {name: getattr(ProgInfo, name).offset for name, _ in ProgInfo._fields_}
    assert {n: kernel[n] for n in ours} == ours
    assert ctypes.sizeof(ProgInfo) == kernel["recursion_misses"] + 8


def test_run_counts_and_time_of_the_attached_programs(simkern, bpf_stats_on):
    path, lib = simkern
    tracer = Tracer(in_binary(FUNCS, path),
                    CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()], exclude_self=False))
    try:
        tracer.load()
        tracer.attach(strict=True)
        progs = dict(tracer.programs())
        assert sorted(progs) == ["kprobe_entry", "kretprobe_exit"]
        assert prog_info(progs["kprobe_entry"]).name == b"kprobe_entry"  # the fd is that program
        before = {p.name: p for p in tracer.program_stats()}
        for _ in range(10):
            lib.sk_syscall(5)
        after = {p.name: p for p in tracer.program_stats()}
        for name in ("kprobe_entry", "kretprobe_exit"):
            assert after[name].run_cnt - before[name].run_cnt == 10 * CALLS_PER_SYSCALL, name
            assert after[name].run_time_ns > before[name].run_time_ns, name
        assert read_bpf_stats_enabled()
        ps = FakeProbeSet(name="native", funcs=FUNCS, stats=tracer.func_stats)
        ps.program_stats = tracer.program_stats  # the real BPF_OBJ_GET_INFO_BY_FD reads
        text = generate_latest(make_registry(KernelCollector(lambda: [ps]), RuntimeCollector(RunCounters))).decode()
        final = {p.name: p for p in tracer.program_stats()}
    finally:
        tracer.close()
    entry = final["kprobe_entry"]
    assert f'retsnoop_bpf_program_runs_total{{probe_set="native",program="kprobe_entry"}} {entry.run_cnt:.1f}\n' \
        in text
    assert (f'retsnoop_bpf_program_run_seconds_total{{probe_set="native",program="kprobe_entry"}} '
            f'{floatToGoString(entry.run_time_ns / 1e9)}\n') in text
    assert "retsnoop_bpf_stats_enabled 1.0\n" in text


def test_prog_info_of_a_non_bpf_fd_raises_instead_of_reading_zeros():
    r, w = os.pipe()
    try:
        with pytest.raises(lb.LibbpfError) as exc:
            prog_info(r)
    finally:
        os.close(r)
        os.close(w)
    assert exc.value.errno == errno.EINVAL
    assert str(exc.value) == f"get info of BPF program fd {r}: Invalid argument (errno 22)"

"""The command line on the development host, whose kernel refuses kernel-function tracing."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retsnoop_otel", *args], capture_output=True, text=True, timeout=120)


def test_features_reports_truthfully_without_traceback():
    proc = _run("features")
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr + proc.stdout
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.startswith("  ")}
    for name in ("btf", "fentry", "kprobes", "kprobe_multi", "ringbuf", "func_ip", "bpf_cookie",
                 "branch_snapshot", "lbr", "filter_functions", "kallsyms", "capabilities"):
        assert name in rows, name


def _host_can_trace() -> tuple[bool, bool]:
    """(fentry loads, kprobes exist), found without the features command: the ground truth for its report."""
    from pathlib import Path

    from retsnoop_otel.kernel import libbpf as lb
    from retsnoop_otel.kernel.tracer import bpf_object_path
    obj = lb.BpfObject.open_file(str(bpf_object_path()))
    try:
        for name in ("fentry_entry", "fexit_exit", "kprobe_entry", "kretprobe_exit", "kmulti_entry", "kmulti_exit"):
            obj.program(name).set_autoload(name == "fentry_entry")
        try:
            obj.load()
            fentry = True
        except lb.LibbpfError as exc:
            assert exc.errno == errno.EPERM, exc  # the refusal this host is known for
            fentry = False
    finally:
        obj.close()
    return fentry, Path("/sys/bus/event_source/devices/kprobe").exists()


def test_features_report_matches_what_the_kernel_does():
    fentry, kprobes = _host_can_trace()
    rows = {line.split()[0]: line for line in _run("features").stdout.splitlines()[1:] if line.startswith("  ")}
    assert ("yes" in rows["fentry"].split()[1]) == fentry, rows["fentry"]
    if not fentry:
        assert "refused (EPERM)" in rows["fentry"], rows["fentry"]
    assert rows["kprobes"].split()[1] == ("yes" if kprobes else "NO"), rows["kprobes"]
    if not kprobes:
        assert "not configured" in rows["kprobes"], rows["kprobes"]


def test_trace_refused_with_one_clear_sentence_when_kernel_forbids_tracing():
    fentry, kprobes = _host_can_trace()
    if fentry or kprobes:
        pytest.skip("this host can trace kernel functions: the refusal is not expected here (VM tests cover tracing)")
    proc = _run("trace", "-e", "*sys_bpf")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    msg = proc.stderr.strip()
    assert len(msg.splitlines()) == 1
    assert "fentry" in msg and "kprobes" in msg and "VM" in msg


def test_bad_flags_exit_2_with_message():
    proc = _run("trace", "--no-such-flag")
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr
    proc = _run("trace", "-e", "*sys_bpf", "-x", "EWHATEVER")
    assert proc.returncode == 2 and "unknown errno name 'EWHATEVER'" in proc.stderr
    proc = _run("trace", "-e", "*sys_bpf", "-L", "0")
    assert proc.returncode == 2 and "positive number of milliseconds" in proc.stderr
    proc = _run("trace")
    assert proc.returncode == 2 and "entry glob" in proc.stderr


def test_version():
    proc = _run("-V")
    assert proc.returncode == 0 and proc.stdout.startswith("retsnoop-otel v")
    assert len(proc.stdout.splitlines()) == 1
    proc = _run("-Vv")  # version, then what the running kernel allows
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[0].startswith("retsnoop-otel v")
    assert any(line.split()[:1] == ["fentry"] for line in lines[1:]), proc.stdout


def test_lbr_refused_before_loading_when_the_cpu_has_none():
    if " lbr               yes" in _run("features").stdout:
        return  # a host with LBR: this refusal does not apply
    proc = _run("trace", "-e", "*sys_bpf", "--lbr")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("retsnoop-otel: --lbr needs last branch records"), lines
    assert "run without --lbr" in lines[0]
    proc = _run("trace", "-e", "*sys_bpf", "-B", "ind_jump", "--lbr-max-count", "0")
    assert proc.returncode == 2 and "--lbr-max-count needs --lbr and a positive count" in proc.stderr

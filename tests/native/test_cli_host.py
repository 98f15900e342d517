"""The command line on the development host, whose kernel refuses kernel-function tracing."""

from __future__ import annotations

import subprocess
import sys


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


def test_trace_refused_with_one_clear_sentence_when_kernel_forbids_tracing():
    feats = _run("features").stdout
    fentry_ok = " fentry            yes" in feats
    kprobes_ok = " kprobes           yes" in feats
    proc = _run("trace", "-e", "*sys_bpf")
    if fentry_ok or kprobes_ok:
        return  # a host that can trace: covered by the VM tests
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

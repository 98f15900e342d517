"""Guest side of the capture in every attach mode, on every kernel: trace -> text, OTLP, metrics, detach.

Runs inside the VM on each kernel the tests name (tests/vm/test_trace_modes.py holds the assertions): a mode the
kernel has captures the failing bpf() call, a mode it lacks is refused in one line, and nothing stays attached.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.procs import without_system_libbpf
from tests.vm.traced_run import our_progs, traced_run

PY = sys.executable


def _wait_file_lines(path: Path, want: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    lines: list[dict] = []
    while time.monotonic() < deadline:
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            if len(lines) >= want:
                break
        time.sleep(0.5)
    return lines


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        return resp.read().decode()


def scenario_trace_otlp_metrics(ctx) -> dict:
    """The issue-2 chain: one failing bpf() call, seen as text, as one OTLP trace and as a metric."""
    result: dict = {}
    out_file = Path(ctx.tmpdir) / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)])
    m = receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=240)  # OTLP/HTTP: the default protocol
    port = int(m.group(1))
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "-a", "array_map_alloc_check",
                        "--otlp-endpoint", f"http://127.0.0.1:{port}", "--web.listen-address", "127.0.0.1:9464", "-v"])
    try:
        tracer.wait_for_line(r"Receiving data", timeout=300)
        result["progs_while_attached"] = our_progs(ctx)
        rc, sout, serr = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 120)
        result["simfail"] = {"rc": rc, "out": sout, "err": serr}
        tracer.wait_for_line(r"array_map_alloc_check", timeout=120)
        tracer.wait_output_settled(3, timeout=60)
        result["metrics"] = _scrape(9464)
        result["otlp"] = _wait_file_lines(out_file, 1, timeout=120)
    finally:
        t0 = time.monotonic()
        result["tracer_rc"] = tracer.terminate(timeout=240)
        result["detach_s"] = time.monotonic() - t0
        result["tracer_output"] = tracer.output()
        receiver.terminate(timeout=30)
    time.sleep(1)
    result["progs_after"] = our_progs(ctx)
    return result


def trace_mode(ctx, mode_flag: str, case: str, extra: list[str] | None = None,
                stop: signal.Signals = signal.SIGTERM, wrap: Callable[[list[str]], list[str]] = list) -> dict:
    cmd = wrap([PY, "-m", "retsnoop_otel", "trace", mode_flag, "-e", "*sys_bpf", "-a", "array_map_alloc_check", "-v",
                *(extra or [])])
    return traced_run(ctx, cmd, [PY, "-m", "retsnoop_otel", "simfail", case], r"array_map_alloc_check",
                      settle_s=3, stop=stop, wait_timeout=120)


def scenario_trace_fentry(ctx) -> dict:
    """With _printk too: variadic, so the kernel refuses fentry programs for it, and first by name among the
    other functions, so the templates are first verified against it."""
    return trace_mode(ctx, "-F", "bpf-bad-map-max-entries-array", extra=["-a", "_printk"])


def scenario_trace_kprobe(ctx) -> dict:
    """Stopped with Ctrl-C; the system's libbpf hidden from the tracer (it loads the one built with the package)."""
    return trace_mode(ctx, "-K", "bpf-bad-map-max-entries-array", stop=signal.SIGINT, wrap=without_system_libbpf)


def scenario_trace_kprobe_multi(ctx) -> dict:
    return trace_mode(ctx, "-M", "bpf-bad-map-max-entries-array")


def scenario_trace_kprobe_session(ctx) -> dict:
    """6.12: one program at entry and exit; 6.1 (no kprobe.session) refuses it in one line."""
    return trace_mode(ctx, "--kprobe-session", "bpf-bad-map-max-entries-array")


def scenario_trace_fsession(ctx) -> dict:
    """7.x: one trampoline program per function for entry and exit; with _printk, which the kernel refuses (variadic)
    and which comes first among the others, as for fentry. Before 7.0: refused in one line."""
    return trace_mode(ctx, "--fsession", "bpf-bad-map-max-entries-array", extra=["-a", "_printk"])


def scenario_trace_fsession_multi(ctx) -> dict:
    """7.2: one tracing_multi link for every function; the kernel refuses the link whole for _printk, which is then
    left out alone. Before 7.2: refused in one line."""
    return trace_mode(ctx, "--fsession-multi", "bpf-bad-map-max-entries-array", extra=["-a", "_printk"])

"""Guest side of injected probes (-J, issue 35): a tracepoint and a kprobe inside a traced function, seen in the
session where they fired as text, --json, Perfetto and OTLP span events at a real receiver; a kprobe offset the
kernel refuses is one message and exit 2 with nothing attached. Assertions: tests/vm/test_inject.py.

The kprobe's offset is found on this kernel, not written down: the kprobe PMU accepts an offset only where an
instruction starts (x86 decodes the function from its start), so the first offset past the ftrace call site it
accepts is a real instruction boundary in the function's prologue (run on every call), and the first it refuses is
the bad one. syscalls:sys_exit_bpf fires in the syscall's exit work, after __x64_sys_bpf returned, so sessions of
a function of the exit work (an entry function too, EXIT_WORK) hold it; simfail names its thread (--comm) so that
-n keeps only its own.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

from retsnoop_otel.kernel import bpfsys
from tests.vm.guest_batch import budget
from tests.vm.scenarios.trace_modes import PY, _wait_file_lines
from tests.vm.traced_run import traced_run

FUNC = "array_map_alloc_check"
CASE = "bpf-bad-map-max-entries-array"
COMM = "injsimfail"
# functions that run a syscall's sys_exit tracepoint, by preference: the exit work itself, the helper that fires the
# tracepoint (7.2: the exit work is not traceable there), the function around the inlined exit work (6.12). Not the
# tracepoint's iterator (__traceiter_sys_exit): with one probe attached the kernel's static call bypasses it.
EXIT_WORK = ("syscall_exit_work", "trace_syscall_exit", "syscall_exit_to_user_mode_prepare")
TP = "tp:syscalls:sys_exit_bpf"


def _kprobe_offsets(func: str, upto: int = 48) -> tuple[list[int], list[int]]:
    """(accepted, refused) offsets of a kprobe on `func`, asked of the kernel through the kprobe PMU."""
    pmu = bpfsys.kprobe_pmu_type()
    accepted, refused = [], []
    for off in range(1, upto):
        name = ctypes.create_string_buffer(func.encode())
        attr = bpfsys.PerfEventAttr(type=pmu, config=0, sample_period=1, wakeup_events=1,
                                    config1=ctypes.addressof(name), config2=off)
        try:
            fd = bpfsys.perf_event_open(attr, pid=-1, cpu=0)
        except OSError:
            refused.append(off)
            continue
        os.close(fd)
        accepted.append(off)
    return accepted, refused


def _traceable(*words: str) -> list[str]:
    """The traceable functions whose names hold one of `words`."""
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        try:
            with open(f"{root}/available_filter_functions") as f:
                return sorted({name for line in f if (name := line.split(" ")[0].strip()) and
                               any(w in name for w in words)})
        except OSError:
            continue
    return []


def _run(ctx, exit_entry: str, flags: list[str], otlp_port: int | None = None, trace_json: str | None = None,
         wait_for: str = r'◎ tp:syscalls:sys_exit_bpf|"probe": "tp:syscalls:sys_exit_bpf"') -> dict:
    cmd = [PY, "-m", "retsnoop_otel", "trace", "-e", "*_sys_bpf", "-e", exit_entry, "-a", FUNC, "-n", COMM, "-v",
           *flags]
    if otlp_port is not None:
        cmd += ["--otlp-endpoint", f"http://127.0.0.1:{otlp_port}"]
    if trace_json is not None:
        cmd += ["--trace-json", trace_json]
    return traced_run(ctx, cmd, [PY, "-m", "retsnoop_otel", "simfail", "--comm", COMM, CASE], wait_for,
                      progs_while_attached=True)


@budget(400)
def scenario_inject_probes(ctx) -> dict:
    accepted, refused = _kprobe_offsets(FUNC)
    near = _traceable("syscall", "exit_to_user", "sys_exit")
    exit_entry = next((f for f in EXIT_WORK if f in near), None)
    out: dict = {"accepted": accepted, "refused": refused, "exit_entry": exit_entry, "near": near}
    good = next((o for o in accepted if o > 4), None)  # past endbr64 (4 bytes) or the ftrace call site
    bad = next((o for o in refused if good is not None and o > good), None)
    out["good"], out["bad"] = good, bad
    if good is None or bad is None or exit_entry is None:
        return out  # the test says which fact was missing
    kprobe = f"kprobe:{FUNC}+0x{good:x}"
    out["kprobe"] = kprobe

    dry = ctx.run([PY, "-m", "retsnoop_otel", "trace", "--dry-run", "-e", "*_sys_bpf", "-a", FUNC, "-J", TP,
                   "-J", kprobe], 300)
    out["dry_run"] = {"rc": dry[0], "out": dry[1], "err": dry[2]}

    otlp_file = Path(ctx.tmpdir) / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out",
                          str(otlp_file)])
    port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=240).group(1))
    trace_json = f"{ctx.tmpdir}/trace.json"
    try:
        out["text"] = _run(ctx, exit_entry, ["-J", TP, "-J", kprobe, "-T"], otlp_port=port, trace_json=trace_json)
        out["otlp"] = _wait_file_lines(otlp_file, 1, timeout=120)
    finally:
        receiver.terminate(timeout=30)
    try:
        with open(trace_json) as fh:
            out["trace_json"] = json.load(fh)
    except (OSError, ValueError) as exc:
        out["trace_json_error"] = str(exc)
    out["json"] = _run(ctx, exit_entry, ["-J", TP, "-J", kprobe, "-T", "--json"])
    # the other two kinds, on their own: a kretprobe on the traced function, the raw tracepoint behind sys_exit_bpf
    out["other_kinds"] = _run(ctx, exit_entry, ["-J", f"kretprobe:{FUNC}", "-J", "rawtp:sys_exit", "-T", "--json"],
                              wait_for=r'"probe": "rawtp:sys_exit"')
    out["refused_run"] = _run(ctx, exit_entry, ["-J", TP, "-J", f"kprobe:{FUNC}+0x{bad:x}", "-T"])
    return out

"""Guest side of the filter acceptance tests (issue 3): -n/-N, -x/-X, -p/-P, -L, -S and --cgroup.

A tracer start costs 20-60 s under TCG, so each run checks several filters at once: every workload
process is built so that exactly one filter (or none) should drop its session, and the sessions are
matched to processes by pid in the tracer's --json output. Host-side assertions: tests/vm/test_filters.py.
The helpers here are also used by bad_input.py and simfail_capture.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.procs import remove_cgroups
from tests.vm.traced_run import our_progs

PY = sys.executable
BPF_SET = ["-e", "*sys_bpf", "-a", "array_map_alloc_check"]
EINVAL_CASE = "bpf-bad-map-max-entries-array"
E2BIG_CASE = "bpf-bad-map-val-size-percpu-array"
CGROUP_ROOT = Path("/sys/fs/cgroup")
START_TIMEOUT_S = 400
SETTLE_S = 5


def start_tracer(ctx, args: Sequence[str]):
    """Spawn `retsnoop-otel trace ARGS` and wait until it reports 'Receiving data...'."""
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "trace", *args])
    t0 = time.monotonic()
    tracer.wait_for_line(r"^Receiving data\.\.\.", timeout=START_TIMEOUT_S)
    ctx.log(f"tracer attached in {time.monotonic() - t0:.1f} s: {' '.join(args)}")
    return tracer, round(time.monotonic() - t0, 1)


def stop_tracer(ctx, tracer) -> dict:
    """SIGTERM, then what it printed, its exit code and whether any of our programs stayed loaded."""
    t0 = time.monotonic()
    rc = tracer.terminate(timeout=300)
    detach_s = round(time.monotonic() - t0, 1)
    time.sleep(1)
    return {"rc": rc, "detach_s": detach_s, "output": tracer.output(), "progs_after": our_progs(ctx)}


def json_sessions(output: str) -> list[dict]:
    """The --json session objects among the tracer's output lines (not the origin table printed at stop)."""
    objs = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [o for o in objs if "origins" not in o]


def spawn_simfail(ctx, cases: Sequence[str], comm: str | None = None, wait: bool = False):
    """Start `simfail [--comm NAME] [--wait-signal] CASES`; the Proc's pid is the workload's pid."""
    cmd = [PY, "-m", "retsnoop_otel", "simfail", "--json"]
    cmd += ["--comm", comm] if comm else []
    cmd += ["--wait-signal"] if wait else []
    proc = ctx.spawn([*cmd, *cases])
    if wait:
        m = proc.wait_for_line(r"^PID (\d+)$", timeout=180)
        assert int(m.group(1)) == proc.pid, (m.group(0), proc.pid)
    return proc


def finish(proc, timeout: float = 180) -> dict:
    """Wait for a simfail process; its exit code and the per-case results it printed."""
    proc.popen.wait(timeout)
    rc = proc.terminate()  # already exited: reaps it and lets the output reader finish
    out = proc.output()
    results = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {"pid": proc.pid, "rc": rc, "results": results, "output": out}


def release(proc) -> None:
    os.kill(proc.pid, signal.SIGUSR1)


def wait_for_pid_session(tracer, pid: int, timeout: float = 180) -> None:
    """Block until a session of `pid` is printed, then until the output settles."""
    tracer.wait_for_line(rf'"pid": {pid},', timeout=timeout)
    tracer.wait_output_settled(SETTLE_S, timeout=120)


def scenario_filter_comm_errors(ctx) -> dict:
    """-n @file (sfa, sfb) -N sfb -x EINVAL: sfa's EINVAL kept; sfa's E2BIG (-x), sfb (-N wins) and sfc (-n)
    dropped."""
    t0 = time.monotonic()
    comms = Path(ctx.tmpdir, "comms")
    comms.write_text("# retsnoop's @file for -n\nsfa\nsfb\n")
    tracer, attach_s = start_tracer(ctx, [*BPF_SET, "--json", "-n", f"@{comms}", "-N", "sfb", "-x", "EINVAL"])
    result: dict = {"attach_s": attach_s}
    try:
        procs = {"sfb": spawn_simfail(ctx, [EINVAL_CASE], comm="sfb"),
                 "sfc": spawn_simfail(ctx, [EINVAL_CASE], comm="sfc"),
                 "sfa": spawn_simfail(ctx, [E2BIG_CASE, EINVAL_CASE], comm="sfa")}
        result["workload"] = {name: finish(p) for name, p in procs.items()}
        wait_for_pid_session(tracer, procs["sfa"].pid)
    finally:
        result["tracer"] = stop_tracer(ctx, tracer)
    result["sessions"] = json_sessions(result["tracer"]["output"])
    result["guest_seconds"] = round(time.monotonic() - t0, 1)
    return result


def scenario_filter_pid_errors(ctx) -> dict:
    """-p A -X -E2BIG: A's EINVAL kept; A's E2BIG (-X) and another process's EINVAL (-p) dropped."""
    t0 = time.monotonic()
    a = spawn_simfail(ctx, [E2BIG_CASE, EINVAL_CASE], wait=True)
    tracer, attach_s = start_tracer(ctx, [*BPF_SET, "--json", "-p", str(a.pid), "-X", "-E2BIG"])
    result: dict = {"attach_s": attach_s}
    try:
        b = spawn_simfail(ctx, [EINVAL_CASE])
        result["other"] = finish(b)
        release(a)
        result["target"] = finish(a)
        wait_for_pid_session(tracer, a.pid)
    finally:
        result["tracer"] = stop_tracer(ctx, tracer)
    result["sessions"] = json_sessions(result["tracer"]["output"])
    result["guest_seconds"] = round(time.monotonic() - t0, 1)
    return result


def _cgroup_mount(ctx) -> str:
    """Make sure cgroup v2 is mounted at /sys/fs/cgroup; returns how it was found."""
    if (CGROUP_ROOT / "cgroup.procs").exists() and (CGROUP_ROOT / "cgroup.controllers").exists():
        return "mounted"
    rc, _, err = ctx.run(["mount", "-t", "cgroup2", "none", str(CGROUP_ROOT)], timeout=60)
    if rc != 0:
        raise RuntimeError(f"mount -t cgroup2 failed ({rc}): {err.strip()}")
    return "mounted by the scenario"


def scenario_filter_duration_pid_cgroup(ctx) -> dict:
    """-S -L 500 -P D --cgroup CG on the nanosleep syscalls, four sleepers each meant for one outcome.

    keep: 1 s sleep in a cgroup nested in CG (--cgroup covers the cgroups below it); short: 1 ms sleep
    in CG (-L drops it); denied: 1 s sleep in CG whose pid is given to -P; outside: 1 s sleep outside CG
    (--cgroup drops it).
    """
    t0 = time.monotonic()
    result: dict = {"cgroup_mount": _cgroup_mount(ctx)}
    cg = CGROUP_ROOT / f"retsnoop-otel-test-{os.getpid()}"
    cg.mkdir()
    nested = cg / "nested"
    nested.mkdir()
    result["cgroup"] = str(cg)
    try:
        procs = {"keep": spawn_simfail(ctx, ["syscall-long-sleep"], wait=True),
                 "short": spawn_simfail(ctx, ["syscall-short-sleep"], wait=True),
                 "denied": spawn_simfail(ctx, ["syscall-long-sleep"], wait=True)}
        for name, p in procs.items():
            (nested if name == "keep" else cg).joinpath("cgroup.procs").write_text(f"{p.pid}\n")
        result["nested"] = f"/{cg.name}/nested" in Path(f"/proc/{procs['keep'].pid}/cgroup").read_text()
        result["in_cgroup"] = {n: f"/{cg.name}" in Path(f"/proc/{p.pid}/cgroup").read_text()
                               for n, p in procs.items()}
        tracer, attach_s = start_tracer(ctx, ["-e", "*sys_nanosleep", "-e", "*sys_clock_nanosleep", "--json",
                                              "-S", "-L", "500", "-P", str(procs["denied"].pid),
                                              "--cgroup", str(cg)])
        result["attach_s"] = attach_s
        try:
            outside = spawn_simfail(ctx, ["syscall-long-sleep"])
            result["workload"] = {"outside": finish(outside)}
            for p in procs.values():
                release(p)
            result["workload"].update({n: finish(p) for n, p in procs.items()})
            wait_for_pid_session(tracer, procs["keep"].pid)
        finally:
            result["tracer"] = stop_tracer(ctx, tracer)
    finally:
        remove_cgroups((nested, cg))
    result["sessions"] = json_sessions(result["tracer"]["output"])
    result["guest_seconds"] = round(time.monotonic() - t0, 1)
    return result

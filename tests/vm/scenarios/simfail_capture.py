"""Guest side of "every simfail case is captured with the errno it is known to produce" (issue 3).

One tracer, with a modest function set (a `:kernel/bpf/*.c` set takes minutes to attach under TCG),
stays attached while one simfail process runs every case in order. The sessions of that process, in
ring-buffer order, line up with the cases that fail. Host-side assertions: tests/vm/test_simfail_capture.py.
"""

from __future__ import annotations

import time

from tests.vm.scenarios.filters import SETTLE_S, finish, json_sessions, spawn_simfail, start_tracer, stop_tracer

CAPTURE_SET = ["-e", "*sys_bpf", "-e", "*sys_perf_event_open",
               "-a", "*map_alloc_check", "-a", "map_create", "-a", "map_lookup_elem", "-a", "bpf_map_*",
               "-a", "perf_kprobe_init", "-a", "bpf_tracing_prog_attach", "-a", "bpf_trampoline_link_prog"]


def _wait_sessions(tracer, pid: int, want: int, timeout: float) -> int:
    """Wait until `want` sessions of `pid` were printed (or timeout); returns how many there are."""
    deadline = time.monotonic() + timeout
    while True:
        have = sum(1 for s in json_sessions(tracer.output()) if s["pid"] == pid)
        if have >= want or time.monotonic() > deadline:
            return have
        time.sleep(1)


def scenario_simfail_capture(ctx) -> dict:
    t0 = time.monotonic()
    tracer, attach_s = start_tracer(ctx, [*CAPTURE_SET, "--json", "-v"])
    result: dict = {"attach_s": attach_s}
    try:
        workload = finish(spawn_simfail(ctx, ["--all"]), timeout=600)
        result["workload"] = workload
        failed = [r for r in workload["results"] if r["errno"]]
        _wait_sessions(tracer, workload["pid"], len(failed), timeout=180)
        tracer.wait_output_settled(SETTLE_S, timeout=120)
    finally:
        result["tracer"] = stop_tracer(ctx, tracer)
    result["sessions"] = [s for s in json_sessions(result["tracer"]["output"]) if s["pid"] == result["workload"]["pid"]]
    result["guest_seconds"] = round(time.monotonic() - t0, 1)
    return result

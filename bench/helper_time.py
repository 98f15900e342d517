"""Time per workload call in each kernel helper our programs call, measured by the function_graph tracer.

    tests/vm/run --kernel 6.12 -- python -m bench.helper_time --sets 20 --mode kprobe

The programs' statistics give one number per program, and a sampling profiler is blind inside kprobe-type
programs (a perf event's program is skipped while another BPF program runs on the CPU). The function_graph
tracer times a function's entry to its return whatever runs: with the helpers as its filter and a graph
depth of 1 it reports how long each helper call took, so the session's fixed costs (the kernel stack, the
record, the names) can be told apart. The tracer's own hooks add to every timed call; the same hooks on
a function that does nothing measurable (bpf_get_smp_processor_id's kernel symbol, or the cheapest helper
seen) give an estimate of that overhead, shown beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from bench.harness import (
    SETS,
    KernelFacts,
    attach,
    build_workload,
    detach,
    our_functions,
    settle_hooks,
    traced_workload,
)
from retsnoop_otel.kernel import tracefs

HELPERS = ("bpf_get_stack", "bpf_get_stack_raw_tp", "bpf_get_stack_pe", "bpf_ringbuf_reserve", "bpf_ringbuf_submit",
           "bpf_ringbuf_query", "bpf_probe_read_kernel", "bpf_probe_read_kernel_str", "bpf_probe_read_user",
           "bpf_get_current_comm", "bpf_get_current_cgroup_id", "bpf_ktime_get_boot_ns", "bpf_get_current_pid_tgid",
           "bpf_get_attach_cookie_trace", "bpf_get_attach_cookie_kprobe_multi", "bpf_get_attach_cookie_tracing",
           "htab_lru_map_update_elem", "htab_map_update_elem", "htab_map_delete_elem", "irq_work_queue",
           "bpf_get_func_ret", "bpf_get_prandom_u32")
# "  0)   1.234 us    |  bpf_get_stack();": at graph depth 1 every timed call prints as a leaf like this
LEAF = re.compile(r"([0-9.]+) us\s+\|\s+(\w+)\(\);")


def helper_time(root: Path, funcs: list[str], workload: list[str], calls: int) -> dict[str, tuple[float, float]]:
    """name -> (calls per workload call, us per call) of every filtered function."""
    (root / "current_tracer").write_text("nop")
    (root / "set_ftrace_filter").write_text("\n".join(funcs) + "\n")
    (root / "max_graph_depth").write_text("1")
    acc: dict[str, list[float]] = {}
    try:
        for line in traced_workload(root, "function_graph", workload, calls).splitlines():
            if m := LEAF.search(line):
                acc.setdefault(m.group(2), []).append(float(m.group(1)))
    finally:
        (root / "set_ftrace_filter").write_text("")
        (root / "max_graph_depth").write_text("0")
    return {k: (len(v) / calls, sum(v) / len(v)) for k, v in acc.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="20", choices=list(SETS))
    ap.add_argument("--mode", default="kprobe", choices=["kprobe", "kprobe_multi", "kprobe_session", "fentry"])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    root = tracefs.find_tracefs()
    available = {line.split()[0] for line in (root / "available_filter_functions").read_text().splitlines() if line}
    funcs = [f for f in HELPERS if f in available]
    facts = KernelFacts.load()
    entry, allow = SETS[args.sets]
    names = our_functions(entry, allow, args.mode)
    size_kb = (root / "buffer_size_kb").read_text().split()[0]
    (root / "buffer_size_kb").write_text("16384")
    try:
        with tempfile.TemporaryDirectory(prefix="helper-time-") as tmpdir:
            tmp = Path(tmpdir)
            workload = build_workload(tmp)
            running = attach("ours", args.mode, list(entry), list(allow), names, tmp, facts, 1800)
            try:
                running.lines.quiet_for(2.0, cap=120.0)
                got = helper_time(root, funcs, workload, args.calls)
            finally:
                detach(running, 600)
                settle_hooks(300)
    finally:
        (root / "buffer_size_kb").write_text(size_kb)
    print(json.dumps({"mode": args.mode, "set": args.sets, "calls": args.calls,
                      "helpers": {k: {"per_call": round(n, 2), "us": round(us, 2)} for k, (n, us) in
                                  sorted(got.items(), key=lambda kv: -kv[1][0] * kv[1][1])}}))
    print(f"\n{'helper':32} {'calls/call':>10} {'us each':>9} {'us/call':>9}")
    for k, (n, us) in sorted(got.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
        print(f"{k:32} {n:10.2f} {us:9.2f} {n * us:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

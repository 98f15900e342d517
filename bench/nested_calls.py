"""Which functions of a bench set run inside a tool's own programs: calls per workload call that appear only
while the tool is attached.

    tests/vm/run --kernel 6.12 -- python -m bench.nested_calls --sets 1000 --mode kprobe

A function that a tool's BPF programs call (a helper, or what a helper calls) and that is also in the
traced set fires its hook inside the program on every run. The kernel skips the nested program, but the
hook's cost lands in the outer program's run time, so a per-call comparison (bench/peer_compare.py,
bench/together_cost.py) charges that tool for hooking its own machinery. Our discovery keeps our helpers
out of every set; this finds what the peers' programs call. It counts every call of the set's functions
with the ftrace function tracer (which BPF's recursion guards do not skip), during the workload with
nothing attached and then with each tool attached, and prints the functions whose calls per workload
call grew.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.harness import (
    PEERS,
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


def calls_per_call(root: Path, workload: list[str], calls: int) -> dict[str, float]:
    """Calls of each filtered function per workload call, from the function tracer's buffer."""
    seen: dict[str, int] = {}
    for line in traced_workload(root, "function", workload, calls).splitlines():
        if line.startswith("#") or ": " not in line:
            continue
        fn = line.split(": ", 1)[1].split(" <-")[0].strip()
        seen[fn] = seen.get(fn, 0) + 1
    return {k: v / calls for k, v in seen.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="1000", choices=list(SETS))
    ap.add_argument("--mode", default="kprobe", choices=["kprobe", "fentry"])
    ap.add_argument("--tools", default="bpftrace,bpftrace-kstack,ours")
    ap.add_argument("--calls", type=int, default=300, help="workload calls per count (the trace buffer holds them)")
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    root = tracefs.find_tracefs()
    facts = KernelFacts.load()
    entry, allow = SETS[args.sets]
    names = our_functions(entry, allow, args.mode)
    size_kb = (root / "buffer_size_kb").read_text().split()[0]
    (root / "buffer_size_kb").write_text("16384")
    (root / "set_ftrace_filter").write_text("\n".join(names) + "\n")
    try:
        with tempfile.TemporaryDirectory(prefix="nested-") as tmpdir:
            tmp = Path(tmpdir)
            workload = build_workload(tmp)
            base = calls_per_call(root, workload, args.calls)
            print(json.dumps({"untraced": {"functions": len(base), "calls_per_call": round(sum(base.values()), 2)}}),
                  flush=True)
            for tool in args.tools.split(","):
                if tool not in (*PEERS, "ours"):
                    ap.error(f"unknown tool {tool}")
                running = attach(tool, args.mode, list(entry), list(allow), names, tmp, facts, 1800)
                try:
                    with_tool = calls_per_call(root, workload, args.calls)
                finally:
                    detach(running, 600)
                    settle_hooks(300)
                grew = {k: round(v - base.get(k, 0.0), 2) for k, v in with_tool.items() if v - base.get(k, 0.0) > 0.05}
                print(json.dumps({"tool": tool, "mode": args.mode, "set": args.sets, "extra_calls_per_call":
                                  dict(sorted(grew.items(), key=lambda kv: -kv[1]))}), flush=True)
    finally:
        (root / "set_ftrace_filter").write_text("")
        (root / "buffer_size_kb").write_text(size_kb)
    return 0


if __name__ == "__main__":
    sys.exit(main())

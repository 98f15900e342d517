"""The application watcher's first look at every running process: where, if anywhere, each keeps its OTel
thread context. Run as root on any host (no tracing needed):

    .venv/bin/python -m bench.app_scan_cost [--runs N] [--base CHECKOUT]

`trace` and the agent queue every process that runs when they start and check them during the first polls
after "Receiving data...", so this is CPU taken from the traced system right after attach (under emulation,
3.7 s of the first poll on a handful of processes before the ELF reader was rewritten). Each run is a fresh
interpreter with an empty per-file cache, imports included; --base runs another checkout
(`git worktree add /tmp/base REV`) interleaved, and the ratio of the medians is printed.
"""

from __future__ import annotations

import sys

from bench.harness import THIS, child_json, interleaved, medians, parse_trees

CHILD = r"""
import json, os, time
t0 = time.perf_counter()
from retsnoop_otel.appctx.thread_ctx import ThreadCtxError, TlsLocator
locator, found, failed = TlsLocator(), 0, 0
pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != os.getpid()]
for pid in pids:
    try:
        found += locator.locate(pid) is not None
    except ThreadCtxError:
        failed += 1
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "processes": len(pids), "found": found,
                  "unreadable": failed, "elf_files": len(locator._cache)}))
"""


def main() -> int:
    args, trees = parse_trees(__doc__.split("\n\n")[0], runs=9)
    runs = interleaved(trees, args.runs, lambda tree: child_json(CHILD, tree))
    med = medians(runs)
    print(f"| tree | scan of every process, imports included (median of {args.runs}) | processes | ELF files read "
          "| with a thread context | unreadable |")
    print("|---|---|---|---|---|---|")
    for name, rs in runs.items():
        last = rs[-1]
        print(f"| {name} | {med[name]['ms']:.1f} ms | {last['processes']} | "
              f"{last['elf_files']} | {last['found']} | {last['unreadable']} |")
    if args.base:
        print(f"\nthis checkout / base = {med[THIS]['ms'] / med['base']['ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a process's exit costs by what it holds: the kernel's teardown from `os._exit` to the pidfd (issue 48.2).

    tests/vm/run --kernel 7.2 -- python -m bench.exit_cost [--rounds N] [KIND ...]

A stop ends with the process's exit, and the kernel frees its pages before the parent sees it go. Kinds: `plain`
(an interpreter that imported nothing), `imports` (the modules a `trace` start imports, libbpf loaded), `small`
(60 MB of 1,000-byte blocks: glibc's heap, 4 KiB pages, as a start's tables and libbpf's parse leave it), `large`
(one 64 MB buffer: one mapping, which transparent huge pages may back), `small-trimmed` (the same blocks freed
below a live one, then runtime/heap.py `release_free_pages`, as the start does when the heap freezes).
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time

CHILD = r"""
import os, sys
kind = sys.argv[1]
if kind == "imports":
    import retsnoop_otel.trace.main, retsnoop_otel.runtime.runtime, retsnoop_otel.kernel.tracer
    from retsnoop_otel.kernel import libbpf
    libbpf.lib()
if kind.startswith("small"):
    held = [bytes(1000) + bytes([i % 256]) for i in range(60000)]
if kind == "small-trimmed":
    keep = bytes(1000) + b"k"
    del held
    from retsnoop_otel.runtime.heap import release_free_pages
    release_free_pages()
if kind == "large":
    held = bytearray(64 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
rss = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS"))
print(rss, flush=True)
sys.stdin.readline()
os._exit(0)
"""

KINDS = ("plain", "imports", "small", "small-trimmed", "large")


def exit_ms(kind: str) -> tuple[float, int]:
    """One child: its RSS in kB, and the ms from the line that lets it exit to its pidfd's readiness."""
    p = subprocess.Popen([sys.executable, "-c", CHILD, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdin is not None and p.stdout is not None
    rss = int(p.stdout.readline())
    fd = os.pidfd_open(p.pid)
    try:
        t0 = time.monotonic()
        p.stdin.write(b"\n")
        p.stdin.flush()
        select.select([fd], [], [], 60)
        return 1000 * (time.monotonic() - t0), rss
    finally:
        os.close(fd)
        p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("kinds", nargs="*", help=f"any of {', '.join(KINDS)} (all by default)")
    args = ap.parse_args()
    if unknown := set(args.kinds) - set(KINDS):
        ap.error(f"unknown kinds {sorted(unknown)}: choose from {', '.join(KINDS)}")
    print("| held | RSS | exit: median (min-max) of", args.rounds, "|\n|---|---|---|")
    for kind in args.kinds or KINDS:
        runs = [exit_ms(kind) for _ in range(args.rounds)]
        ms = [t for t, _ in runs]
        print(f"| {kind} | {runs[-1][1] // 1024} MB | {statistics.median(ms):.1f} ms ({min(ms):.1f}-{max(ms):.1f}) |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

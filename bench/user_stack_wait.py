"""How long the first user stack of a large binary holds up the sessions behind it, and the capture loop,
with user stacks symbolized on the capture loop (the runtime before issue 33 point 5) and off it
(appctx/stacks.py: a worker thread, sessions released in order within their bound). Run from the repo root,
as root or as the owner of the processes it starts (it reads their /proc/PID/maps and map_files):

    .venv/bin/python -m bench.user_stack_wait [--wait S] [--sessions N] [--interval MS] [--runs N] [--large CMD]

The sessions, as the capture loop would see them: the first from a process that maps a large ELF file (by
default a Python that loads the biggest libLLVM-*.so it finds: tens of thousands of dynamic symbols to parse;
--large runs another command, e.g. `rustc -`), then --sessions from a small process (`sleep`), one every
--interval ms. Both processes are new to the symbolizer, as after a start. Each mode gets a fresh
symbolizer (ELF caches empty; the page cache is warmed once before). Printed: the first session's delay
(arrival to release), the largest and median delay of the sessions behind it, how many of those kept their
symbols, and the loop's longest stall (a turn's own time, or how late it woke: the worker shares the GIL, and
a long C call in it, such as sorting a large symbol table, delays the loop). Medians of --runs.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from retsnoop_otel.appctx.stacks import HeldSessions, StackWorker
from retsnoop_otel.capture.model import Session
from retsnoop_otel.symbols.user_symbols import UserSymbolizer

TICK_S = 0.005  # the loop's turn when it has nothing to do (the runtime polls the ring buffer with a timeout)


def large_command() -> list[str]:
    libs = sorted(glob.glob("/usr/lib/*/libLLVM-*.so*") + glob.glob("/usr/lib/*/libLLVM.so*"), key=os.path.getsize)
    code = "import ctypes, sys\nfor lib in sys.argv[1:]: ctypes.CDLL(lib)\nsys.stdin.read()"
    return [sys.executable, "-c", code, *libs[-1:]]


def text_addresses(pid: int, n: int) -> tuple[int, ...]:
    """`n` addresses spread over the process's executable file mappings (what a stack's frames point into)."""
    spans = []
    with open(f"/proc/{pid}/maps") as fh:
        for row in fh:
            parts = row.split(maxsplit=5)
            if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                spans.append((lo, hi))
    out = []
    for i in range(n):
        lo, hi = spans[i % len(spans)]
        out.append(lo + (hi - lo) * (i + 1) // (n + 2))
    return tuple(out)


def sessions(large: int, small: int, count: int) -> list[Session]:
    first = [Session(large, large, "large", "large", 0, 0, True, [], [], ustack=text_addresses(large, 24))]
    stack = text_addresses(small, 8)
    return first + [Session(small, small, "small", "small", 0, 0, True, [], [], ustack=stack) for _ in range(count)]


def on_the_loop(items: list[Session], interval: float) -> tuple[list[float], float]:
    """Before: the loop snapshots a new process and symbolizes each stack itself, as the session arrives."""
    sym, seen, delays, longest = UserSymbolizer(), set(), [], 0.0
    t0 = time.monotonic()
    for i, s in enumerate(items):
        arrival = t0 + i * interval
        time.sleep(max(0.0, arrival - time.monotonic()))
        turn = time.monotonic()
        if s.pid not in seen:
            seen.add(s.pid)
            sym.remember(s.pid)
        s.user_frames = tuple(sym.frames(s.pid, s.ustack or ()))
        now = time.monotonic()
        longest = max(longest, now - turn)
        delays.append(now - arrival)
    sym.close()
    return delays, longest


def off_the_loop(items: list[Session], interval: float, wait_s: float) -> tuple[list[float], float]:
    """After: the loop queues the snapshot and the stack and releases the sessions whose turn came."""
    worker = StackWorker(UserSymbolizer())
    held: HeldSessions[int] = HeldSessions(worker, time.monotonic, wait_s)
    seen: set[int] = set()
    delays: dict[int, float] = {}
    arrivals: dict[int, float] = {}
    longest = 0.0
    t0 = wake = time.monotonic()
    i = 0
    while len(delays) < len(items):
        turn = time.monotonic()
        longest = max(longest, turn - wake)  # woken late: the worker held the GIL (a long C call: a sort)
        if i < len(items) and turn >= t0 + i * interval:
            s = items[i]
            if s.pid not in seen:
                seen.add(s.pid)
                worker.remember(s.pid)
            arrivals[i] = t0 + i * interval
            held.hold(i, s)
            i += 1
        for k, _s in held.due():
            delays[k] = time.monotonic() - arrivals[k]
        longest = max(longest, time.monotonic() - turn)
        nxt = t0 + i * interval if i < len(items) else turn + TICK_S
        wake = max(time.monotonic(), min(nxt, turn + TICK_S))
        time.sleep(max(0.0, wake - time.monotonic()))
    worker.close()
    return [delays[k] for k in range(len(items))], longest


def one_run(large: int, small: int, args: argparse.Namespace,
            mode: Callable[[list[Session]], tuple[list[float], float]]) -> dict[str, float]:
    items = sessions(large, small, args.sessions)
    delays, longest = mode(items)
    behind = delays[1:]
    return {"first_ms": delays[0] * 1e3, "behind_max_ms": max(behind) * 1e3,
            "behind_median_ms": statistics.median(behind) * 1e3, "stall_ms": longest * 1e3,
            "behind_symbolized": sum(not s.ustack_unsymbolized for s in items[1:]),
            "first_symbolized": float(not items[0].ustack_unsymbolized)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wait", type=float, default=1.0, help="limits.user_stack_wait_s (default 1)")
    ap.add_argument("--sessions", type=int, default=100, help="sessions behind the first one")
    ap.add_argument("--interval", type=float, default=5.0, help="ms between sessions")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--large", help="the command of the process with a large binary (default: Python + libLLVM)")
    args = ap.parse_args()
    cmd = shlex.split(args.large) if args.large else large_command()
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for c in (cmd, ["sleep", "1000"])]
    try:
        time.sleep(2)  # the large one loads its libraries
        large, small = (p.pid for p in procs)
        warm = UserSymbolizer()
        warm.remember(large)  # the page cache, once: each mode then parses from memory
        warm.close()
        interval = args.interval / 1e3
        modes: dict[str, Callable[[list[Session]], tuple[list[float], float]]] = {
            "on the loop (before)": lambda items: on_the_loop(items, interval),
            f"off the loop, wait {args.wait:g} s": lambda items: off_the_loop(items, interval, args.wait)}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
        for _ in range(args.runs):
            for name, mode in modes.items():
                runs[name].append(one_run(large, small, args, mode))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    what = args.large or f"python + {os.path.basename(cmd[-1])}"
    print(f"large: {what}; {args.sessions} sessions behind it, one every {args.interval:g} ms; median of {args.runs}")
    print("| symbolizing | first session's delay | behind it: max delay | median delay | symbolized | "
          "loop's longest stall |")
    print("|---|---|---|---|---|---|")
    for name, rs in runs.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        first = "" if m["first_symbolized"] else " (without symbols)"
        print(f"| {name} | {m['first_ms']:.0f} ms{first} | {m['behind_max_ms']:.0f} ms | "
              f"{m['behind_median_ms']:.0f} ms | {m['behind_symbolized']:.0f}/{args.sessions} | "
              f"{m['stall_ms']:.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

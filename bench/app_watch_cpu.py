"""What the application watcher costs an idle `trace`: its CPU time after "Receiving data", this checkout
against another (--base), with thread context read (the default) and with --no-app-context.

The watcher checks every process running at start (the backlog, at most BACKLOG_BUDGET_S per poll-loop turn),
then sweeps /proc every SWEEP_S; a trace of a function nothing calls does no other work, so its CPU after ready is
the watcher's and the poll loop's. `--extra N` starts N sleeping Python processes first (their libraries are
what a backlog check reads), like a host's services. Run as root in the VM:

    tests/vm/run --kernel 7.2 -- python -m bench.app_watch_cpu --base build/wt-base --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import READY_OURS, ROOT, Lines, roomy_nofile, stop

ENTRY = "__x64_sys_memfd_secret"  # a syscall nothing on the machine makes: no session, no record
VARIANTS = {"app context": [], "--no-app-context": ["--no-app-context"]}


def cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(tree: Path, extra: list[str], first_s: float, steady_s: float, cache: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), RETSNOOP_OTEL_CACHE=str(cache))
    proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "trace", "-e", ENTRY, *extra], cwd=tree, env=env,
                            text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=roomy_nofile)
    lines = Lines(proc)
    try:
        if lines.wait_for(READY_OURS, 300) is None:
            raise RuntimeError("never ready: " + " | ".join(lines.tail()))
        at_ready = cpu_s(proc.pid)
        time.sleep(first_s)
        after_first = cpu_s(proc.pid)
        time.sleep(steady_s)
        after_steady = cpu_s(proc.pid)
    finally:
        stop(proc)
        lines.join()
    return {"first": after_first - at_ready, "steady_per_10s": (after_steady - after_first) * 10 / steady_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="another checkout, run interleaved with this one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", type=int, default=20, help="sleeping Python processes started first")
    ap.add_argument("--first", type=float, default=10.0, help="seconds after ready: the backlog's window")
    ap.add_argument("--steady", type=float, default=30.0, help="seconds after that: the sweep's window")
    args = ap.parse_args()
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    sleepers = [subprocess.Popen([sys.executable, "-c", "import json, ssl, sqlite3, time; time.sleep(3600)"],
                                 start_new_session=True) for _ in range(args.extra)]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    tmp = tempfile.mkdtemp(prefix="watch-cpu-")
    try:
        for r in range(args.rounds):
            for variant, extra in VARIANTS.items():
                for name, tree in trees.items():
                    out = one_run(tree, extra, args.first, args.steady, Path(tmp) / name)
                    results.setdefault((name, variant), []).append(out)
                    print(f"round {r + 1} {name} {variant}: {out['first']:.2f} s CPU in the first {args.first:g} s "
                          f"after ready, then {out['steady_per_10s']:.2f} s per 10 s", flush=True)
    finally:
        for p in sleepers:
            p.send_signal(signal.SIGKILL)
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n| tree | variant | CPU in the first {args.first:g} s after ready | then, per 10 s |\n|---|---|---|---|")
    for (name, variant), runs in results.items():
        first = statistics.median(x["first"] for x in runs)
        steady = statistics.median(x["steady_per_10s"] for x in runs)
        print(f"| {name} | {variant} | {first:.2f} s | {steady:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

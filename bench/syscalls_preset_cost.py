"""What the syscall preset costs (issue 46 point 5): a syscall-heavy workload's time with and without
`trace --syscalls` in the same boot, and the preset's start (attach) and stop (detach) times.

    tests/vm/run --kernel 7.2 -- python -m bench.syscalls_preset_cost [--budget N] [--iterations N] [--rounds N]
        [--base CHECKOUT]

The workload (C, built with gcc; Python when there is none) runs --iterations rounds of seven syscalls each:
getpid, open, read and close of /dev/zero, write to /dev/null, fstat, and a stat of a missing file every
--fail-every rounds (ENOENT: a failing session the tracer reports). It prints its own loop's wall time. Each round
of the bench runs it --rounds times untraced, then as often traced, then untraced again: the overhead is the
traced mean against the mean of the untraced runs around it, so a slow minute of the machine does not land on one
side only. The tracer is `python -m retsnoop_otel trace --syscalls -v --json` (auto attach mode: kprobe.session or
kprobe.multi), its sessions read by the bench; attach is the time from its start to "Receiving data...", with its
-v phase lines; detach, from SIGTERM to its exit. With --base, another checkout of ours (its Python code and
BPF object) is traced the same way right after ours, between the same untraced runs: two builds side by side.
With --peers retsnoop (--retsnoop-bin or RETSNOOP_BIN), retsnoop v0.11 traces the same functions the same way after
them: the preset's entry and allow functions as our dry run lists them (those retsnoop would also attach), as its
-e and -a, in its kprobe.multi mode (-M: a kprobe.multi and a kretprobe.multi link over all of them; it has no
tracepoint boundaries, so every syscall's session starts at its entry function's kprobe).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import (
    PHASE_OURS,
    READY_OURS,
    Lines,
    retsnoop_bin,
    retsnoop_command,
    retsnoop_functions,
    roomy_nofile,
    stop,
)
from bench.syscall_loop import build, workload_s


class PresetRun:
    """`trace --syscalls` started, its attach time and phases read from its -v lines."""

    def __init__(self, budget: int | None, timeout: float, tree: Path | None = None) -> None:
        argv = [sys.executable, "-m", "retsnoop_otel", "trace", "--syscalls", "-v", "--json"]
        argv += ["--syscalls-budget", str(budget)] if budget is not None else []
        env = dict(os.environ, PYTHONPATH=str(tree)) if tree else None
        t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=tree)
        self.lines = Lines(self.proc)
        ready = self.lines.wait_for(READY_OURS, timeout)
        if ready is None:
            stop(self.proc, timeout=600)
            raise RuntimeError("the tracer did not attach:\n" + "\n".join(self.lines.tail(30)))
        self.attach_s = ready[0] - t0
        self.phases = {m.group(1): int(m.group(2)) / 1000 for _, m in self.lines.find(PHASE_OURS)}
        self.detail = {m.group(1): m.group(3) or "" for _, m in self.lines.find(PHASE_OURS)}

    def sessions_seen(self) -> int:
        return sum(1 for _, m in self.lines.find(re.compile(r'^\{"tid"')))

    def close(self) -> float:
        t0 = time.monotonic()
        stop(self.proc, timeout=900)
        self.lines.join()
        return time.monotonic() - t0


def trace(cmd: list[str], args: argparse.Namespace, tree: Path | None) -> dict:
    """The workload's runs under one tree's `trace --syscalls`, with its attach and detach times."""
    tracer = PresetRun(args.budget, args.start_timeout, tree)
    print(f"attached in {tracer.attach_s:.1f} s; phases: {tracer.phases}", file=sys.stderr, flush=True)
    try:
        traced = [workload_s(cmd, args.iterations, args.fail_every) for _ in range(args.rounds)]
    finally:
        tracer.lines.quiet_for(3, 120)
        sessions = tracer.sessions_seen()
        detach_s = tracer.close()
    return {"traced_s": traced, "attach_s": round(tracer.attach_s, 1), "detach_s": round(detach_s, 1),
            "phases_s": tracer.phases, "phase_detail": tracer.detail, "sessions_reported": sessions}


def preset_functions(budget: int | None) -> tuple[list[str], list[str]]:
    """(entry, allow): the preset's functions as `trace --syscalls --dry-run` lists them."""
    argv = [sys.executable, "-m", "retsnoop_otel", "trace", "--syscalls", "--dry-run"]
    argv += ["--syscalls-budget", str(budget)] if budget is not None else []
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1500, check=True).stdout
    groups: dict[str, list[str]] = {"Entry functions:": [], "Other functions:": []}
    current = None
    for line in out.splitlines():
        if line in groups:
            current = groups[line]
        elif not line.startswith("    "):
            current = None
        elif current is not None:
            current.append(line.split()[0])
    return groups["Entry functions:"], groups["Other functions:"]


def trace_retsnoop(cmd: list[str], args: argparse.Namespace, binary: Path) -> dict:
    """The workload's runs under retsnoop -M tracing the preset's functions (those it would attach too)."""
    entry, allow = preset_functions(args.budget)
    takes = retsnoop_functions(binary, "kprobe_multi", entry, allow)
    entry, allow = [n for n in entry if n in takes], [n for n in allow if n in takes]
    t0 = time.monotonic()
    proc = subprocess.Popen(retsnoop_command(binary, "kprobe_multi", entry, allow), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", preexec_fn=roomy_nofile)
    lines = Lines(proc)
    ready = lines.wait_for(READY_OURS, args.start_timeout)  # retsnoop says "Receiving data..." too
    if ready is None:
        stop(proc, timeout=600)
        raise RuntimeError("retsnoop did not attach:\n" + "\n".join(lines.tail(30)))
    attach_s = ready[0] - t0
    print(f"retsnoop attached {len(entry)} entry and {len(allow)} other functions in {attach_s:.1f} s",
          file=sys.stderr, flush=True)
    try:
        traced = [workload_s(cmd, args.iterations, args.fail_every) for _ in range(args.rounds)]
    finally:
        lines.quiet_for(3, 120)
        t1 = time.monotonic()
        stop(proc, timeout=900)
        lines.join()
    return {"traced_s": traced, "attach_s": round(attach_s, 1), "detach_s": round(time.monotonic() - t1, 1),
            "entry": len(entry), "allow": len(allow)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=int, default=None, help="--syscalls-budget (default: the preset's)")
    p.add_argument("--iterations", type=int, default=20000)
    p.add_argument("--fail-every", type=int, default=100, help="a failing stat() every N rounds (0: none)")
    p.add_argument("--rounds", type=int, default=2, help="untraced/traced/untraced triples")
    p.add_argument("--start-timeout", type=float, default=1500.0)
    p.add_argument("--json-out", default=None, help="also write the figures as JSON here")
    p.add_argument("--base", type=Path, default=None, help="another checkout of ours, traced the same way after ours")
    p.add_argument("--peers", default="none", choices=["none", "retsnoop"], help="retsnoop: the same functions under "
                   "retsnoop v0.11 -M, after ours")
    p.add_argument("--retsnoop-bin", type=Path, default=None, help="the retsnoop binary (default: $RETSNOOP_BIN)")
    args = p.parse_args()
    rs_bin = None
    if args.peers == "retsnoop":
        try:
            rs_bin = retsnoop_bin(args.retsnoop_bin)
        except ValueError as exc:
            print(f"bench.syscalls_preset_cost: {exc}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETSNOOP_OTEL_RWDIR")) as tmp:
        cmd = build(Path(tmp))
        workload_s(cmd, max(args.iterations // 10, 1), args.fail_every)  # warm: page cache, dentries
        untraced = [workload_s(cmd, args.iterations, args.fail_every) for _ in range(args.rounds)]
        trees = {"ours": None, **({"base": args.base} if args.base else {})}
        runs = {name: trace(cmd, args, tree) for name, tree in trees.items()}
        if rs_bin is not None:
            runs["retsnoop"] = trace_retsnoop(cmd, args, rs_bin)
        untraced += [workload_s(cmd, args.iterations, args.fail_every) for _ in range(args.rounds)]
    base = statistics.mean(untraced)
    figures = {"kernel": os.uname().release, "workload": cmd[0].rsplit("/", 1)[-1], "iterations": args.iterations,
               "fail_every": args.fail_every, "untraced_s": untraced}
    for name, run in runs.items():
        run["overhead_pct"] = round((statistics.mean(run["traced_s"]) / base - 1) * 100, 1)
        figures[name] = run
    print(json.dumps(figures, indent=1))
    for name, run in runs.items():
        tracer = "retsnoop -M" if name == "retsnoop" else "--syscalls"
        print(f"\n{name}: kernel {figures['kernel']}: {args.iterations} x 7 syscalls ({figures['workload']}), a "
              f"failing stat every {args.fail_every}: untraced {base:.3f} s (mean of {len(untraced)}), with "
              f"{tracer} {statistics.mean(run['traced_s']):.3f} s (mean of {len(run['traced_s'])}): "
              f"{run['overhead_pct']:+.1f}%; attach {run['attach_s']} s, detach {run['detach_s']} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

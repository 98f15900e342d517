"""Builds of the syscall preset side by side in one boot, on two syscall-heavy workloads (issue 46 point 5's cost).

    tests/vm/run --kernel 7.2 -- python -m bench.syscalls_preset_variants [--iterations N] [--rounds N]
        NAME=CHECKOUT[:TRACE ARGS] ...

Each variant is a checkout of ours (its Python code and BPF object: a worktree with `make bpf` run in it) and the
`trace` arguments it runs with (default `--syscalls`). Each round runs both workloads untraced, then under every
variant in turn (started, ready, both workloads, stopped), then untraced again; the table gives each variant's
mean against the mean of every untraced run. The workloads:
- the loop of bench/syscall_loop.py: seven of the cheapest syscalls per round (getpid, open, read, fstat,
  close, write, and a failing stat every 100 rounds), the worst case of a tracer that makes every syscall a
  session;
- `cp -r` of 1,500 files of 4 KiB in the guest's /tmp and `rm -r` of the copy (three times per run): syscalls that
  move data, with process starts.
A variant `-e __x64_sys_memfd_secret` (a function nothing calls) measures what a trace costs the workload beside its
probes: the thread-context hooks (syscall tracepoints until 8da1c1d, which put every syscall on the kernel's slow
path; kprobes on memfd_create and prctl since, in the kprobe modes) and the tracer's own work.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import READY_OURS, Lines, stop
from bench.syscall_loop import build, workload_s


def tree_copy(root: Path) -> float:
    """One cp -r and rm -r of root/src, in seconds."""
    t0 = time.monotonic()
    subprocess.run(["cp", "-r", str(root / "src"), str(root / "dst")], check=True)
    subprocess.run(["rm", "-r", str(root / "dst")], check=True)
    return time.monotonic() - t0


def make_tree(root: Path, dirs: int = 30, files: int = 50) -> None:
    for i in range(dirs):
        (root / "src" / f"d{i}").mkdir(parents=True)
        for j in range(files):
            (root / "src" / f"d{i}" / f"f{j}").write_bytes(os.urandom(4096))


def parse_variant(spec: str) -> tuple[str, Path, list[str]]:
    name, _, rest = spec.partition("=")
    tree, _, args = rest.partition(":")
    return name, Path(tree), shlex.split(args) if args else ["--syscalls"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="+", metavar="NAME=CHECKOUT[:ARGS]")
    p.add_argument("--iterations", type=int, default=100000, help="rounds of the syscall loop per run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--start-timeout", type=float, default=900.0)
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variants]
    loop: dict[str, list[float]] = {}
    copy: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cmd = build(root)
        make_tree(root)
        workload_s(cmd, args.iterations // 10, 100)
        tree_copy(root)

        def both(key: str) -> None:
            loop.setdefault(key, []).append(workload_s(cmd, args.iterations, 100))
            copy.setdefault(key, []).append(statistics.mean(tree_copy(root) for _ in range(3)))

        for rnd in range(args.rounds):
            both("untraced")
            for name, tree, targs in variants:
                proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "trace", "--json", *targs],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tree,
                                        env=dict(os.environ, PYTHONPATH=str(tree)))
                lines = Lines(proc)
                if lines.wait_for(READY_OURS, args.start_timeout) is None:
                    stop(proc, timeout=300)
                    raise RuntimeError(f"{name} did not start:\n" + "\n".join(lines.tail(20)))
                try:
                    both(name)
                finally:
                    stop(proc, timeout=300)
                    lines.join()
                print(rnd, name, loop[name][-1], copy[name][-1], file=sys.stderr, flush=True)
            both("untraced")
    print(f"kernel {os.uname().release}; loop: {args.iterations} rounds of 7 syscalls; copy: cp -r and rm -r of "
          "1,500 files of 4 KiB, 3 times")
    for label, runs in (("syscall loop", loop), ("cp -r + rm -r", copy)):
        base = statistics.mean(runs["untraced"])
        print(f"\n{label}: untraced {base:.3f} s (mean of {len(runs['untraced'])})")
        for key, v in runs.items():
            print(f"  {key:40s} {statistics.mean(v):.3f} s  {statistics.mean(v) / base * 100 - 100:+.0f}%  "
                  f"{' '.join(f'{x:.3f}' for x in v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What `agent --check` costs per probe set: configs of 1, 10, 100 (--sets) probe sets of distinct globs, each
checked by a fresh `retsnoop-otel agent --check` (best of --rounds), and the per-set cost between sizes.

    .venv/bin/python -m bench.check_cost [--sets 1,10,100] [--rounds 3]

On a host that cannot trace this is the kernel-free part (settings, outputs, web config, file checks); on one that
can (in the VM: `flock /tmp/vm.lock tests/vm/run --kernel 6.12 -- python -m bench.check_cost`) discovery of every
set is included. Linear means the per-set cost stays the same from 10 to 100 sets.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GLOBS = ["*sys_bpf", "map_create", "bpf_prog_load", "array_map_*", "bpf_check", "*_sys_open*", "vfs_read",
         "do_sys_poll", "ksys_write", "security_file_open"]


def config(n: int) -> str:
    """n probe sets, entries cycling through GLOBS (each set its own name, filters and sampling)."""
    lines = ["probe_sets:"]
    for i in range(n):
        lines += [f"  - name: s{i}", f"    entry: ['{GLOBS[i % len(GLOBS)]}']", "    allow: ['bpf_check']",
                  "    filters: {comms: [a], deny_errors: [ENOENT]}", "    sampling: {success_probability: 0.1}"]
    lines += ["metrics:", "  listen: 127.0.0.1:0"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="1,10,100")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sets.split(",")]
    best: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="check-cost-") as d:
        for n in sizes:
            path = Path(d) / f"sets-{n}.yaml"
            path.write_text(config(n))
            times = []
            for _ in range(args.rounds):
                t = time.monotonic()
                out = subprocess.run([sys.executable, "-m", "retsnoop_otel", "agent", "--check", str(path)],
                                     capture_output=True, text=True, check=False)
                times.append(time.monotonic() - t)
                if out.returncode != 0:
                    sys.exit(f"{n} sets: exit {out.returncode}: {out.stderr.strip()[-300:]}")
            best[n] = min(times)
            note = out.stdout.strip().splitlines()[-1]
            print(f"{n:5d} sets: {best[n]:.2f} s  ({note})", flush=True)
    for a, b in zip(sizes, sizes[1:], strict=False):
        print(f"{a} -> {b} sets: {(best[b] - best[a]) / (b - a) * 1000:.1f} ms per added set")


if __name__ == "__main__":
    main()

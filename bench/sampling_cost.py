"""Agent CPU per 1,000 successful sessions at 1% sampling, per agent tree, side by side in one boot.

    tests/vm/run --kernel 6.12 -- python -m bench.sampling_cost --repos /work/main,.

Each tree (--repos: a checkout with its .venv-independent package; the current interpreter runs it) runs
`python -m retsnoop_otel agent` from that tree with one probe set: entry *sys_bpf, allow map_create and
array_map_alloc_check, success_probability --probability (default 0.01), in mode stack and in mode
calls, kept sessions written as OTLP JSON to a file. The workload is --calls successful
bpf(BPF_MAP_CREATE) calls (an array map created and closed: one successful session each) from a
separate process. As in `python -m bench.metrics_cost --agent-cpu`, the agent's CPU is utime + stime of its
/proc/<pid>/stat around the workload, minus its idle rate; the scrape before and after gives the
sessions the kernel counted, those sent to user space (retsnoop_sessions_reported_total), the spans
exported and the kernel-side BPF ns per session (bpf_stats).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import bpf_stats_enabled, cpu_seconds, free_port, growth, scrape, settle_cpu, stop, wait_healthy

WORKLOAD = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_uint32 * 30)(2, 4, 4, 1)
for _ in range(int(sys.argv[1])):
    fd = libc.syscall(321, 0, attr, ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
"""


def agent_config(port: int, mode: str, probability: float, out: Path) -> str:
    return f"""\
probe_sets:
  - name: bench
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check, map_create]
    mode: {mode}
    sampling: {{success_probability: {probability}}}
exporter:
  file: {out}
metrics:
  listen: "127.0.0.1:{port}"
logging:
  format: json
  level: warning
"""


@dataclass(frozen=True)
class Row:
    repo: str
    mode: str
    calls: int
    wall_s: float
    net_cpu_s: float
    sessions: int
    reported: int
    spans: int
    kernel_ns_per_session: float | None

    @property
    def net_ms_per_1k(self) -> float:
        return self.net_cpu_s / self.sessions * 1e6 if self.sessions else 0.0


def measure(repo: Path, mode: str, args: argparse.Namespace, tmp: Path) -> Row:
    port = free_port()
    tag = f"{repo.name or 'repo'}-{mode}"
    out = tmp / f"{tag}.jsonl"
    cfg = tmp / f"{tag}.yaml"
    cfg.write_text(agent_config(port, mode, args.probability, out))
    log_path = tmp / f"{tag}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "agent", "--config", str(cfg)], cwd=repo,
                                stdout=subprocess.DEVNULL, stderr=log)
        try:
            try:
                wait_healthy(proc, port, args.start_timeout)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; agent log:\n{log_path.read_text()}") from None
            settle_cpu(proc.pid)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(args.idle_s)
            idle_rate = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
            before = scrape(port)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            subprocess.run([sys.executable, "-c", WORKLOAD, str(args.calls)], check=True)
            settle_cpu(proc.pid)  # until the agent has drained what the workload sent it
            wall, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - c0
            after = scrape(port)
        finally:
            stop(proc, timeout=120)
    sessions = int(growth(before, after, "retsnoop_sessions_total"))
    run_s = growth(before, after, "retsnoop_bpf_program_run_seconds_total")
    row = Row(str(repo), mode, args.calls, wall, cpu - idle_rate * wall, sessions,
              int(growth(before, after, "retsnoop_sessions_reported_total")),
              int(growth(before, after, "retsnoop_spans_exported_total")),
              run_s / sessions * 1e9 if sessions and run_s else None)
    print(row, file=sys.stderr, flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repos", default=".", help="comma-separated checkouts to compare (before,after)")
    p.add_argument("--modes", default="stack,calls")
    p.add_argument("--probability", type=float, default=0.01)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--start-timeout", type=float, default=900.0)
    args = p.parse_args()
    repos = [Path(r).resolve() for r in args.repos.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETSNOOP_OTEL_RWDIR")) as tmp, bpf_stats_enabled():
        for mode in args.modes.split(","):
            for repo in repos:
                rows.append(measure(repo, mode, args, Path(tmp)))
    print(f"\nagent CPU per 1,000 successful sessions, success_probability {args.probability}; workload: "
          f"{args.calls} x bpf(BPF_MAP_CREATE) succeeding; kernel {os.uname().release}")
    print(f"{'agent tree':<28}{'mode':<7}{'sessions':>9}{'to user':>9}{'spans':>9}{'net CPU s':>10}"
          f"{'ms/1k sessions':>15}{'kernel ns/session':>18}")
    for r in rows:
        kernel = f"{r.kernel_ns_per_session:.0f}" if r.kernel_ns_per_session else "-"
        print(f"{r.repo:<28}{r.mode:<7}{r.sessions:>9}{r.reported:>9}{r.spans:>9}{r.net_cpu_s:>10.2f}"
              f"{r.net_ms_per_1k:>15.1f}{kernel:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""BPF time per run of our kprobe programs on real hardware: the same kprobe_entry/kretprobe_exit that
single-kprobe mode loads, driven by uprobes on tests/native/simkern.c (the host forbids kernel-function
probes, not uprobes). Under emulation (tests/vm) every figure is an order of magnitude larger and
varies between boots; here a change to bpf/ is measured in seconds, side by side with another build.

    .venv/bin/python -m bench.native_cost [--calls N] [--rounds N] [--base-object BPF_O] [--bpftrace]

Run as root. The programs are loaded and attached by `retsnoop-otel trace`'s own start (its flags parsed
by its parser, then the runtime's steps, in this process: bench/harness.py started), with the four functions
as `u:LIB:NAME` specs and `-p` the process making the calls: a child, since `trace` never traces itself.
kernel.bpf_stats_enabled is switched on only while the calls run. Each call is sk_syscall(0): a session
of four traced functions (sk_syscall -> sk_create -> sk_check fails with -EINVAL, then sk_log) ending in
an error, like a failing syscall. The records are read between batches, outside the measured windows, as
the tools' readers would on another CPU. Also shown: the object's load time (open, relocation and
verification; fentry mode verifies its programs once per traced function) and the instructions the
verifier processed in the two programs.

--bpftrace adds the peer of bench/peer_compare.py on the same four functions: an entry and an exit
uprobe each, `@t[tid] = nsecs` and `@t[tid] = nsecs - @t[tid]` (a per-thread map update in both).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import (
    BPF_STATS,
    ROOT,
    drain,
    free_port,
    prog_info_btf,
    prog_stats,
    started,
    stop,
    trace_argv,
)
from retsnoop_otel.kernel import libbpf as lb

FUNCS = ("sk_syscall", "sk_create", "sk_check", "sk_log=none")  # u:LIB:NAME[=RULE]; sk_syscall is the entry
BATCH = 1000  # calls between reads of the ring buffer (2 MB of records at most)
# the process making the calls: `trace` never traces itself (its own bpf() calls are not the user's), so the
# calls come from a child, a batch per line read, "done" once made
CALLER = ("import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nfor line in sys.stdin:\n"
          "    for _ in range(int(line)):\n        lib.sk_syscall(0)\n    print('done', flush=True)\n")


def build_simkern(tmp: Path) -> str:
    out = tmp / "libsimkern.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(out), str(ROOT / "tests/native/simkern.c")],
                   check=True)
    return str(out)


class Caller:
    """A child process that calls sk_syscall(0) in batches, on request."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CALLER, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def call(self, n: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"the calling process exited with {self.proc.wait()}")

    def close(self) -> None:
        stop(self.proc, timeout=30)


def trace_flags(path: str, pid: int, app_context: bool, func_counts: bool) -> list[str]:
    """`retsnoop-otel trace` on the four functions in the caller only, uprobes, as the options say."""
    entry, *allow = (f"u:{path}:{f}" for f in FUNCS)
    return [*trace_argv([entry], allow), "--user-attach", "uprobe", "-p", str(pid),
            *([] if app_context else ["--no-app-context"]),
            # counts are kept when something reads them: served metrics, as with --metrics-port
            *(["--metrics-addr", "127.0.0.1", "--metrics-port", str(free_port())] if func_counts else [])]


def measure(path: str, calls: int, obj: Path | None, app_context: bool, func_counts: bool) -> dict[str, float]:
    """ns per run of each program and BPF ns per call, for one build, attached by `trace`'s own start."""
    caller = Caller(path)
    try:
        with started(trace_flags(path, caller.proc.pid, app_context, func_counts), obj) as runtime:
            (ps,) = runtime.probe_sets
            tracer = ps.tracer
            verified = sum(prog_info_btf(fd).verified_insns for _name, fd in tracer.programs())  # type: ignore[attr-defined]
            caller.call(1)  # the thread's first session (its entry in the sessions map) is not measured
            drain(runtime)
            totals: dict[str, list[int]] = {}
            done = 0
            while done < calls:
                n = min(BATCH, calls - done)
                before = {p.name: p for p in tracer.program_stats()}
                BPF_STATS.write_text("1\n")
                caller.call(n)
                BPF_STATS.write_text("0\n")
                after = {p.name: p for p in tracer.program_stats()}
                for name, p in after.items():
                    acc = totals.setdefault(name, [0, 0])
                    acc[0] += p.run_time_ns - before[name].run_time_ns
                    acc[1] += p.run_cnt - before[name].run_cnt
                drain(runtime)
                done += n
            load_s = ps.load_s
    finally:
        caller.close()
    out = {f"{name} ns/run": ns / max(1, cnt) for name, (ns, cnt) in totals.items()}
    out["ns/run (all)"] = sum(ns for ns, _ in totals.values()) / max(1, sum(c for _, c in totals.values()))
    out["BPF ns/call"] = sum(ns for ns, _ in totals.values()) / calls
    out["load us"] = load_s * 1e6  # open, relocate, verify: what fentry mode pays per traced function
    out["verified insns"] = verified
    return out


def verified_insns(prog_id: int) -> int:
    fd = lb.lib().lib.bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        return 0
    try:
        return prog_info_btf(fd).verified_insns
    finally:
        os.close(fd)


def measure_bpftrace(path: str, calls: int) -> dict[str, float]:
    names = [f.split("=")[0] for f in FUNCS]
    program = "\n".join([
        'BEGIN { printf("READY\\n"); }',
        ",".join(f"uprobe:{path}:{n}" for n in names) + " { @t[tid] = nsecs; }",
        ",".join(f"uretprobe:{path}:{n}" for n in names) + " { @t[tid] = nsecs - @t[tid]; }",
        "END { clear(@t); }"])
    before_ids = set(prog_stats())
    proc = subprocess.Popen(["bpftrace", "-B", "none", "-e", program], stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.DEVNULL)
    caller = Caller(path)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "READY":
                break
        else:
            raise RuntimeError("bpftrace exited before it was ready")
        caller.call(1)
        ids = [i for i in prog_stats() if i not in before_ids]
        verified = 2 * max((verified_insns(i) for i in ids), default=0)  # a program per probe: entry and exit
        s0 = prog_stats()
        BPF_STATS.write_text("1\n")
        caller.call(calls)
        BPF_STATS.write_text("0\n")
        s1 = prog_stats()
    finally:
        caller.close()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    ns = sum(s1[i][1] - s0[i][1] for i in ids if i in s0 and i in s1)
    runs = sum(s1[i][2] - s0[i][2] for i in ids if i in s0 and i in s1)
    return {"kprobe_entry ns/run": float("nan"), "kretprobe_exit ns/run": float("nan"),
            "ns/run (all)": ns / max(1, runs), "BPF ns/call": ns / calls, "load us": float("nan"),
            "verified insns": verified}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the builds, interleaved; medians shown")
    ap.add_argument("--base-object", type=Path, metavar="BPF_O", help="another build of retsnoop.bpf.c, side by side")
    ap.add_argument("--app-context", action=argparse.BooleanOptionalAction, default=True,
                    help="as `trace` runs by default (the application's thread context asked at session start)")
    ap.add_argument("--func-counts", action=argparse.BooleanOptionalAction, default=False,
                    help="keep the per-function counts, as with metrics served (`trace` alone does not)")
    ap.add_argument("--bpftrace", action="store_true", help="also bpftrace doing the peer's work (see above)")
    args = ap.parse_args()
    old = BPF_STATS.read_text()
    builds: list[tuple[str, Path | None]] = [("this build", None)]
    if args.base_object:
        builds.append(("base", args.base_object))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in builds}
    try:
        with tempfile.TemporaryDirectory(prefix="native-cost-") as tmp:
            path = build_simkern(Path(tmp))
            for _ in range(args.rounds):
                for name, obj in builds:
                    rows[name].append(measure(path, args.calls, obj, app_context=args.app_context,
                                             func_counts=args.func_counts))
                if args.bpftrace:
                    rows.setdefault("bpftrace", []).append(measure_bpftrace(path, args.calls))
    finally:
        BPF_STATS.write_text(old)
    keys = list(rows[builds[0][0]][0])
    print(f"kernel {os.uname().release}; {args.calls:,} failing sessions of 4 functions per round, "
          f"medians of {args.rounds} rounds")
    print(f"{'':<12}" + "".join(f"{k:>24}" for k in keys))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in rows.items()}
    for name, m in med.items():
        print(f"{name:<12}" + "".join(f"{m[k]:>24.0f}" for k in keys))
    for other in ("base", "bpftrace"):
        if other in med:
            print(f"{'/ ' + other:<12}" + "".join(f"{med['this build'][k] / med[other][k]:>23.2f}x"
                                                  if med[other][k] else f"{'-':>24}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())

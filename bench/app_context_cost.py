"""What reading the application's thread context (and its user stack) costs the kernel side, per session.

    .venv/bin/python -m bench.app_context_cost [--rounds 20000] [--repeat 3]      (root; any kernel with uprobes)

Three BPF objects, loaded side by side, trace the same user function (sk_syscall of tests/native/simkern.c, through
uprobes: on the development host kernel functions cannot be traced) in the same writer process
(tests/native/ctx_writer.c, TLS in the executable, a valid sampled record): `plain` does not read the context
(`trace --no-app-context`), `context` does (`trace`'s default), `context_ustack` also takes the user stack (`trace
-U`); each is attached by `trace`'s own start in this process (bench/harness.py started). Two workloads: every
session fails (every one is reported, so every one pays for the read), and one session in 20 fails (the others are
neither reported nor read: the read happens at the end of reported sessions only). With kernel.bpf_stats_enabled on
(and restored afterwards), each object's programs report their run count and run time; the figure is BPF nanoseconds
per session (run time of the entry and exit programs / sessions), and the ratios put the three side by side: every
session passes through all three objects, so they see the same calls, caches and CPU. The order of attachment is
rotated between repeats. The VM scenario app_context measures the same on kernel functions (under TCG emulation: its
ratios, not its nanoseconds, carry over).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.harness import BPF_STATS, ROOT, drain, started, trace_argv, writer_location

VARIANTS = {"plain": (False, False), "context": (True, False), "context_ustack": (True, True)}


def build(tmp: Path) -> tuple[str, str]:
    src = ROOT / "tests" / "native"
    cc = ["gcc", "-O1", "-g", "-fno-omit-frame-pointer"]
    subprocess.run([*cc, "-shared", "-fPIC", "-o", str(tmp / "libsimkern.so"), str(src / "simkern.c")], check=True)
    subprocess.run([*cc, "-rdynamic", "-o", str(tmp / "writer"), str(src / "ctx_writer.c"), "-lpthread", "-ldl"],
                   check=True)
    return str(tmp / "libsimkern.so"), str(tmp / "writer")


def trace_flags(simkern: str, pid: int, variant: str) -> list[str]:
    """`retsnoop-otel trace` on sk_syscall (entry) and sk_check of simkern in the writer, as `variant` says."""
    ctx, stacks = VARIANTS[variant]
    return [*trace_argv([f"u:{simkern}:sk_syscall"], [f"u:{simkern}:sk_check"]), "--user-attach", "uprobe",
            "-p", str(pid), *([] if ctx else ["--no-app-context"]), *(["-U"] if stacks else [])]


def one_run(simkern: str, writer: str, rounds: int, order: list[str], fail_every: int) -> dict[str, float]:
    """Each variant attached by `trace`'s own start (bench/harness.py started), in `order`."""
    proc = subprocess.Popen([writer, "valid", "1", "sim"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env={"SIMKERN": simkern, "SIM_FAIL_EVERY": str(fail_every)}, text=True)
    try:
        with ExitStack() as stack:
            loc: Any = writer_location(proc.pid, 100)
            runtimes = {name: stack.enter_context(started(trace_flags(simkern, proc.pid, name))) for name in order}
            tracers = {name: rt.probe_sets[0].tracer for name, rt in runtimes.items()}
            for t in tracers.values():  # as the runtime's watcher does once it finds the writer: at once here
                t.set_app_target(proc.pid, loc.tp_offset, loc.offset, loc.modid)
            assert proc.stdin is not None
            for _ in range(rounds):
                proc.stdin.write("go\n")
            proc.stdin.close()
            proc.wait(600)
            out = {}
            for name, t in tracers.items():
                drain(runtimes[name])
                run_ns = sum(p.run_time_ns for p in t.program_stats())
                begun = t.capture_stats().sessions_started  # reported or not (the ring buffer may overflow)
                assert begun == rounds, (name, begun)
                out[name] = run_ns / begun
            return out
    finally:
        if proc.poll() is None:
            proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    before = BPF_STATS.read_text()
    BPF_STATS.write_text("1\n")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            simkern, writer = build(Path(tmp))
            names = list(VARIANTS)
            for fail_every, what in ((1, "every session fails (all reported)"),
                                     (20, "1 in 20 sessions fails (the others are not reported)")):
                runs = []
                for i in range(args.repeat):
                    order = names[i % 3:] + names[:i % 3]
                    runs.append(one_run(simkern, writer, args.rounds, order, fail_every))
                med = {n: statistics.median(r[n] for r in runs) for n in VARIANTS}
                print(f"BPF ns per session, {what}; median of {args.repeat} runs of {args.rounds} sessions:")
                for n in VARIANTS:
                    print(f"  {n:16s} {med[n]:8.0f} ns   x{med[n] / med['plain']:.3f} of plain")
    finally:
        BPF_STATS.write_text(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What an exit-only syscall preset could cost at best, side by side with the preset in one boot (issue 46 point 5).

    tests/vm/run --kernel 7.2 -- python -m bench.exit_only_floor [--iterations N] [--rounds N]

The preset today makes every syscall a session: the sys_enter and sys_exit raw tracepoints (which put every
syscall of every task on the kernel's slow path) and an entry and an exit program for every allow function a
syscall passes through (bench/RESULTS.md "Cheaper session boundaries"). An exit-only design (analysis 3.9 in
bench/syscall_preset_cost_analysis.md) would hook only the returns: kretprobe.multi on the syscall entry functions
and on the allow functions, each program testing the return value and looking up its thread's pending error. This
bench attaches the stand-ins of such programs (bench/probe_variants.bpf.c: `empty`, which returns at once, and
`tidhash`, one hash lookup by thread id) to the preset's own functions (`trace --syscalls --dry-run`), and runs the
preset itself, on the syscall loop of bench/syscall_loop.py, rounds interleaved with untraced runs. The stand-ins
bound the design from below: a real exit-only program does a little more (the return value's test, and on an error
an update), so a stand-in above the issue's 10% rules the design out on this loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import READY_OURS, Lines, stop
from bench.syscall_loop import build, workload_s
from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.modes.fsession_multi import attach_set

FEXIT = ("empty", "tidhash")  # the stand-ins built as fexit.multi programs too (f_*)


class ExitOnly:
    """One stand-in program on the returns of a function set, by one kretprobe.multi link, or (`fexit`) one
    tracing_multi link of fexit.multi (Linux 7.2+; a function the trampoline cannot take is left out)."""

    def __init__(self, variant: str, funcs: list[Any], btf_func_id: Callable[[str], int | None] | None = None,
                 fexit: bool = False) -> None:
        self.obj = lb.BpfObject.open_file(str(harness.build_variants()))
        chosen = ("f_" if fexit else "m_") + variant
        for prefix in ("k_", "m_"):
            for v in harness.VARIANTS:
                self.obj.program(prefix + v).set_autoload(prefix + v == chosen)
        for v in FEXIT:
            self.obj.program("f_" + v).set_autoload("f_" + v == chosen)
        if fexit:
            self.obj.program(chosen).set_type(lb.PROG_TYPE_TRACING)
            self.obj.program(chosen).set_expected_attach_type(bpfsys.ATTACH_TRACE_FEXIT_MULTI)
        self.obj.load()
        self.links: list[lb.Link] = []
        t0 = time.monotonic()
        if fexit:
            self.left_out = len(attach_set(self.obj.program(chosen), funcs, btf_func_id, self.links,
                                           attach_type=bpfsys.ATTACH_TRACE_FEXIT_MULTI))
        else:
            self.left_out = 0
            self.links.append(self.obj.program(chosen).attach_kprobe_multi(
                addrs=sorted({f.addr for f in funcs}), retprobe=True))
        self.attach_s = time.monotonic() - t0

    def close(self) -> None:
        for link in self.links:
            link.destroy()
        self.obj.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=100000, help="rounds of the syscall loop per run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--fexit", action="store_true", help="also the stand-ins as fexit.multi (Linux 7.2+)")
    p.add_argument("--only", default="", help="comma-separated parts of the labels to run")
    p.add_argument("--no-preset", action="store_true", help="leave out the preset itself")
    args = p.parse_args()
    found, btf_func_id = harness.discovered(["--syscalls"])
    entries = [f for f in found.funcs if f.is_entry]
    every = list(found.funcs)
    print(f"the preset's functions: {len(every)} ({len(entries)} syscall entry functions)", file=sys.stderr)
    kinds = [("exit-only empty, entries", "empty", entries, False), ("exit-only empty, all", "empty", every, False),
             ("exit-only tidhash, entries", "tidhash", entries, False),
             ("exit-only tidhash, all", "tidhash", every, False)]
    if args.fexit:
        kinds += [("fexit.multi empty, all", "empty", every, True),
                  ("fexit.multi tidhash, all", "tidhash", every, True)]
    if args.only:
        kinds = [k for k in kinds if any(o in k[0] for o in args.only.split(","))]
    loop: dict[str, list[float]] = {}
    attach: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = build(Path(tmp))
        workload_s(cmd, args.iterations // 10, 100)

        def run(key: str) -> None:
            loop.setdefault(key, []).append(workload_s(cmd, args.iterations, 100))
            print(key, f"{loop[key][-1]:.3f}", file=sys.stderr, flush=True)

        for _ in range(args.rounds):
            run("untraced")
            for label, variant, funcs, fexit in kinds:
                prog = ExitOnly(variant, funcs, btf_func_id, fexit)
                try:
                    attach.setdefault(label, []).append(prog.attach_s)
                    if prog.left_out:
                        print(f"{label}: {prog.left_out} functions left out", file=sys.stderr)
                    run(label)
                finally:
                    prog.close()
            run("untraced")
            if args.no_preset:
                continue
            proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "trace", "--json", "--syscalls"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines = Lines(proc)
            if lines.wait_for(READY_OURS, args.start_timeout) is None:
                stop(proc, timeout=300)
                raise RuntimeError("trace --syscalls did not start:\n" + "\n".join(lines.tail(20)))
            try:
                run("the preset (trace --syscalls)")
            finally:
                stop(proc, timeout=300)
                lines.join()
    base = statistics.mean(loop["untraced"])
    print(f"kernel {os.uname().release}; {args.iterations} rounds of the loop of 7 syscalls; untraced {base:.3f} s "
          f"(mean of {len(loop['untraced'])})")
    for key, v in loop.items():
        at = f"  attach {statistics.mean(attach[key]):.2f} s" if key in attach else ""
        print(f"  {key:32s} {statistics.mean(v):.3f} s  {statistics.mean(v) / base * 100 - 100:+.0f}%  "
              f"{' '.join(f'{x:.3f}' for x in v)}{at}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

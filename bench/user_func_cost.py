"""What a user-function session costs (issue 35 point 5), side by side in one run: against a kernel-function session
of the same depth, and in each user attach mode (uprobe.session, uprobe.multi, single uprobes) on the same functions.

    .venv/bin/python -m bench.user_func_cost --calls 20000 --rounds 5
    .venv/bin/python -m bench.user_func_cost --calls 20000 --rounds 5 --leaf-check
    flock /tmp/retsnoop-vm.lock tests/vm/run --kernel 7.2 -- python -m bench.user_func_cost --calls 5000 \
        --rounds 5 --kernel-modes auto,kprobe_multi,kprobe,fsession,fsession_multi --nostack

(Only one VM at a time on the development machine: hence the flock. The 7.2 run above takes about 3 minutes.)

The workload is bench/user_chain.c, built with gcc into a temporary directory on every run, one binary for
every row so that its loops are compiled alike:
  chain    uc_outer() N times: four nested user functions (uc_outer -> uc_mid -> uc_inner -> uc_check), the
           innermost returning -EINVAL: a failing session of four functions, entry uc_outer
  inner    uc_mid() N times: the three inner functions called outside any session (their entry finds no session;
           uprobe.session then skips their return probe, uprobe.multi and single uprobes still take it)
  syscall  N failing bpf(BPF_MAP_CREATE): the kernel chain of the same depth, __x64_sys_bpf -> __sys_bpf ->
           map_create -> array_map_alloc_check (EINVAL), entry __x64_sys_bpf
Each process runs --batch calls at most, timing its own loop; the ring buffer is drained between processes,
outside the measured windows, as a reader on another CPU would.

The rows run what users run: `retsnoop-otel trace` on the chain (`u:EXE:NAME` specs, or the kernel names), its flags
parsed by its parser and started by the runtime's steps in this process (bench/harness.py started), without served
metrics (the session record, the kernel stack at the error for kernel functions; user functions have none).
User functions: every user mode this kernel has (kernel/uprobes.choose_user_mode), on both workloads. Kernel functions
(--kernel-modes, `auto` being what `trace` would choose): the syscall workload; kernels that refuse kernel-function
tracing (this development host: no kprobes, fentry refused) get the user rows only, and the script says why.
--nostack adds each kernel mode again without the kernel stack (what a user session does not take either; no flag
asks for that: the runtime's tracer factory takes it out).

Per workload call, medians over --rounds (every round measures nothing-attached first, then every row, the rows'
order reversed every other round): the wall time added to the workload's own loop against nothing attached in the
same round (hook and programs together: for uprobes the trap, its single-step or emulation, the uretprobe's return
trampoline), the kernel's run_time_ns / run_cnt of our programs (kernel.bpf_stats_enabled on while measuring; a
stats read is a bpf() call, traced by the kernel rows like the workload's: two reads back to back say what one
adds, and it is taken off), program runs per call and sessions reported per call. Under emulation (the VM) the
absolute numbers are many times real hardware's: compare the ratios printed below the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import NamedTuple

from bench import harness
from retsnoop_otel.command.errors import RunRefused
from retsnoop_otel.kernel import features, uprobes
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import HELPER_GET_ATTACH_COOKIE
from retsnoop_otel.runtime.probe_set import TracerLike
from retsnoop_otel.runtime.runtime import Runtime

SRC = Path(__file__).resolve().parent / "user_chain.c"
USER_CHAIN = ("uc_outer", "uc_mid", "uc_inner", "uc_check")  # the entry first
SYS_BPF = {"x86_64": "__x64_sys_bpf", "aarch64": "__arm64_sys_bpf"}.get(os.uname().machine, "__x64_sys_bpf")
KERNEL_CHAIN = (SYS_BPF, "__sys_bpf", "map_create", "array_map_alloc_check")
WORKLOADS = ("chain", "inner", "syscall")
TRACED_PER_CALL = {"chain": 4, "inner": 3, "syscall": 4}  # traced function calls in one workload call


class Row(NamedTuple):
    """One attachment: user or kernel functions, in one attach mode, measured on its workloads."""
    side: str  # "user" | "kernel"
    mode: str
    workloads: tuple[str, ...]
    kernel_stack: bool = True

    @property
    def label(self) -> str:
        return f"{self.side} {self.mode}" + ("" if self.kernel_stack else " nostack")


def build(tmp: Path, leaf_check: bool = False) -> str:
    """With frame pointers (as Fedora and Ubuntu build their packages): every traced function starts with
    `push %rbp`, which x86 uprobes emulate; `leaf_check`: uc_check a leaf starting with a `mov`, which a uprobe
    single-steps out of line (a trap more, and on a KVM guest a debug exception the host intercepts)."""
    exe = tmp / "user_chain"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls", "-Wall",
                    *(["-DUC_LEAF_CHECK"] if leaf_check else []), "-o", str(exe), str(SRC)], check=True)
    return str(exe)


def run_workload(exe: str, workload: str, calls: int) -> float:
    """ns per call of the workload's own loop."""
    out = subprocess.run([exe, workload, str(calls)], capture_output=True, text=True, check=True, timeout=1200).stdout
    return float(out.strip().splitlines()[-1])


def user_modes(btf: Btf) -> tuple[str, list[str], dict[str, str]]:
    """The user mode `trace` would choose, those this kernel has, and why the others are missing."""
    kinds = btf.enumerators("bpf_attach_type")
    cookies = lb.probe_helper(lb.PROG_TYPE_KPROBE, HELPER_GET_ATTACH_COOKIE)
    have, missing = [], {}
    for mode in uprobes.USER_MODES:
        try:
            have.append(uprobes.choose_user_mode(kinds, cookies, mode))
        except uprobes.UprobeModeError as exc:
            missing[mode] = str(exc)
    return (uprobes.choose_user_mode(kinds, cookies) if have else ""), have, missing


def program_totals(tracer: TracerLike) -> tuple[int, int]:
    """run_time_ns and run_cnt of all our programs (fentry and fsession: their clones summed)."""
    stats = tracer.program_stats()
    return sum(p.run_time_ns for p in stats), sum(p.run_cnt for p in stats)


def measure(exe: str, workload: str, calls: int, batch: int, runtime: Runtime | None = None) -> dict:
    """One row's figures on one workload: its own ns per call, and with a tracer its programs' time and runs."""
    wall = ns = runs = 0.0
    tracer = runtime.probe_sets[0].tracer if runtime is not None else None
    started = tracer.capture_stats() if tracer else None
    done = 0
    while done < calls:
        n = min(batch, calls - done)
        if tracer is None:
            wall += run_workload(exe, workload, n) * n
        else:
            first = program_totals(tracer)
            before = program_totals(tracer)
            wall += run_workload(exe, workload, n) * n
            after = program_totals(tracer)
            ns += after[0] - before[0] - (before[0] - first[0])
            runs += after[1] - before[1] - (before[1] - first[1])
            harness.drain(runtime)  # type: ignore[arg-type] # outside the measured window
        done += n
    out = {"workload": workload, "calls": calls, "wall_ns_per_call": round(wall / calls, 1)}
    if tracer is not None and started is not None:
        ended = tracer.capture_stats()
        out |= {"bpf_ns_per_call": round(ns / calls, 1), "ns_per_run": round(ns / runs, 1) if runs else None,
                "runs_per_call": round(runs / calls, 2),
                "sessions_per_call": round((ended.sessions_reported - started.sessions_reported) / calls, 3),
                "dropped": ended.dropped_sessions - started.dropped_sessions}
    return out


def trace_flags(row: Row, exe: str) -> list[str]:
    """`retsnoop-otel trace` on the row's chain, in the row's attach mode (no metrics served: no per-function
    counts, as `trace` runs by default)."""
    if row.side == "user":
        chain = [f"u:{exe}:{n}" for n in USER_CHAIN]
        return [*harness.trace_argv(chain[:1], chain[1:]), "--user-attach", row.mode]
    return harness.trace_argv(KERNEL_CHAIN[:1], KERNEL_CHAIN[1:], mode=row.mode)


def no_kernel_stack(cfg: CaptureConfig) -> CaptureConfig:
    return cfg._replace(kernel_stack=False)


def attached(row: Row, exe: str) -> AbstractContextManager[Runtime]:
    """The row's functions attached by `trace`'s own start (bench/harness.py started); a nostack row with the
    kernel stack taken out through the runtime's tracer factory (no flag asks for that)."""
    return harness.started(trace_flags(row, exe), capture=None if row.kernel_stack else no_kernel_stack)


def check_funcs(row: Row, runtime: Runtime) -> TracerLike:
    """The one probe set's tracer, once its functions are the chain and nothing else."""
    (ps,) = runtime.probe_sets
    want = USER_CHAIN if row.side == "user" else KERNEL_CHAIN
    if sorted(f.name for f in ps.funcs.values()) != sorted(want):
        raise RuntimeError(f"{row.label}: functions found: {sorted(f.name for f in ps.funcs.values())}, "
                           f"left out: {ps.discovery.skipped[:8]}")
    return ps.tracer


# ---- the report: medians over rounds and the ratios between rows ----------------------------------

def summarize(results: Sequence[dict]) -> list[dict]:
    """One line per (row, workload), first-seen order: medians over rounds of each figure, and the added wall
    time, each round's against that round's nothing-attached run of the same workload."""
    base = {(r["round"], r["workload"]): r["wall_ns_per_call"] for r in results if r["row"] == "none"}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        if r["row"] != "none":
            groups.setdefault((r["row"], r["workload"]), []).append(r)
    out = []
    for (row, workload), rs in groups.items():
        line = {"row": row, "workload": workload, "rounds": len(rs),
                "base_ns": statistics.median(base[r["round"], workload] for r in rs),
                "added_ns": statistics.median(r["wall_ns_per_call"] - base[r["round"], workload] for r in rs)}
        for key in ("bpf_ns_per_call", "ns_per_run", "runs_per_call", "sessions_per_call"):
            values = [r[key] for r in rs if r.get(key) is not None]
            line[key] = statistics.median(values) if values else None
        out.append(line)
    return out


def ratio(lines: Sequence[dict], a: tuple[str, str], b: tuple[str, str]) -> dict | None:
    """Row a against row b ((row, workload) each): added wall time, BPF ns per call and per run."""
    by = {(x["row"], x["workload"]): x for x in lines}
    if a not in by or b not in by:
        return None
    x, y = by[a], by[b]

    def div(p: float | None, q: float | None) -> float | None:
        return round(p / q, 2) if p is not None and q else None

    return {"a": a, "b": b, "added": div(x["added_ns"], y["added_ns"]),
            "bpf_per_call": div(x["bpf_ns_per_call"], y["bpf_ns_per_call"]),
            "per_run": div(x["ns_per_run"], y["ns_per_run"])}


def comparisons(lines: Sequence[dict], user_auto: str, kernel_modes: Sequence[str]) -> list[dict]:
    """The pairs the issue asks about: a user session against a kernel session of the same depth (the user auto mode
    against each kernel row), and every user mode against uprobe.session on each workload."""
    pairs = [((f"user {user_auto}", "chain"), (k, "syscall")) for k in kernel_modes]
    for workload in ("chain", "inner"):
        pairs += [((f"user {m}", workload), ("user uprobe_session", workload)) for m in uprobes.USER_MODES[1:]]
    return [r for a, b in pairs if (r := ratio(lines, a, b))]


def table(lines: Sequence[dict]) -> str:
    def num(v: float | None, fmt: str = ",.0f") -> str:
        return "-" if v is None else format(v, fmt)

    out = [f"{'row':<31}{'workload':<9}{'nothing attached ns/call':>25}{'+wall ns/call':>14}{'BPF ns/run':>11}"
           f"{'BPF ns/call':>12}{'runs/call':>10}{'sessions/call':>14}"]
    for x in lines:
        out.append(f"{x['row']:<31}{x['workload']:<9}{num(x['base_ns'], ',.1f'):>25}{num(x['added_ns']):>14}"
                   f"{num(x['ns_per_run']):>11}{num(x['bpf_ns_per_call']):>12}{num(x['runs_per_call'], '.2f'):>10}"
                   f"{num(x['sessions_per_call'], '.3f'):>14}")
    return "\n".join(out)


def ratio_lines(ratios: Sequence[dict]) -> str:
    out = []
    for r in ratios:
        (ar, aw), (br, bw) = r["a"], r["b"]
        out.append(f"{ar} ({aw}) / {br} ({bw}): added wall {r['added']}x, BPF ns per call {r['bpf_per_call']}x, "
                   f"per run {r['per_run']}x")
    return "\n".join(out)


# ---- main ---------------------------------------------------------------------------------------

def kernel_rows(asked: Sequence[str], nostack: bool) -> tuple[list[Row], list[str]]:
    """The kernel rows this kernel runs, and notes on those it does not."""
    feats = features.detect()
    auto = features.choose_mode(feats)
    notes: list[str] = []
    modes = list(dict.fromkeys(auto if m == "auto" else m for m in asked))
    rows: list[Row] = []
    for mode in modes:
        try:
            features.require_tracing(feats, mode)
        except (features.FeatureError, ValueError) as exc:
            notes.append(f"kernel {mode}: not measured: {exc}")
            continue
        rows.append(Row("kernel", mode, ("syscall",)))
        if nostack:
            rows.append(Row("kernel", mode, ("syscall",), kernel_stack=False))
    return rows, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000, help="workload calls per row and round")
    ap.add_argument("--batch", type=int, default=2000, help="calls per workload process (the ring buffer is "
                    "drained between them)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernel-modes", default="auto,fsession", help="kernel attach modes for the kernel rows "
                    "(auto: what trace chooses here; empty: none); modes this kernel lacks are said and skipped")
    ap.add_argument("--user-modes", default=",".join(uprobes.USER_MODES))
    ap.add_argument("--nostack", action="store_true", help="also each kernel mode without the kernel stack")
    ap.add_argument("--leaf-check", action="store_true", help="build uc_check as a leaf function whose first "
                    "instruction a uprobe single-steps instead of emulating")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="user_func_cost-") as tmp:
        return run(args, build(Path(tmp), args.leaf_check))


def run(args: argparse.Namespace, exe: str) -> int:
    btf = Btf.load_vmlinux()
    try:
        user_auto, have, missing = user_modes(btf)
        notes = [f"user {m}: not measured: {why}" for m, why in missing.items()]
        rows = [Row("user", m, ("chain", "inner")) for m in args.user_modes.split(",") if m in have]
        asked = [m for m in args.kernel_modes.split(",") if m]
        krows, knotes = kernel_rows(asked, args.nostack) if asked else ([], [])
        rows += krows
        notes += knotes
        if asked and not krows:
            notes.append("kernel rows: none on this kernel (it refuses kernel-function tracing); user rows only")
        for n in notes:
            print(n, flush=True)
        workloads = [w for w in WORKLOADS if any(w in r.workloads for r in rows)]
        results: list[dict] = []
        with harness.bpf_stats_enabled():
            for w in workloads:  # warm up: page cache, the first exec
                run_workload(exe, w, min(args.batch, args.calls))
            for rnd in range(1, args.rounds + 1):
                for w in workloads:
                    results.append({"round": rnd, "row": "none", **measure(exe, w, args.calls, args.batch)})
                    print(json.dumps(results[-1]), flush=True)
                for row in rows if rnd % 2 else rows[::-1]:
                    try:
                        with attached(row, exe) as runtime:
                            check_funcs(row, runtime)
                            for w in row.workloads:
                                results.append({"round": rnd, "row": row.label,
                                                **measure(exe, w, args.calls, args.batch, runtime)})
                                print(json.dumps(results[-1]), flush=True)
                    except (OSError, lb.LibbpfError, RunRefused) as exc:
                        print(json.dumps({"round": rnd, "row": row.label, "error": str(exc)[:300]}), flush=True)
    finally:
        btf.free()
    lines = summarize(results)
    print(f"\nkernel {os.uname().release} ({os.uname().machine}); {args.calls} workload calls per row and round, "
          f"{args.rounds} rounds, medians; user auto mode {user_auto or '-'}")
    for n in notes:
        print(n)
    print(table(lines))
    print(ratio_lines(comparisons(lines, user_auto, [r.label for r in krows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""retsnoop-otel side by side with bpftrace and retsnoop: start, attach, detach, workload slowdown, BPF ns per call.

Run as root on a kernel that allows tracing, one VM boot per kernel:

    flock /tmp/retsnoop-vm.lock tests/vm/run --kernel 6.12 -- python -m bench.peer_compare
    flock /tmp/retsnoop-vm.lock tests/vm/run --kernel 6.1 -- python -m bench.peer_compare --sets 100 --modes kprobe
    tests/vm/run --kernel 7.2 -- python -m bench.peer_compare --peers bpftrace,retsnoop --retsnoop-bin PATH

Both tools do the same per-call work shape: an entry and an exit probe on the same functions, and a
per-thread map update in each (bpftrace: `@t[tid] = nsecs` at entry, `@t[tid] = nsecs - @t[tid]` at
exit; retsnoop-otel: its session stack, which is keyed by thread). Per attach mode:
- kprobe: both attach one kprobe and one kretprobe per function (bpftrace gets the function list
  spelled out, which in bpftrace 0.17 means single kprobes, one program per probe);
- kprobe_multi (kernels with CONFIG_FPROBE): both give the kernel the whole set in one link per
  direction (bpftrace gets the same globs, which it expands to kprobe_multi links);
- kprobe_session (6.10+): ours in one kprobe.session link per set; bpftrace, which has no such mode,
  as in kprobe_multi (its nearest: the same globs, one link per direction);
- fentry: bpftrace's `kfunc:`/`kretfunc:` (bpftrace 0.17's names for fentry/fexit) on the same list.
How many functions each tool really hooked is read from tracefs `enabled_functions` while it runs.

Reported per tool: start (command to ready: our "Receiving data...", bpftrace's BEGIN output, which it
runs once every probe is attached), Python's own start (interpreter and imports before main, ours
only: reported separately and subtracted from our start for the ratio), attach (ours: our -v line;
bpftrace: from its "Attaching N probes..." line to ready, which includes loading each program), detach
(stop signal to exit), the workload's time per call without tracing and with each tool, and the BPF
time per workload call (kernel.bpf_stats_enabled is switched on only while the workload runs, so the
statistics reads of this script are not counted; run_time_ns summed over the programs each tool
loaded). The workload is a C loop of failing bpf(BPF_MAP_CREATE) calls (an array map with an 8-byte
key), built with gcc at start (a Python ctypes loop when gcc is missing).

Everything (this script, both tools, the workload) runs on one CPU (--cpu, default 0; -1: anywhere).
Under emulation each virtual CPU is a host thread, and a reader decoding sessions on the other virtual
CPU competes with the workload's CPU for the host's two cores (bench/probe_cost.py: a live reader
thread raised our BPF time per call by half or more). On one CPU a tool's user-space work lands in the
workload's wall time instead, where it is that tool's cost. Measured on 6.12 at 1,000 functions, it
raised both tools' BPF time per call by about 1.4x and left their ratios within 0.1x of an unpinned
run's.

--base-object BPF_O adds a third run per mode: ours with another build of retsnoop.bpf.c (say, main's
before a change: `git archive REV bpf | tar -x -C /tmp/b && make -C /tmp/b/bpf`), so that a change is
judged in one boot. Given a directory, a checkout of another revision, it runs that checkout's Python
code and BPF object (`git worktree add /tmp/w REV && make -C /tmp/w bpf`). Boots differ: the same
bpftrace run measured 17,029 and 31,435 BPF ns per call in two 6.1 boots, so figures from different
boots are not compared.

--peers bpftrace,bpftrace-kstack adds a second peer that also takes the kernel stack where ours does:
at the first failing exit of a call tree (the deepest error), once per tree, kept per thread. The plain
peer does less per call than ours (no stack); this one does the same, and pays the same kernel unwinder.

--peers retsnoop (with --retsnoop-bin PATH or RETSNOOP_BIN) adds upstream retsnoop, the tool ours models: its
stack mode (the default), -sn (no DWARF symbolization), in its mode nearest to each of ours (NEAREST: -M for
kprobe.session and fsession.multi, -F for fsession). Both are given the same globs; an untimed `retsnoop
--dry-run -vvv` says which names it would attach, and each tool also gets, as -d, the names only it would take
(SameSet; the JSON lines list them), so both attach the same names; bpftrace gets that list in kprobe and
fentry mode. Its table (retsnoop_table) gives start with Python's own start included, and attach as the same
span for every tool: BPF object load and attach (ours: the load and attach phases, fentry's clones verified in
the second; retsnoop: from its "Found N attachable functions" to its "Successfully attached" line, which
covers the load of its clones), besides each tool's own attach figure. A peer's run serves every row of ours
that maps to the same run (kprobe.session and kprobe.multi share retsnoop's -M and bpftrace's globs).

--deny GLOB[,GLOB] leaves functions out of the set for both tools. The peer's own machinery: bpftrace's
hash-map updates call bpf_obj_free_fields, which the `bpf_*` set includes (our discovery leaves out only
what our programs call). Every bpftrace program run then fires a nested kprobe and kretprobe there: the
kernel skips the nested program, but the hooks' cost lands in the peer's run time (6.12, 1,000 set: 14
such calls per workload call for `bpftrace`, 32 for `bpftrace-kstack`; bench/nested_calls.py finds them).
Per-call figures against bpftrace taken without `--deny bpf_obj_free_fields` charge the peer for that. In
kprobe_multi and kprobe_session the peer attaches globs, which still include it.

--profile HZ samples the kernel stacks of a third workload run under each tool (bench/kprofile.py: a
bpftrace `profile` probe on the workload's CPU and command) and reports, per kernel function, the share of
samples in the function itself and anywhere in the stack: where the BPF time per call goes, which the
programs' statistics cannot say (a stack walk is one helper call to them).

--rounds N runs every set, mode and tool N times, interleaved round by round, and reports medians and
each round's ratio: one run of either tool can move by half within a boot under emulation.

Output: one JSON line per run while it goes, then a markdown table with ratios (ours / peer).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench import kprofile
from bench.harness import (
    ATTACHING_BT,
    NEAREST,
    PEERS,
    PHASE_OURS,
    READY_BT,
    READY_OURS,
    RETSNOOP,
    RETSNOOP_ENV,
    RETSNOOP_FLAGS,
    ROOT,
    SETS,
    KernelFacts,
    Lines,
    bpftrace_program,
    build_workload,
    enabled_names,
    peer_run_key,
    prog_stats,
    retsnoop_bin,
    roomy_nofile,
    run_workload,
    same_names,
    set_stats,
    settle_hooks,
    start_command,
    stop,
    wait_exit,
    warm_up,
)
from retsnoop_otel.kernel import features

ALL_PEERS = (*PEERS, RETSNOOP)
ATTACHED_OURS = re.compile(r"^Successfully attached (\d+) functions in (\d+) ms")
DONE_OURS = re.compile(r"DONE in (\d+) ms")
ATTACHED_RS = re.compile(r"^Successfully attached in (\d+) ms")  # retsnoop -v: mass_attacher's attach only
FOUND_RS = re.compile(r"^Found (\d+) attachable functions in total")  # retsnoop -v: its discovery is done


def python_start(repeat: int = 3) -> float:
    """Seconds for the interpreter to start and import our command-line module (before main runs)."""
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import retsnoop_otel.cli"], check=True, cwd=ROOT)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


# ---- one tool run -------------------------------------------------------------------------------


@dataclass
class Run:
    tool: str
    mode: str
    set_name: str
    peer_mode: str = ""  # a peer: the attach mode it ran in for this row of ours (NEAREST)
    functions: int = 0  # what the tool says it attached (ours, retsnoop) / probes it announced (bpftrace)
    hooked: int = 0  # enabled_functions lines while it ran
    hooked_names: list[str] = field(default_factory=list)  # which (not in the JSON lines)
    start_s: float | None = None
    python_s: float | None = None  # ours: Python's own start, from its -v phase line (or measured)
    attach_s: float | None = None  # the tool's own figure (bpftrace: "Attaching N probes" to ready)
    # BPF object load and attach, the same span for every tool: ours its load and attach phases (fentry's clones
    # are verified in the second), retsnoop from the end of its discovery to its attach line, bpftrace attach_s
    load_attach_s: float | None = None
    detach_s: float | None = None
    detach_own_s: float | None = None  # ours: what its "Detaching... DONE in N ms" says
    ns_per_call: float | None = None  # workload, while traced
    bpf_ns_per_call: float | None = None
    probe_runs_per_call: float | None = None
    phases: dict[str, int] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)  # ours: each phase's detail text
    lines_after_stop: int = 0  # output lines that came after the stop signal (sessions still being printed)
    programs: dict[str, dict[str, float]] = field(default_factory=dict)  # per program name: BPF ns and runs per call
    counts: dict[str, float] = field(default_factory=dict)  # --count: kernel function calls per workload call
    profile: dict = field(default_factory=dict)  # --profile: kprofile.Profile.as_dict() of a third workload run
    error: str = ""




def start_helper(script: str, what: str) -> tuple[subprocess.Popen, Lines]:
    """A bpftrace process beside the tool (a counter, the profiler), once it has printed READY."""
    proc = subprocess.Popen(["bpftrace", "-e", script], text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = Lines(proc)
    if lines.wait_for(READY_BT, 300) is None:
        tail = lines.tail()
        stop_helper(proc, lines)
        raise RuntimeError(f"{what} never ready: " + " | ".join(tail))
    return proc, lines


def stop_helper(proc: subprocess.Popen, lines: Lines, timeout: float = 120) -> None:
    stop(proc, signal.SIGINT, timeout)
    lines.join()


def count_calls(funcs: Sequence[str], workload: list[str], calls: int) -> dict[str, float]:
    """How often each kernel function ran per workload call, in a second workload run while a tool traces.

    One bpftrace kprobe per function, in a process of its own so that its programs are known by id. The
    count is the program's runs plus its recursion misses: inside a kprobe-attached program (ours or
    bpftrace's in the kprobe modes) the kernel skips the counter's kprobe program, and counts that as a miss
    only from Linux 6.7 on (on 6.1 the kprobe modes read 0)."""
    counters: list[tuple[str, subprocess.Popen, Lines, list[int]]] = []
    try:
        for f in funcs:
            before = set(prog_stats())
            proc, lines = start_helper(f'BEGIN {{ printf("READY\\n"); }} kprobe:{f} {{ @n = count(); }}',
                                       f"counter for {f}")
            counters.append((f, proc, lines, [i for i in prog_stats() if i not in before]))
        s0 = prog_stats()
        set_stats(True)  # run_cnt counts only while statistics are on (misses always)
        run_workload(workload, calls)
        set_stats(False)
        s1 = prog_stats()
        return {f: sum(s1[i][2] + s1[i][3] - s0[i][2] - s0[i][3] for i in ids if i in s0 and i in s1) / calls
                for f, _, _, ids in counters}
    finally:
        set_stats(False)
        for _, proc, lines, _ in counters:
            stop_helper(proc, lines)


def profile_calls(hz: int, cpu: int, workload: list[str], calls: int) -> kprofile.Profile:
    """Kernel stacks sampled during a third workload run while a tool traces (bench/kprofile.py)."""
    comm = Path(workload[0]).name[:15] if len(workload) == 1 else ""  # the C loop; ctypes runs as python
    proc, lines = start_helper(kprofile.script(hz, cpu, comm), "profiler")
    try:
        run_workload(workload, calls)
    finally:
        stop_helper(proc, lines, 300)  # it prints its map on the way out
    return kprofile.fold(kprofile.parse_stacks("\n".join(line for _, name, line in lines.lines if name == "out")))


def one_run(tool: str, mode: str, set_name: str, entry: Sequence[str], allow: Sequence[str], names: Sequence[str],
            workload: list[str], calls: int, tmp: Path, timeout: float, py_start: float,
            base_object: Path | None = None, int_ret: Callable[[str], bool] | None = None,
            count: Sequence[str] = (), profile_hz: int = 0, cpu: int = -1, deny: Sequence[str] = (),
            retsnoop: Path | None = None) -> Run:
    """One tool's start, attach, workload and detach. `deny`: the deny globs of this tool (ours, retsnoop)."""
    run = Run(tool, mode, set_name, peer_mode=NEAREST[mode] if tool in ALL_PEERS else "")
    peer = tool in PEERS  # bpftrace (retsnoop prints retsnoop-otel's lines: it is the model of ours)
    program = tmp / f"{tool}_{mode}_{set_name}.bt"
    program.write_text(bpftrace_program(mode, entry, allow, names, tool == "bpftrace-kstack", int_ret))
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(4 * len(names) + 64),
               BPFTRACE_MAX_BPF_PROGS=str(4 * len(names) + 64), RETSNOOP_OTEL_CACHE=str(tmp / "cache"))
    before = set(prog_stats())
    t0 = time.monotonic()
    tree = base_object if tool == "ours-base" and base_object is not None and base_object.is_dir() else None
    if tree is not None:  # another checkout: its own Python code and BPF object
        env["PYTHONPATH"] = str(tree)
    proc = subprocess.Popen(start_command(tool, mode, entry, allow, program, base_object, deny, retsnoop),
                            cwd=tree or ROOT,
                            env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=roomy_nofile)
    lines = Lines(proc)
    try:
        ready = lines.wait_for(READY_BT if peer else READY_OURS, timeout)
        if ready is None:
            run.error = "never ready: " + " | ".join(lines.tail())
            return run
        run.start_s = ready[0] - t0
        if tool == RETSNOOP:
            found, att = lines.find(FOUND_RS), lines.find(ATTACHED_RS)
            if found and att:
                run.functions = int(found[0][1].group(1))
                run.attach_s = int(att[0][1].group(1)) / 1000
                run.load_attach_s = att[0][0] - found[0][0]
        elif not peer:
            lines.wait_for(re.compile(r"^Phase ready"), 60)  # -v goes to stderr, read by another thread
            for _, m in lines.find(PHASE_OURS):
                run.phases[m.group(1)] = int(m.group(2))
            run.python_s = run.phases["python"] / 1000 if "python" in run.phases else py_start
            if att := lines.find(ATTACHED_OURS):
                run.functions, run.attach_s = int(att[0][1].group(1)), int(att[0][1].group(2)) / 1000
            if "load" in run.phases and "attach" in run.phases:
                run.load_attach_s = (run.phases["load"] + run.phases["attach"]) / 1000
        else:
            if att := lines.find(ATTACHING_BT):
                run.functions = int(att[0][1].group(1))
                run.attach_s = run.load_attach_s = ready[0] - att[0][0]
        hooked = enabled_names() or set()
        run.hooked, run.hooked_names = len(hooked), sorted(hooked)
        ours = [i for i in prog_stats() if i not in before]
        s0 = prog_stats()
        set_stats(True)
        run.ns_per_call = run_workload(workload, calls)
        set_stats(False)
        s1 = prog_stats()
        ns = sum(s1[i][1] - s0[i][1] for i in ours if i in s0 and i in s1)
        cnt = sum(s1[i][2] - s0[i][2] for i in ours if i in s0 and i in s1)
        run.bpf_ns_per_call = ns / calls
        run.probe_runs_per_call = cnt / calls
        by_name: dict[str, list[int]] = {}
        for i in ours:
            if i in s0 and i in s1:
                acc = by_name.setdefault(s1[i][0], [0, 0, 0, 0])
                acc[0] += 1
                for k in (1, 2, 3):
                    acc[k] += s1[i][k] - s0[i][k]
        run.programs = {n: {"progs": c, "ns_per_call": round(ns_ / calls), "runs_per_call": round(r / calls, 2),
                            "misses_per_call": round(m / calls, 2)}
                        for n, (c, ns_, r, m) in sorted(by_name.items()) if r}
        if count:
            run.counts = count_calls(count, workload, calls)
        if profile_hz:
            run.profile = profile_calls(profile_hz, cpu, workload, calls).as_dict()
        lines.quiet_for(3.0, cap=600.0)  # our consumer may still be printing the sessions
        t1 = time.monotonic()
        seen = len(lines.lines)
        proc.send_signal(signal.SIGINT if peer else signal.SIGTERM)
        run.detach_s = wait_exit(proc, timeout) - t1
        lines.join()
        if done := lines.find(DONE_OURS):
            run.detach_own_s = int(done[-1][1].group(1)) / 1000
        for _, m in lines.find(PHASE_OURS):  # now with the shutdown's phases (drain, detach, flush)
            run.phases[m.group(1)] = int(m.group(2))
            run.details[m.group(1)] = m.group(3) or ""
        run.lines_after_stop = len(lines.lines) - seen
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
        run.error = f"{type(exc).__name__}: {exc}; last output: " + " | ".join(lines.tail())
    finally:
        set_stats(False)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.join()
    if proc.returncode not in (0, -signal.SIGINT, -signal.SIGTERM):
        run.error = f"exit {proc.returncode}: " + " | ".join(lines.tail())
    settle_hooks(120)  # the kernel's teardown finished before the next run measures anything
    return run


# ---- report -------------------------------------------------------------------------------------


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s" if v < 10 else f"{v:.1f} s"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def table(rows: list[tuple[Run, Run]], baseline_ns: float, release: str, calls: int, py_start: float,
          cache_phases: dict[str, dict[str, int]]) -> str:
    out = [f"kernel {release}; workload {calls:,} failing bpf(BPF_MAP_CREATE) calls, {baseline_ns / 1000:.1f} us "
           f"per call untraced; Python's own start (interpreter and imports before main) {py_start:.2f} s, "
           "not included in our start below.", "",
           "| mode | set | peer | functions (ours / peer) | start ours | start peer | ratio | attach ours | "
           "attach peer | ratio | detach ours | detach peer | ratio | us per call ours | us per call "
           "peer | ratio of slowdowns | BPF ns per call ours | BPF ns per call peer | ratio |",
           "|---" * 19 + "|"]
    for ours, bt in rows:
        start_ours = None if ours.start_s is None else ours.start_s - (ours.python_s or 0.0)
        slow_o = None if ours.ns_per_call is None else ours.ns_per_call - baseline_ns
        slow_b = None if bt.ns_per_call is None else bt.ns_per_call - baseline_ns
        us = (lambda v: "-" if v is None else f"{v / 1000:.1f}")  # noqa: E731
        out.append(
            f"| {ours.mode} | {ours.set_name} | {bt.tool} | {ours.hooked} / {bt.hooked} | {_s(start_ours)} | "
            f"{_s(bt.start_s)} | "
            f"{_ratio(start_ours, bt.start_s)} | {_s(ours.attach_s)} | {_s(bt.attach_s)} | "
            f"{_ratio(ours.attach_s, bt.attach_s)} | {_s(ours.detach_s)} | {_s(bt.detach_s)} | "
            f"{_ratio(ours.detach_s, bt.detach_s)} | {us(ours.ns_per_call)} | {us(bt.ns_per_call)} | "
            f"{_ratio(slow_o, slow_b)} | {_n(ours.bpf_ns_per_call)} | {_n(bt.bpf_ns_per_call)} | "
            f"{_ratio(ours.bpf_ns_per_call, bt.bpf_ns_per_call)} |")
    errors = list({id(r): r for pair in rows for r in pair if r.error}.values())
    for r in errors:
        out.append(f"\n{r.tool} {r.mode} {r.set_name}: {r.error}")
    cold, warm = cache_phases.get("cold", {}), cache_phases.get("warm", {})
    if cold and warm:
        extra = sum(cold.get(k, 0) - warm.get(k, 0) for k in ("btf", "symbols"))
        out.append(f"\nOur starts above use the kernel cache (filled by an untimed run); with an empty cache the "
                   f"btf and symbols phases took {cold.get('btf', 0) + cold.get('symbols', 0):,} ms instead of "
                   f"{warm.get('btf', 0) + warm.get('symbols', 0):,} ms (+{extra / 1000:.2f} s to every start).")
    phases = list({(r.mode, r.set_name): (r.mode, r.set_name, r.phases) for r, _ in rows if r.phases}.values())
    if phases:
        out.append("\nOur start by phase (ms, from -v):")
        for mode, set_name, ph in phases:
            out.append(f"- {mode} {set_name}: " + ", ".join(f"{k} {v:,}" for k, v in ph.items()))
    return "\n".join(out)


def retsnoop_table(rows: list[tuple[Run, Run]], baseline_ns: float, release: str, calls: int) -> str:
    """Ours against upstream retsnoop: each cell ours / retsnoop (ours over retsnoop). Start here includes
    Python's own start (the issue's acceptance); attach is the same span for both (load_attach_s), with each
    tool's own attach figure beside it."""
    out = [f"kernel {release}; workload {calls:,} failing bpf(BPF_MAP_CREATE) calls, {baseline_ns / 1000:.1f} us "
           "per call untraced; each cell: ours / retsnoop (ratio ours / retsnoop).", "",
           "| mode (ours / retsnoop) | set | functions hooked | start, Python's included | load and attach | "
           "attach (own figure) | detach | BPF ns per workload call | probe runs per call | us per call |",
           "|---" * 10 + "|"]

    def cell(a: float | None, b: float | None, fmt: Callable[[float | None], str]) -> str:
        return f"{fmt(a)} / {fmt(b)} ({_ratio(a, b)})"

    for ours, rs in rows:
        runs = "-" if ours.probe_runs_per_call is None or rs.probe_runs_per_call is None else \
            f"{ours.probe_runs_per_call:.1f} / {rs.probe_runs_per_call:.1f}"
        out.append(
            f"| {ours.mode} / {RETSNOOP_FLAGS.get(rs.peer_mode, '-')} | {ours.set_name} | {ours.hooked:,} / "
            f"{rs.hooked:,} | {cell(ours.start_s, rs.start_s, _s)} | "
            f"{cell(ours.load_attach_s, rs.load_attach_s, _s)} | "
            f"{cell(ours.attach_s, rs.attach_s, _s)} | {cell(ours.detach_s, rs.detach_s, _s)} | "
            f"{cell(ours.bpf_ns_per_call, rs.bpf_ns_per_call, _n)} | {runs} | "
            f"{_us(ours.ns_per_call)} / {_us(rs.ns_per_call)} |")
    for r in list({id(r): r for pair in rows for r in pair if r.error}.values()):
        out.append(f"\n{r.tool} {r.mode} {r.set_name}: {r.error}")
    return "\n".join(out)


def base_table(rows: list[tuple[Run, Run]], obj: Path) -> str:
    """This build of ours against --base-object's, same set, same boot."""
    out = [f"This build of ours against {obj} (ours / base):", "",
           "| mode | set | start | attach | detach | us per call | BPF ns per call | probe runs per call |",
           "|---" * 8 + "|"]
    for new, old in rows:
        out.append(
            f"| {new.mode} | {new.set_name} | {_s(new.start_s)} / {_s(old.start_s)} | {_s(new.attach_s)} / "
            f"{_s(old.attach_s)} | {_s(new.detach_s)} / {_s(old.detach_s)} | "
            f"{_us(new.ns_per_call)} / {_us(old.ns_per_call)} | {_n(new.bpf_ns_per_call)} / "
            f"{_n(old.bpf_ns_per_call)} ({_ratio(new.bpf_ns_per_call, old.bpf_ns_per_call)}) | "
            f"{new.probe_runs_per_call or 0:.1f} / {old.probe_runs_per_call or 0:.1f} |")
    return "\n".join(out)


def profile_table(runs: dict[tuple[str, str, str], list[Run]], top: int = 8) -> str:
    """Where each tool's traced workload spent its samples: per function, the share of samples in the
    function itself and anywhere in the stack, summed over the rounds (from each run's top 40 of either:
    a function outside one run's list counts 0 there, and its share anywhere is at least its own)."""
    out = ["Kernel profile of the traced workload (--profile; share of samples: self / anywhere in the stack):"]
    for (set_name, mode, tool), rs in runs.items():
        stacks_self: dict[str, float] = {}
        stacks_total: dict[str, float] = {}
        samples = sum(r.profile.get("samples", 0) for r in rs)
        for r in rs:
            n = r.profile.get("samples", 0)
            for key, acc in (("self", stacks_self), ("total", stacks_total)):
                for f, share in r.profile.get(key, []):
                    acc[f] = acc.get(f, 0.0) + share * n
        if not samples:
            continue
        pick = sorted(stacks_total, key=lambda f: -stacks_total[f])[:top]
        pick += [f for f in sorted(stacks_self, key=lambda f: -stacks_self[f])[:top] if f not in pick]
        out.append(f"- {mode} {set_name} {tool}, {samples:,} samples: " + ", ".join(
            f"{f} {stacks_self.get(f, 0) / samples:.0%} / "
            f"{max(stacks_total.get(f, 0), stacks_self.get(f, 0)) / samples:.0%}" for f in pick))
    return "\n".join(out)


def _shown(run: Run) -> dict:
    return {k: v for k, v in run.__dict__.items() if k != "hooked_names"}


NUMERIC = ("functions", "hooked", "start_s", "python_s", "attach_s", "load_attach_s", "detach_s", "detach_own_s",
           "ns_per_call", "bpf_ns_per_call", "probe_runs_per_call")


def median_run(runs: Sequence[Run]) -> Run:
    """One run of each figure's median over the rounds (phases and programs: the first round's)."""
    first = runs[0]
    out = Run(first.tool, first.mode, first.set_name, first.peer_mode, phases=first.phases, details=first.details,
              programs=first.programs, counts=first.counts, profile=first.profile,
              error="; ".join(r.error for r in runs if r.error))
    for name in NUMERIC:
        vals = [v for r in runs if (v := getattr(r, name)) is not None]
        pick = statistics.median_low if name in ("functions", "hooked") else statistics.median  # counts stay whole
        setattr(out, name, pick(vals) if vals else None)
    return out


def round_ratios(ours: Sequence[Run], peer: Sequence[Run]) -> str:
    """BPF ns per call, ours over the peer's, round by round (each pair ran back to back)."""
    return ", ".join(_ratio(o.bpf_ns_per_call, b.bpf_ns_per_call) for o, b in zip(ours, peer, strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="100,1000", help=f"function sets ({', '.join(SETS)})")
    ap.add_argument("--modes", default="kprobe_session,kprobe_multi,kprobe,fentry")
    ap.add_argument("--peers", default="bpftrace", help=f"peer programs ({', '.join(ALL_PEERS)}): bpftrace-kstack "
                    "also takes the kernel stack at the deepest error of each failing call, as ours does; retsnoop "
                    "is upstream retsnoop (--retsnoop-bin)")
    ap.add_argument("--retsnoop-bin", type=Path, help=f"the retsnoop binary (default: ${RETSNOOP_ENV}); built by "
                    "hand outside the repository, see the README's \"Compared with retsnoop\"")
    ap.add_argument("--rounds", type=int, default=1, help="run every tool this many times, interleaved (one "
                    "round runs each set, mode and tool once); the table gives medians and each round's ratio")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--cpu", type=int, default=0, help="run everything on this CPU (-1: anywhere); see above")
    ap.add_argument("--json", type=Path, help="also write every run here")
    ap.add_argument("--count", default="", metavar="FUNC[,FUNC]", help="also count how often these kernel "
                    "functions run per workload call under each tool (say get_perf_callchain: stacks taken), in "
                    "a second workload run so that the counters' kprobes do not touch the other figures")
    ap.add_argument("--profile", type=int, default=0, metavar="HZ", help="also sample the kernel stacks of a "
                    "third workload run under each tool at HZ (bpftrace profile; bench/kprofile.py) and report "
                    "where the time went, by kernel function")
    ap.add_argument("--base-object", type=Path, metavar="BPF_O|DIR", help="also run ours with this build of "
                    "retsnoop.bpf.c, or from this checkout (its Python code and BPF object; tool 'ours-base'), "
                    "to compare a change side by side in the same boot")
    ap.add_argument("--deny", default="", metavar="GLOB[,GLOB]", help="leave these functions out of the set for "
                    "both tools: the peer's own helpers (see above); the peer's globs in kprobe_multi and "
                    "kprobe_session still include them")
    args = ap.parse_args()
    deny = [g for g in args.deny.split(",") if g]
    peers = args.peers.split(",")
    if unknown := [x for x in peers if x not in ALL_PEERS]:
        ap.error(f"unknown peer {', '.join(unknown)}: choose from {', '.join(ALL_PEERS)}")
    rs_bin = None
    if RETSNOOP in peers:
        try:
            rs_bin = retsnoop_bin(args.retsnoop_bin)
        except ValueError as exc:
            print(f"bench.peer_compare: {exc}", file=sys.stderr)
            return 2
    if args.rounds < 1:
        ap.error("--rounds must be 1 or more")
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})  # inherited by both tools, their threads and the workload
    if shutil.which("bpftrace") is None and (set(peers) & set(PEERS) or args.count or args.profile):
        print("bpftrace is not installed: apt-get install bpftrace (the Debian package)", file=sys.stderr)
        return 2
    facts = KernelFacts.load()
    set_stats(False)
    tools = ["ours", *(["ours-base"] if args.base_object else []), *peers]
    runs: dict[tuple[str, str, str], list[Run]] = {}  # (set, mode, tool) -> one run per round
    peer_runs: dict[tuple, Run] = {}  # a peer's run in its mode, for each row of ours that maps to it (NEAREST)
    rs_sets: dict[tuple[str, str], set[str]] = {}  # what retsnoop would attach, by set and its mode
    with tempfile.TemporaryDirectory(prefix="peer-compare-") as tmpdir:
        tmp = Path(tmpdir)
        workload = build_workload(tmp)
        cache_phases = warm_up(tmp)
        print(json.dumps({"cache_phases": cache_phases}), flush=True)
        py_start = python_start()
        baseline = [run_workload(workload, args.calls) for _ in range(3)]
        for rnd in range(args.rounds):
            for set_name in args.sets.split(","):
                entry, allow = SETS[set_name]
                for mode in args.modes.split(","):
                    try:
                        features.require_tracing(facts.feats, mode)
                    except features.FeatureError as exc:
                        print(json.dumps({"mode": mode, "set": set_name, "skipped": str(exc)}), flush=True)
                        continue
                    same = same_names(set_name, mode, deny, rs_bin, rs_sets)
                    print(json.dumps({"set": set_name, "mode": mode, "functions": len(same.names),
                                      "ours_only": same.ours_deny[len(deny):],
                                      "retsnoop_only": same.retsnoop_deny[len(deny):]}), flush=True)
                    ours: Run | None = None
                    for tool in tools:
                        if (tool in ALL_PEERS and NEAREST[mode] == "fentry" and ours is not None
                                and ours.hooked_names):
                            # the functions ours could attach: bpftrace stops at the first it cannot (variadic
                            # functions such as bpf_log have no fexit), where ours skips it and says so
                            same = same.narrowed(ours.hooked_names)
                        tool_deny = same.retsnoop_deny if tool == RETSNOOP else same.ours_deny
                        reuse = (rnd, set_name, *peer_run_key(tool, mode, same))
                        if tool in ALL_PEERS and reuse in peer_runs:  # the same run as for another mode of ours
                            r = replace(peer_runs[reuse], mode=mode)
                            print(json.dumps({"round": rnd + 1, "tool": tool, "mode": mode,
                                              "same_run_as_for": peer_runs[reuse].mode}), flush=True)
                            runs.setdefault((set_name, mode, tool), []).append(r)
                            continue
                        r = one_run(tool, mode, set_name, entry, allow, same.names, workload, args.calls, tmp,
                                    args.timeout, py_start, args.base_object, facts.int_ret,
                                    [f for f in args.count.split(",") if f], args.profile, args.cpu, tool_deny,
                                    rs_bin)
                        if tool in ALL_PEERS:
                            peer_runs[reuse] = r
                        print(json.dumps({"round": rnd + 1, **_shown(r)}), flush=True)
                        runs.setdefault((set_name, mode, tool), []).append(r)
                        ours = r if tool == "ours" else ours
                    baseline.append(run_workload(workload, args.calls))
    base = statistics.median(baseline)
    keys = list(dict.fromkeys((s_, m) for s_, m, _ in runs))
    med = {k: median_run(rs) for k, rs in runs.items()}
    rows = [(med[(s_, m, "ours")], med[(s_, m, p)]) for s_, m in keys for p in peers if p != RETSNOOP]
    text = table(rows, base, os.uname().release, args.calls, py_start, cache_phases) if rows else ""
    if RETSNOOP in peers:
        text += ("\n\n" if text else "") + retsnoop_table([(med[(s_, m, "ours")], med[(s_, m, RETSNOOP)])
                                                            for s_, m in keys], base, os.uname().release, args.calls)
    if args.rounds > 1:
        text += f"\n\nMedians of {args.rounds} rounds. BPF ns per call, ours / peer, round by round:"
        for s_, m in keys:
            for p in peers:
                text += f"\n- {m} {s_} {p}: {round_ratios(runs[(s_, m, 'ours')], runs[(s_, m, p)])}"
    if args.base_object:
        text += "\n\n" + base_table([(med[(s_, m, "ours")], med[(s_, m, "ours-base")]) for s_, m in keys],
                                      args.base_object)
    if args.profile:
        text += "\n\n" + profile_table(runs)
    print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps({"release": os.uname().release, "baseline_ns": base, "python_start_s": py_start,
                                         "rounds": args.rounds,
                                         "runs": [_shown(r) for rs in runs.values() for r in rs]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Start only, ours against bpftrace and retsnoop (and another checkout of ours), over interleaved rounds in one boot.

    tests/vm/run --kernel 6.12 -- python -m bench.start_compare [--modes kprobe_session,kprobe_multi]
        [--set 1000] [--rounds 5] [--base CHECKOUT] [--peers bpftrace,retsnoop --retsnoop-bin PATH]
        [--python /usr/bin/python3] [--base-python PATH]

Under emulation one start of the same build moves by a third between runs of one boot (Python's own start
measured 1.4 to 2.4 s in bench/peer_compare.py's runs), so one run per tool cannot say whether a change
helped. Each round starts every tool once per mode, waits for it to be ready (ours: "Receiving data...",
bpftrace: its BEGIN output, run once every probe is attached; retsnoop: "Receiving data..." too), stops it and
waits until the kernel has no function hooked any more; the table gives medians over the rounds: start, ours
also without Python's own start (the numerator of the ratio to bpftrace), and our -v phases. The ratio to
retsnoop keeps Python's own start in ours (the issue's acceptance: start to "Receiving data...", Python's
start included). Same sets, programs, function names for every tool (SameSet), nearest peer modes (NEAREST;
a peer's start in one round serves every mode of ours that maps to it), CPU pinning and kernel cache as
bench/peer_compare.py (the helpers of both are in bench/harness.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import (
    NEAREST,
    PHASE_OURS,
    READY_BT,
    READY_OURS,
    RETSNOOP,
    RETSNOOP_ENV,
    RETSNOOP_FLAGS,
    ROOT,
    SETS,
    Lines,
    bpftrace_program,
    enabled_count,
    peer_run_key,
    retsnoop_bin,
    roomy_nofile,
    same_names,
    start_command,
    wait_exit,
    warm_up,
)


def start_once(tool: str, mode: str, entry: list[str], allow: list[str], names: list[str], tmp: Path,
               base: Path | None, deny: list[str] | None = None, rs_bin: Path | None = None,
               cache: str = "cache", python: str = sys.executable) -> dict[str, float]:
    program = tmp / f"{mode}.bt"
    program.write_text(bpftrace_program(mode, entry, allow, names))
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(4 * len(names) + 64),
               BPFTRACE_MAX_BPF_PROGS=str(4 * len(names) + 64),
               # a cache of its own per checkout: another build may keep another cache format, and two
               # formats in one directory replace each other's entries at every start (each start cold)
               RETSNOOP_OTEL_CACHE=str(tmp / (f"{cache}-base" if tool == "ours-base" else cache)))
    tree = base if tool == "ours-base" else None
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    print(f"  {time.strftime('%H:%M:%S')} starting {tool} {mode}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(start_command(tool, mode, entry, allow, program, tree, deny or (), rs_bin, python),
                            cwd=tree or ROOT, env=env,
                            text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=roomy_nofile)
    lines = Lines(proc)
    out: dict[str, float] = {}
    try:
        ready = lines.wait_for(READY_BT if tool == "bpftrace" else READY_OURS, 300)
        if ready is None:
            raise RuntimeError(f"{tool} {mode} never ready: " + " | ".join(lines.tail()))
        out["start"] = ready[0] - t0
        if tool in ("ours", "ours-base"):
            lines.wait_for(re.compile(r"^Phase ready"), 60)
            out |= {m.group(1): int(m.group(2)) / 1000 for _, m in lines.find(PHASE_OURS)}
            out["after_python"] = out["start"] - out.get("python", 0.0)
    finally:
        # bpftrace ignores a SIGINT that comes right after its BEGIN output: ask again every 5 s
        t_stop = t_exit = time.monotonic()
        for _ in range(24):
            proc.send_signal(signal.SIGINT if tool == "bpftrace" else signal.SIGTERM)
            try:
                t_exit = wait_exit(proc, 5)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            print(f"  {tool} {mode} did not exit 120 s after the first stop signal: killed; "
                  + " | ".join(lines.tail()), flush=True)
            proc.kill()
            proc.wait()
            t_exit = time.monotonic()
        out["stop"] = t_exit - t_stop  # the first stop signal to the exit
        lines.join()
        if tool in ("ours", "ours-base"):  # where a stop went: before "Detaching..." (the loop busy), the -v phases
            said = [t for t, _ in lines.find(re.compile(r"^Detaching")) if t >= t_stop]
            if said:
                out["to_detaching"] = said[0] - t_stop
            out |= {f"stop_{m.group(1)}": int(m.group(2)) / 1000 for t, m in lines.find(PHASE_OURS)
                    if t >= t_stop and m.group(1) in ("detach", "drain", "flush")}
        for _ in range(120):  # the next start must not pay for this one's teardown
            if enabled_count() <= 0:
                break
            time.sleep(1)
        else:
            print(f"  {enabled_count()} functions still hooked 120 s after {tool} exited", flush=True)
    return out


def start_table(results: dict[tuple[str, str], list[dict[str, float]]], modes: list[str], tools: list[str]) -> str:
    """Medians per mode and tool. Ratio to bpftrace: ours after Python's own start over bpftrace's start; ratio to
    retsnoop: ours with Python's own start over retsnoop's (both as the issue's acceptance states them)."""
    def med(mode: str, tool: str, key: str) -> float | None:
        vals = [x[key] for x in results.get((mode, tool), []) if key in x]
        return statistics.median(vals) if vals else None

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    def ms(v: float | None) -> str:  # a stop of tens of ms under emulation: in ms, or the ratio is hidden
        return "-" if v is None else f"{v * 1000:.0f} ms"

    out = ["| mode | tool | start | start after Python's own | imports | other phases | ratio to bpftrace "
           "| ratio to retsnoop (Python's start included) | stop (signal to exit) | stop ratio to retsnoop |",
           "|---" * 10 + "|"]
    for mode in modes:
        bt, rs = med(mode, "bpftrace", "start"), med(mode, RETSNOOP, "start")
        rs_stop = med(mode, RETSNOOP, "stop")
        for tool in tools:
            start = med(mode, tool, "start")
            if tool in ("bpftrace", RETSNOOP):
                flag = RETSNOOP_FLAGS[NEAREST[mode]] if tool == RETSNOOP else NEAREST[mode]
                out.append(f"| {mode} | {tool} ({flag}) | {num(start)} | - | - | - | - | - "
                           f"| {ms(med(mode, tool, 'stop'))} | - |")
                continue
            after, imports = med(mode, tool, "after_python"), med(mode, tool, "imports")
            other = None if after is None else after - (imports or 0.0)
            out.append(f"| {mode} | {tool} | {num(start)} | {num(after)} | {num(imports)} | {num(other)} "
                       f"| {ratio(after, bt)} | {ratio(start, rs)} | {ms(stop := med(mode, tool, 'stop'))} "
                       f"| {ratio(stop, rs_stop)} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="kprobe_session,kprobe_multi")
    ap.add_argument("--set", default="1000", choices=list(SETS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=0, help="run everything on this CPU (-1: anywhere)")
    ap.add_argument("--base", type=Path, help="another checkout of ours (its Python code and BPF object)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter ours runs under (default: this one; "
                    "e.g. /usr/bin/python3, Debian's, as a Debian host or the container image runs it: a text-only "
                    "trace needs no library of the virtualenv)")
    ap.add_argument("--base-python", default=sys.executable, help="the interpreter --base runs under")
    ap.add_argument("--peers", default="bpftrace", help="bpftrace, retsnoop, both or none (retsnoop: --retsnoop-bin)")
    ap.add_argument("--retsnoop-bin", type=Path, help=f"the retsnoop binary (default: ${RETSNOOP_ENV})")
    ap.add_argument("--deny", default="", metavar="GLOB[,GLOB]", help="leave these functions out for every tool")
    ap.add_argument("--cold", action="store_true", help="every start of ours with an empty kernel cache, as the "
                    "first start after a boot or a kernel update")
    ap.add_argument("--cache-from", type=Path, metavar="DIR", help="every start of ours with a copy of this kernel "
                    "cache (RETSNOOP_OTEL_CACHE of a run in an earlier boot): the first start after a reboot")
    ap.add_argument("--drop-caches", action="store_true", help="drop the kernel's page cache before every start "
                    "(both tools): their files are read again from the disk or the 9p server, as after a boot")
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p not in ("", "none")]  # none: ours (and --base) only
    if unknown := [p for p in peers if p not in ("bpftrace", RETSNOOP)]:
        ap.error(f"unknown peer {', '.join(unknown)}: choose from bpftrace, {RETSNOOP}")
    deny = [g for g in args.deny.split(",") if g]
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    if "bpftrace" in peers and shutil.which("bpftrace") is None:
        print("bpftrace is not installed: apt-get install bpftrace (the Debian package)", file=sys.stderr)
        return 2
    rs_bin = None
    if RETSNOOP in peers:
        try:
            rs_bin = retsnoop_bin(args.retsnoop_bin)
        except ValueError as exc:
            print(f"bench.start_compare: {exc}", file=sys.stderr)
            return 2
    entry, allow = (list(x) for x in SETS[args.set])
    tools = ["ours", *(["ours-base"] if args.base else []), *peers]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="start-compare-") as tmpdir:
        tmp = Path(tmpdir)
        warm_up(tmp, args.python)
        if args.base:  # the other checkout fills its own kernel cache too (untimed)
            subprocess.run([args.base_python, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "--dry-run"],
                           cwd=args.base, capture_output=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=str(args.base), RETSNOOP_OTEL_CACHE=str(tmp / "cache-base")))
        modes = args.modes.split(",")
        rs_sets: dict[tuple[str, str], set[str]] = {}
        same = {m: same_names(args.set, m, deny, rs_bin, rs_sets) for m in modes}
        for m, s in same.items():
            print(f"{m}: {len(s.names)} functions for every tool; only ours would take {s.ours_deny[len(deny):]}, "
                  f"only retsnoop {s.retsnoop_deny[len(deny):]} (each denied to the tool that would)", flush=True)
        for r in range(args.rounds):
            done: dict[tuple, dict[str, float]] = {}  # a peer's start in this round, by what it ran
            for mode in modes:
                for tool in (tools if r % 2 == 0 else tools[::-1]):  # alternate the order between rounds
                    tool_deny = same[mode].retsnoop_deny if tool == RETSNOOP else same[mode].ours_deny
                    key = peer_run_key(tool, mode, same[mode])
                    if tool in peers and key in done:
                        res = done[key]
                    else:
                        cache = f"cache-cold-{r}-{mode}" if args.cold else "cache"
                        if args.cache_from and tool == "ours":  # as an earlier boot left it, at every start
                            cache = f"cache-from-{r}-{mode}"
                            shutil.copytree(args.cache_from, tmp / cache, symlinks=True)
                        if args.drop_caches:
                            drop_caches()
                        try:
                            res = start_once(tool, mode, entry, allow, same[mode].names, tmp, args.base, tool_deny,
                                             rs_bin, cache, args.base_python if tool == "ours-base" else args.python)
                        except RuntimeError as exc:  # one tool that cannot start here: the others still run
                            print(f"round {r} {mode} {tool}: {exc}", flush=True)
                            res = {}
                        done[key] = res
                    results.setdefault((mode, tool), []).append(res)
                    print(f"round {r} {mode} {tool}: " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
    print(f"\nkernel {os.uname().release}; set {args.set}; medians of {args.rounds} rounds (seconds)"
          f"{'; ours with an empty kernel cache at every start' if args.cold else ''}"
          f"{f'; ours with the kernel cache {args.cache_from} left at every start' if args.cache_from else ''}"
          f"{'; page cache dropped before every start' if args.drop_caches else ''}\n")
    print(start_table(results, modes, tools))
    return 0


def drop_caches() -> None:
    """Clean pages written back, then the page cache, dentries and inodes dropped (root only: the VM)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


if __name__ == "__main__":
    sys.exit(main())

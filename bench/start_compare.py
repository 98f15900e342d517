"""Start only, ours against bpftrace (and another checkout of ours), over interleaved rounds in one boot.

    tests/vm/run --kernel 6.12 -- python bench/start_compare.py [--modes kprobe_session,kprobe_multi]
        [--set 1000] [--rounds 5] [--base CHECKOUT]

Under emulation one start of the same build moves by a third between runs of one boot (Python's own start
measured 1.4 to 2.4 s in bench/peer_compare.py's runs), so one run per tool cannot say whether a change
helped. Each round starts every tool once per mode, waits for it to be ready (ours: "Receiving data...",
bpftrace: its BEGIN output, run once every probe is attached), stops it and waits until the kernel has no
function hooked any more; the table gives medians over the rounds: start, ours also without Python's own
start (the ratio's numerator, as in the issue's acceptance), and our -v phases. Same sets, programs, CPU
pinning and kernel cache as bench/peer_compare.py, whose helpers this uses.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_compare as pc  # noqa: E402


def start_once(tool: str, mode: str, entry: list[str], allow: list[str], names: list[str], tmp: Path,
               base: Path | None) -> dict[str, float]:
    program = tmp / f"{mode}.bt"
    program.write_text(pc.bpftrace_program(mode, entry, allow, names))
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(4 * len(names) + 64),
               BPFTRACE_MAX_BPF_PROGS=str(4 * len(names) + 64),
               # a cache of its own per checkout: another build may keep another cache format, and two
               # formats in one directory replace each other's entries at every start (each start cold)
               RETSNOOP_OTEL_CACHE=str(tmp / ("cache-base" if tool == "ours-base" else "cache")))
    tree = base if tool == "ours-base" else None
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    print(f"  {time.strftime('%H:%M:%S')} starting {tool} {mode}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(pc.start_command(tool, mode, entry, allow, program, tree), cwd=tree or pc.ROOT, env=env,
                            text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=pc._roomy_nofile)
    lines = pc.Lines(proc)
    out: dict[str, float] = {}
    try:
        ready = lines.wait_for(pc.READY_BT if tool == "bpftrace" else pc.READY_OURS, 300)
        if ready is None:
            raise RuntimeError(f"{tool} {mode} never ready: " + " | ".join(lines.tail()))
        out["start"] = ready[0] - t0
        if tool != "bpftrace":
            lines.wait_for(re.compile(r"^Phase ready"), 60)
            out |= {m.group(1): int(m.group(2)) / 1000 for _, m in lines.find(pc.PHASE_OURS)}
            out["after_python"] = out["start"] - out.get("python", 0.0)
    finally:
        # bpftrace ignores a SIGINT that comes right after its BEGIN output: ask again every 5 s
        for _ in range(24):
            proc.send_signal(signal.SIGINT if tool == "bpftrace" else signal.SIGTERM)
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            print(f"  {tool} {mode} did not exit 120 s after the first stop signal: killed; "
                  + " | ".join(lines.tail()), flush=True)
            proc.kill()
            proc.wait()
        lines.join()
        for _ in range(120):  # the next start must not pay for this one's teardown
            if pc.enabled_count() <= 0:
                break
            time.sleep(1)
        else:
            print(f"  {pc.enabled_count()} functions still hooked 120 s after {tool} exited", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="kprobe_session,kprobe_multi")
    ap.add_argument("--set", default="1000", choices=list(pc.SETS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=0, help="run everything on this CPU (-1: anywhere)")
    ap.add_argument("--base", type=Path, help="another checkout of ours (its Python code and BPF object)")
    args = ap.parse_args()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    if shutil.which("bpftrace") is None:
        print("bpftrace is not installed: apt-get install bpftrace (the Debian package)", file=sys.stderr)
        return 2
    facts = pc.KernelFacts.load()
    entry, allow = (list(x) for x in pc.SETS[args.set])
    tools = ["ours", *(["ours-base"] if args.base else []), "bpftrace"]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="start-compare-") as tmpdir:
        tmp = Path(tmpdir)
        pc.warm_up(tmp)
        if args.base:  # the other checkout fills its own kernel cache too (untimed)
            subprocess.run([sys.executable, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "--dry-run"],
                           cwd=args.base, capture_output=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=str(args.base), RETSNOOP_OTEL_CACHE=str(tmp / "cache-base")))
        modes = args.modes.split(",")
        names = {m: pc.our_functions(facts, entry, allow, m) for m in modes}
        for r in range(args.rounds):
            for mode in modes:
                for tool in (tools if r % 2 == 0 else tools[::-1]):  # alternate the order between rounds
                    res = start_once(tool, mode, entry, allow, names[mode], tmp, args.base)
                    results.setdefault((mode, tool), []).append(res)
                    print(f"round {r} {mode} {tool}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True)
    print(f"\nkernel {os.uname().release}; set {args.set}; medians of {args.rounds} rounds (seconds)\n")
    print("| mode | tool | start | start after Python's own | imports | other phases | ratio to bpftrace |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        peer = statistics.median(x["start"] for x in results[(mode, "bpftrace")])
        for tool in tools:
            rs = results[(mode, tool)]
            start = statistics.median(x["start"] for x in rs)
            if tool == "bpftrace":
                print(f"| {mode} | bpftrace | {start:.2f} | - | - | - | 1.00x |")
                continue
            after = statistics.median(x["after_python"] for x in rs)
            imports = statistics.median(x.get("imports", 0.0) for x in rs)
            print(f"| {mode} | {tool} | {start:.2f} | {after:.2f} | {imports:.2f} | {after - imports:.2f} "
                  f"| {after / peer:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""BPF ns per call of retsnoop-otel and bpftrace measured on the same workload calls, both attached at once.

    tests/vm/run --kernel 6.12 -- python -m bench.together_cost --modes kprobe,fentry --rounds 5

bench/peer_compare.py runs one tool after the other: under emulation one run of either tool can move by
half within a boot (the host's other load changes the speed of the guest), so a per-call ratio from
runs minutes apart carries that drift. Here both tools hook the same functions at the same time and
every workload call runs the programs of both; the kernel's run_time_ns of each program then splits
the BPF time per call between the tools, measured over the very same calls. The programs, the sets, the
workload and the peers are peer_compare's (see its docstring): an entry and an exit probe on the same
functions, 2,000 failing bpf(BPF_MAP_CREATE) calls, everything pinned to one CPU.

What sharing the hooks changes, and how it is handled:
- Order: an aggregated kprobe and a trampoline run their programs in attach order, and the first one
  meets colder caches. --orders ours-first,peer-first (the default) attaches both ways round, one
  after the other, and reports each.
- Hooks fire once for both, so the workload's wall time per call is the sum and is not split; only
  the BPF time is. Start, attach and detach stay peer_compare's figures.
- Probe runs per call are reported for both: a tool's program running inside the other's (fentry
  on a helper the other calls) would show there as extra runs.
- A function in the set that one tool's programs call fires both tools' hooks inside that tool's
  programs, as it did in its own runs: `--deny bpf_obj_free_fields` leaves the peer's out (see
  peer_compare's --deny and bench/nested_calls.py).

Output: one JSON line per round while it goes, then a markdown table (ours / peer) with the median
over every round of both orders.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fnmatch import fnmatch
from pathlib import Path

from bench.harness import (
    PEERS,
    SETS,
    Attached,
    KernelFacts,
    attach,
    build_workload,
    detach,
    enabled_names,
    our_functions,
    prog_stats,
    run_workload,
    set_stats,
    settle_hooks,
)
from retsnoop_otel.kernel import features

ORDERS = ("ours-first", "peer-first")


@dataclass
class Round:
    mode: str
    set_name: str
    order: str
    round: int
    hooked_ours: int
    probes_peer: int
    ns_per_call: float  # the workload's, with both attached
    bpf_ns_ours: float
    bpf_ns_peer: float
    runs_ours: float
    runs_peer: float

    @property
    def ratio(self) -> float:
        return self.bpf_ns_ours / self.bpf_ns_peer if self.bpf_ns_peer else float("nan")


def measure(ours: Attached, peer: Attached, workload: list[str], calls: int) -> tuple[float, ...]:
    """One workload run: its ns per call, then BPF ns and probe runs per call of ours and the peer's."""
    s0 = prog_stats()
    set_stats(True)
    try:
        ns = run_workload(workload, calls)
    finally:
        set_stats(False)
    s1 = prog_stats()

    def per_call(ids: list[int], k: int) -> float:
        return sum(s1[i][k] - s0[i][k] for i in ids if i in s0 and i in s1) / calls

    return (ns, per_call(ours.prog_ids, 1), per_call(peer.prog_ids, 1), per_call(ours.prog_ids, 2),
            per_call(peer.prog_ids, 2))


def run_mode(mode: str, set_name: str, peer_tool: str, orders: list[str], rounds: int, calls: int,
             workload: list[str], tmp: Path, facts: KernelFacts, timeout: float,
             deny: Sequence[str] = ()) -> list[Round]:
    entry, allow = SETS[set_name]
    names = [n for n in our_functions(entry, allow, mode) if not any(fnmatch(n, g) for g in deny)]
    out: list[Round] = []
    for order in orders:
        tools = ["ours", peer_tool] if order == "ours-first" else [peer_tool, "ours"]
        running: dict[str, Attached] = {}
        try:
            for tool in tools:
                running[tool] = attach(tool, mode, list(entry), list(allow), names, tmp, facts, timeout, deny)
                if tool == "ours" and mode == "fentry":
                    # bpftrace stops at the first function it cannot attach (variadic ones have no fexit),
                    # where ours skips it: the peer gets what ours hooked (the first order runs ours first)
                    hooked = enabled_names() or set()
                    names = [n for n in names if n in hooked]
            hooked_ours = len(names)
            for r in range(rounds):
                running["ours"].lines.quiet_for(2.0, cap=300.0)  # the reader done printing the last round
                ns, bo, bp, ro, rp = measure(running["ours"], running[peer_tool], workload, calls)
                rnd = Round(mode, set_name, order, r + 1, hooked_ours, running[peer_tool].probes, ns, bo, bp, ro, rp)
                print(json.dumps(asdict(rnd) | {"ratio": round(rnd.ratio, 3)}), flush=True)
                out.append(rnd)
        finally:
            for tool in reversed(list(running)):
                detach(running[tool], timeout)
            settle_hooks(300)
    return out


def table(rounds: list[Round], peer: str, calls: int) -> str:
    out = [f"kernel {os.uname().release}; {calls:,} failing bpf(BPF_MAP_CREATE) calls per round, both tools "
           f"attached at once; BPF ns per workload call, ours / {peer}:", "",
           "| mode | set | functions (ours / peer probes) | order | rounds | BPF ns per call ours (median) | "
           "peer (median) | ratio by round | probe runs per call ours / peer |",
           "|---" * 9 + "|"]
    groups: dict[tuple[str, str, str], list[Round]] = {}
    for r in rounds:
        groups.setdefault((r.mode, r.set_name, r.order), []).append(r)
    for (mode, set_name, order), rs in groups.items():
        out.append(f"| {mode} | {set_name} | {rs[0].hooked_ours} / {rs[0].probes_peer} | {order} | {len(rs)} | "
                   f"{statistics.median(r.bpf_ns_ours for r in rs):,.0f} | "
                   f"{statistics.median(r.bpf_ns_peer for r in rs):,.0f} | "
                   f"{', '.join(f'{r.ratio:.2f}x' for r in rs)} | "
                   f"{statistics.median(r.runs_ours for r in rs):.1f} / "
                   f"{statistics.median(r.runs_peer for r in rs):.1f} |")
    out.append("")
    for mode, set_name in dict.fromkeys((r.mode, r.set_name) for r in rounds):
        rs = [r for r in rounds if (r.mode, r.set_name) == (mode, set_name)]
        ratios = [r.ratio for r in rs]
        out.append(f"- {mode} {set_name}: median ratio {statistics.median(ratios):.2f}x over {len(rs)} "
                   f"round{'s' if len(rs) > 1 else ''} (range {min(ratios):.2f}-{max(ratios):.2f}x)")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="1000", help=f"function sets ({', '.join(SETS)})")
    ap.add_argument("--modes", default="kprobe_session,kprobe_multi,kprobe,fentry")
    ap.add_argument("--peer", default="bpftrace", choices=PEERS)
    ap.add_argument("--orders", default=",".join(ORDERS), help="which tool attaches first, one attachment each")
    ap.add_argument("--rounds", type=int, default=5, help="workload runs per attachment")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--cpu", type=int, default=0, help="run everything on this CPU (-1: anywhere)")
    ap.add_argument("--json", type=Path, help="also write every round here")
    ap.add_argument("--deny", default="", metavar="GLOB[,GLOB]", help="leave these functions out of the set for "
                    "both tools (say the peer's own helpers: see above); kprobe and fentry only, where the peer "
                    "gets a list, not globs")
    args = ap.parse_args()
    deny = [g for g in args.deny.split(",") if g]
    orders = sorted(args.orders.split(","), key=ORDERS.index)  # ours first first: fentry's set comes from it
    if any(o not in ORDERS for o in orders) or args.rounds < 1:
        ap.error(f"--orders takes {', '.join(ORDERS)}; --rounds 1 or more")
    if shutil.which("bpftrace") is None:
        print("bpftrace is not installed: apt-get install bpftrace (the Debian package)", file=sys.stderr)
        return 2
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    facts = KernelFacts.load()
    set_stats(False)
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="together-") as tmpdir:
        tmp = Path(tmpdir)
        workload = build_workload(tmp)
        for set_name in args.sets.split(","):
            for mode in args.modes.split(","):
                try:
                    features.require_tracing(facts.feats, mode)
                except features.FeatureError as exc:
                    print(json.dumps({"mode": mode, "skipped": str(exc)}), flush=True)
                    continue
                if deny and mode in ("kprobe_multi", "kprobe_session"):
                    print(json.dumps({"mode": mode, "skipped": "--deny: the peer attaches globs here"}), flush=True)
                    continue
                rounds += run_mode(mode, set_name, args.peer, orders, args.rounds, args.calls, workload, tmp,
                                   facts, args.timeout, deny)
    text = table(rounds, args.peer, args.calls)
    print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

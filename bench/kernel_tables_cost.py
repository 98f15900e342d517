"""Reading the kernel's tables and resolving globs with them: what a start spends before it loads BPF.

    .venv/bin/python -m bench.kernel_tables_cost [--root DIR] [--runs N] [--base CHECKOUT]

Times, in a fresh interpreter per run, what `trace` and the agent do with kallsyms, available_filter_functions
and the BTF function types: the first start (read and parse them, fill the kernel cache), a start with the
cache filled (load it), and discovery over the loaded tables for three sets (20 functions, ~1,300 of the BPF
subsystem, ~10,000 of idle subsystems, as bench/peer_compare.py and bench/agent_scale.py choose them).
Under emulation these were seconds of every start (`trace -v`: phases btf, symbols, discovery), about 30x
the host's time.

--root is a directory laid out like / with the files the readers take (proc/kallsyms, proc/modules,
proc/sys/kernel/random/boot_id, sys/kernel/notes, sys/kernel/btf/vmlinux,
sys/kernel/tracing/available_filter_functions): copied from a VM guest, it lets a host without tracing
measure that kernel's tables. --base runs another checkout the same way, runs interleaved.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.harness import AGENT_SCALE_GLOBS, ROOT, THIS, child_json, interleaved, medians

SETS = {"20": (["*sys_bpf"], ["array_map_*"]), "1300": (["*sys_bpf"], ["bpf_*", "array_map_*", "map_*"]),
        "10000": (["*sys_bpf"], list(AGENT_SCALE_GLOBS))}

CHILD = r"""
import json, sys, tempfile, time
root, sets = sys.argv[1], json.loads(sys.argv[2])
from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
from retsnoop_otel.symbols import discovery, kernel_facts
out = {}
with tempfile.TemporaryDirectory() as cache_dir:
    for run in ("cold", "warm"):
        cache = KernelCache.at(cache_dir)
        t0 = time.perf_counter()
        ident = kernel_identity(root)
        types, _ = kernel_facts.load_func_types(cache, ident, root)
        ksyms, available, cached = kernel_facts.load_symbols(cache, ident, root)
        out[f"{run}_ms"] = (time.perf_counter() - t0) * 1e3
        assert cached == (run == "warm"), run
    for name, (entry, allow) in sets.items():
        t0 = time.perf_counter()
        found = discovery.discover(entry, allow, [], ksyms, available, types, "kprobe_session")
        out[f"discovery_{name}_ms"] = (time.perf_counter() - t0) * 1e3
        out[f"functions_{name}"] = len(found.funcs)
        ksyms, available, _ = kernel_facts.load_symbols(cache, ident, root)  # the next set: fresh tables
    # a fentry tracer's first stack and an agent's reload: the kallsyms text with 2,000 programs' symbols in
    # the module area (the parse of the fresh read is in both; then the same again, then half of them gone)
    text = open(f"{root}/proc/kallsyms").read()
    top = max(a for a, _, _ in ksyms.items())
    bpf = "".join(f"{top + 0x1000 * (i + 1):016x} t bpf_prog_{i:016x}_rs_fexit\t[bpf]\n" for i in range(2000))
    for what, extra in (("sync_new", bpf), ("sync_same", bpf), ("sync_half_gone", bpf[:len(bpf) // 2])):
        t0 = time.perf_counter()
        ksyms.sync_bpf_symbols(text + extra)
        out[f"{what}_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        assert ksyms.lookup(top + 0x1008).name.startswith("bpf_prog_0")
        out[f"{what}_lookup_ms"] = (time.perf_counter() - t0) * 1e3
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="/", help="where the kernel's files are (default: this machine's)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--base", type=Path, help="another checkout (`git worktree add /tmp/base REV`)")
    args = ap.parse_args()
    trees = {THIS: ROOT} | ({"base": args.base.resolve()} if args.base else {})
    sets = json.dumps(SETS)
    med = medians(interleaved(trees, args.runs, lambda tree: child_json(CHILD, tree, args.root, sets)))
    cols = ["cold_ms", "warm_ms", *(f"discovery_{s}_ms" for s in SETS), "sync_new_ms", "sync_same_ms",
            "sync_half_gone_ms", "sync_new_lookup_ms"]
    heads = ["first start: read, parse, cache", "cache filled: load",
             *(f"discovery, {med[THIS]['functions_' + s]:,.0f} functions" for s in SETS),
             "[bpf] sync: 2,000 new", "the same again", "half of them gone", "first lookup after"]
    print(f"medians of {args.runs} runs, ms\n")
    print("| tree | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(cols))
    for name, m in med.items():
        print(f"| {name} | " + " | ".join(f"{m[c]:,.1f}" for c in cols) + " |")
    if args.base:
        ratios = " | ".join(f"{med[THIS][c] / med['base'][c]:.2f}x" for c in cols)
        print(f"| this checkout / base | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

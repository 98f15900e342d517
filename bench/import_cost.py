"""What `trace` imports before it can attach, and what that costs: run on any host (no tracing needed).

    .venv/bin/python bench/import_cost.py [--runs N] [--base CHECKOUT]

Under emulation (tests/vm) importing our modules is the largest phase of `trace -v` ("imports", about
35x the host's time), so a millisecond here is tens of milliseconds of a user's wait there. Each run is
a fresh interpreter (bytecode compiled beforehand, as `tests/vm/run` does) that imports the modules a
`trace` start loads, in the order it loads them, and reports the wall time of those imports and how many
dataclasses and NamedTuples they define (under Python 3.11 the dataclass decorator compiles five to six
methods per frozen class as its module loads: 0.65 ms each on the CI host, a NamedTuple 0.05 ms).
--base runs another checkout (`git worktree add /tmp/base REV`) the same way, runs interleaved, and
prints the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the modules a `trace` start imports before "Receiving data...": the command's own tree, then what the
# runtime's phases import on the way (kernel facts, feature probes, symbolizer, console renderer)
START_MODULES = (
    "retsnoop_otel.trace.main", "retsnoop_otel.kernel.features", "retsnoop_otel.kernel.tracefs",
    "retsnoop_otel.kernel.kcache", "retsnoop_otel.kernel.lbr", "retsnoop_otel.kernel.caps",
    "retsnoop_otel.kernel.tracer", "retsnoop_otel.symbols.btf", "retsnoop_otel.symbols.kernel_facts",
    "retsnoop_otel.symbols.symbolize", "retsnoop_otel.symbols.vmlinux", "retsnoop_otel.symbols.discovery",
    "retsnoop_otel.capture.clock", "retsnoop_otel.render.console",
)

CHILD = r"""
import dataclasses, importlib, json, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
for name in sys.argv[2:]:
    importlib.import_module(name)
total = time.perf_counter() - t0
ours = [m for n, m in list(sys.modules.items()) if n.startswith("retsnoop_otel")]
classes = {id(c): c for m in ours for c in vars(m).values()
           if isinstance(c, type) and c.__module__.startswith("retsnoop_otel")}.values()
print(json.dumps({"imports_ms": total * 1e3, "modules": len(ours),
                  "dataclasses": sum(dataclasses.is_dataclass(c) for c in classes),
                  "named_tuples": sum(issubclass(c, tuple) and hasattr(c, "_fields") for c in classes)}))
"""


def one_run(checkout: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(checkout), *START_MODULES], check=True,
                         capture_output=True, text=True, cwd=checkout).stdout
    return json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--base", type=Path, help="another checkout, run interleaved with this one")
    args = ap.parse_args()
    trees = {"this checkout": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-qq", "retsnoop_otel"], cwd=tree, check=True)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(one_run(tree))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"| tree | imports (median of {args.runs}) | dataclasses | NamedTuples | our modules |")
    print("|---|---|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['imports_ms']:.1f} ms | {m['dataclasses']:.0f} | {m['named_tuples']:.0f} "
              f"| {m['modules']:.0f} |")
    if args.base:
        a, b = med["this checkout"], med["base"]
        print(f"\nimports: this checkout / base = {a['imports_ms'] / b['imports_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

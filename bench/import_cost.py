"""What `trace` imports before it can attach, and what that costs: run on any host (no tracing needed).

    .venv/bin/python -m bench.import_cost [--runs N] [--base CHECKOUT]

Under emulation (tests/vm) importing our modules is the largest phase of `trace -v` ("imports", about
35x the host's time), so a millisecond here is tens of milliseconds of a user's wait there. Each run is
a fresh interpreter (bytecode compiled beforehand, as `tests/vm/run` does) that imports the modules a
`trace` start loads, in the order it loads them, and reports the wall time of those imports and how many
dataclasses and NamedTuples they define (under Python 3.11 the dataclass decorator compiles five to six
methods per frozen class as its module loads: 0.65 ms each on the CI host, a NamedTuple 0.05 ms).
--base runs another checkout (`git worktree add /tmp/base REV`) the same way, runs interleaved, and
prints the ratio of the medians. The same types are what the reader builds per ring-buffer record, so
the last table times `capture.records.decode` of a session end, a session start and a per-call record
in each tree.
"""

from __future__ import annotations

import subprocess
import sys

from bench.harness import THIS, child_json, interleaved, medians, parse_trees
from bench.start_path import START_MODULES

CHILD = r"""
import importlib, json, sys, time  # not dataclasses: whether the start imports it is part of what is measured
t0 = time.perf_counter()
for name in sys.argv[1:]:
    importlib.import_module(name)
total = time.perf_counter() - t0
ours = [m for n, m in list(sys.modules.items()) if n.startswith("retsnoop_otel")]
classes = {id(c): c for m in ours for c in vars(m).values()
           if isinstance(c, type) and c.__module__.startswith("retsnoop_otel")}.values()
print(json.dumps({"imports_ms": total * 1e3, "modules": len(ours),
                  "dataclasses": sum("__dataclass_fields__" in vars(c) for c in classes),
                  "named_tuples": sum(issubclass(c, tuple) and hasattr(c, "_fields") for c in classes)}))
"""


DECODE = r"""
import json, timeit
from retsnoop_otel.capture import records as r
m = r.MAX_FSTACK_DEPTH
end = r.SESSION_END.pack(r.REC_SESSION_END, 11, 11, 0, 100, 200, 0, 0, 3, 0, 1, 0, 4, 4, 80, b"comm", b"pcomm",
                         b"exe", *[1] * m, *[-22] * m, *[5] * m, *[0xffffffff81000000] * r.MAX_KSTACK_DEPTH)
start = r.SESSION_START.pack(r.REC_SESSION_START, 11, 11, 0, 100, b"comm", b"pcomm")
call = r.FUNC_TRACE.pack(r.REC_FUNC_EXIT, 11, 150, 2, 1, 3, 50, -22)
print(json.dumps({name: min(timeit.repeat(lambda: r.decode(data), number=20000, repeat=5)) / 20000 * 1e9
                  for name, data in (("session end", end), ("session start", start), ("call", call))}))
"""


def main() -> int:
    args, trees = parse_trees(__doc__.split("\n\n")[0], runs=15)
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-qq", "retsnoop_otel"], cwd=tree, check=True)
    med = medians(interleaved(trees, args.runs, lambda tree: child_json(CHILD, tree, *START_MODULES)))
    print(f"| tree | imports (median of {args.runs}) | dataclasses | NamedTuples | our modules |")
    print("|---|---|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['imports_ms']:.1f} ms | {m['dataclasses']:.0f} | {m['named_tuples']:.0f} "
              f"| {m['modules']:.0f} |")
    if args.base:
        print(f"\nimports: this checkout / base = {med[THIS]['imports_ms'] / med['base']['imports_ms']:.2f}x")
    decoded = {name: child_json(DECODE, tree) for name, tree in trees.items()}
    kinds = list(decoded[THIS])
    print("\n| tree | " + " | ".join(f"decode a {k} record" for k in kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for name, d in decoded.items():
        print(f"| {name} | " + " | ".join(f"{d[k]:,.0f} ns" for k in kinds) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

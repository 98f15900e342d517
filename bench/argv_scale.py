"""How `trace`'s command line costs as it grows: our chunked parse beside argparse's single parse of the same words.

    .venv/bin/python -m bench.argv_scale [--max 100000]

The peer is argparse itself, the same parser (the same declared flags, types and getopt-style joining), parsing
all the words at once as it did before issue 47.3; only the chunking differs. Each size is timed in a fresh
interpreter, best of 3. argparse's single parse is quadratic (each option word scans all later ones, each
`append` copies the list so far), so it is skipped above 20,000 words (it takes minutes there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
from retsnoop_otel.command.flag_parser import joined_values
from retsnoop_otel.command.help_format import OneLineParser
from retsnoop_otel.trace.flags import build_parser
n, kind, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
p = build_parser()
words = ["-e", "x"] + (["-a", "x"] * n if kind == "a" else ["-v"] * n)
takes = frozenset(o for d in p.declared if d.action.nargs is None for o in d.action.option_strings)
best = float("inf")
for _ in range(3):
    t = time.perf_counter()
    if how == "ours":
        p.parse_args(words)
    else:
        OneLineParser.parse_known_args(p, joined_values(words, takes))
    best = min(best, time.perf_counter() - t)
print(json.dumps(best))
"""


def timed(n: int, kind: str, how: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), kind, how], capture_output=True, text=True,
                         check=True, timeout=1800)
    return float(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=100000)
    top = ap.parse_args().max
    print("| words | flag | ours (s) | argparse alone (s) | ratio |\n|---|---|---|---|---|")
    for n in (1000, 10000, 100000):
        if n > top:
            break
        for kind, flag in (("a", "`-a x`"), ("v", "`-v`")):
            ours = timed(n, kind, "ours")
            peer = timed(n, kind, "argparse") if n <= 20000 else None
            ratio = f"{ours / peer:.3f}x" if peer else "-"
            print(f"| {n:,} | {flag} | {ours:.3f} | {'skipped' if peer is None else f'{peer:.3f}'} | {ratio} |")


if __name__ == "__main__":
    main()

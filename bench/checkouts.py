"""This checkout against another one (--base), each measured in fresh interpreters, runs interleaved.

Shared by the host benches that compare two trees of ours: interleaving keeps a machine's slow minute
from landing on one tree only, and a fresh interpreter per run counts imports as a user's start does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIS = "this checkout"


def parse_trees(description: str, runs: int) -> tuple[argparse.Namespace, dict[str, Path]]:
    """--runs and --base, and the trees to measure by name (this checkout first)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--base", type=Path, help="another checkout (`git worktree add /tmp/base REV`), run "
                    "interleaved with this one")
    args = ap.parse_args()
    return args, {THIS: ROOT} | ({"base": args.base.resolve()} if args.base else {})


def child_json(code: str, tree: Path, *argv: str) -> dict[str, float]:
    """Run `code` in a fresh interpreter with `tree` first on sys.path (its sys.argv[1]); its JSON line."""
    out = subprocess.run([sys.executable, "-c", code, str(tree), *argv], check=True, capture_output=True,
                         text=True, cwd=tree).stdout
    return json.loads(out)


def interleaved(trees: dict[str, Path], runs: int,
                one_run: Callable[[Path], dict[str, float]]) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(runs):
        for name, tree in trees.items():
            out[name].append(one_run(tree))
    return out


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}

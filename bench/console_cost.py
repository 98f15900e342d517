"""The console's cost per session (`trace`'s default output): symbolize the kernel stack, match it with the
error chain, format the rows. Run as root on any host (it reads /proc/kallsyms; no tracing needed):

    .venv/bin/python -m bench.console_cost [--sessions N] [--stacks N]

Side by side in one run: the console as trace runs it (stack layouts kept per stack shape, symbolizer
results cached per address), the same without kept layouts (the build before render/stack.py's
StackLayouts), and without the symbolizer's cache either (the build before that). Under emulation
(tests/vm) the reader of `bench/peer_compare.py` spent 3.7 ms per session draining 2,000 of them; on
one CPU that time is taken from the traced workload.

The sessions: --stacks distinct kernel stacks (real addresses of this kernel's bpf(2) path and of
random functions below it), a four-level error chain each, repeated to --sessions, as a failing
syscall in a loop produces.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from retsnoop_otel.capture.model import RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.render.console import session_text
from retsnoop_otel.render.stack import StackLayouts
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import Frame, KallsymsSymbolizer

NEG = 1 << 64
OFFSET = 1_700_000_000 * 10**9
CHAIN = [("__x64_sys_bpf", RetKind.SIGNED), ("__sys_bpf", RetKind.INT32), ("map_create", RetKind.INT32),
         ("array_map_alloc_check", RetKind.INT32)]
OUTER = ["do_syscall_64", "entry_SYSCALL_64_after_hwframe"]


class Uncached(KallsymsSymbolizer):
    """The symbolizer as it was: every frame looked up again."""

    def frames(self, addr: int) -> list[Frame]:
        return self._lookup(addr)


def sessions(ksyms: Kallsyms, n: int, stacks: int) -> tuple[dict[int, TracedFunc], list[Session]]:
    def at(name: str) -> int:
        return ksyms.by_name(name)[0].addr

    funcs = {i: TracedFunc(i, name, at(name), kind, i == 0) for i, (name, kind) in enumerate(CHAIN)}
    rng = random.Random(1)
    names = sorted({name for _, name, _ in ksyms.items()})
    shapes = []
    for _ in range(stacks):
        below = [at(rng.choice(names)) + rng.randrange(1, 64) for _ in range(rng.randrange(0, 6))]
        chain_frames = [at(name) + rng.randrange(1, 0x200) for name, _ in reversed(CHAIN)]
        shapes.append(below + chain_frames + [at(name) + 0x40 for name in OUTER])
    chain = [StackEntry(i, NEG - 22, 30_000 - i * 5_000) for i in range(len(CHAIN))]
    out = [Session(1000 + i, 1000, "bpf_fail_loop", "bpf_fail_loop", 10**9 + i * 10**6, 10**9 + i * 10**6 + 31_000,
                   True, chain, shapes[i % stacks]) for i in range(n)]
    return funcs, out


def per_session_us(symbolizer: KallsymsSymbolizer, funcs: dict[int, TracedFunc], batch: list[Session],
                   keep_layouts: bool, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        layouts = StackLayouts(funcs, symbolizer) if keep_layouts else None  # a fresh console per pass
        t0 = time.perf_counter()
        for s in batch:
            session_text(s, funcs, symbolizer, OFFSET, calls_view=False, layouts=layouts)
        best = min(best, time.perf_counter() - t0)
    return best / len(batch) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--stacks", type=int, default=20)
    args = ap.parse_args()
    ksyms = Kallsyms.load()
    funcs, batch = sessions(ksyms, args.sessions, args.stacks)
    oldest = per_session_us(Uncached(ksyms), funcs, batch, keep_layouts=False)
    old = per_session_us(KallsymsSymbolizer(ksyms), funcs, batch, keep_layouts=False)
    new = per_session_us(KallsymsSymbolizer(ksyms), funcs, batch, keep_layouts=True)
    print(f"{len(ksyms):,} kallsyms functions; {args.sessions:,} sessions over {args.stacks} distinct stacks; "
          "best of 5 passes, us per session")
    print("| console | us per session | ratio to trace's |\n|---|---|---|")
    for name, us in (("as trace runs it (kept layouts, cached symbols)", new), ("without kept layouts", old),
                     ("without the symbol cache either", oldest)):
        print(f"| {name} | {us:.1f} | {us / new:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

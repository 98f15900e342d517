"""What a kernel stack's file:line costs on the capture loop: the DWARF symbolizer's first query (llvm-symbolizer
starts and opens the vmlinux), a query for an address not seen before, and one answered from its cache. Run from
the repo root with a DWARF vmlinux (tests/vm/fetch-kernel --dbg unpacks Debian's):

    .venv/bin/python -m bench.kernel_lines_cost --vmlinux PATH [--addresses N]

The addresses are N functions of the vmlinux's symbol table (+0x10, as a return address inside them), spread
over the whole kernel, so each is likely a compile unit not read yet: the worst case for a new address. The
runtime asks for each address of a kept session's kernel stack and for each traced function's definition; both
sets are bounded by the traced functions and their callers, and every answer is cached (symbols/dwarf.py,
symbols/symbolize.py), so after the first sessions a stack costs cache hits only.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time

from elftools.elf.elffile import ELFFile

from retsnoop_otel.symbols.dwarf import LlvmSymbolizer

STT_FUNC = 2


def function_addresses(vmlinux: str, n: int) -> list[int]:
    with open(vmlinux, "rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".symtab")
        if sec is None:
            raise SystemExit(f"{vmlinux} has no symbol table")
        data = sec.data()
    funcs = sorted({value for _name, info, _o, _shndx, value, size in struct.iter_unpack("<IBBHQQ", data)
                    if info & 0xF == STT_FUNC and size > 0x20})
    step = max(1, len(funcs) // n)
    return [a + 0x10 for a in funcs[::step][:n]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vmlinux", required=True)
    ap.add_argument("--addresses", type=int, default=400)
    args = ap.parse_args()
    addrs = function_addresses(args.vmlinux, args.addresses)
    t0 = time.perf_counter()
    sym = LlvmSymbolizer(args.vmlinux, 0)  # link-time addresses: no KASLR offset to undo
    sym.frames(addrs[0])
    first = time.perf_counter() - t0
    new = []
    for a in addrs[1:]:
        t = time.perf_counter()
        sym.frames(a)
        new.append(time.perf_counter() - t)
    t = time.perf_counter()
    for a in addrs:
        sym.frames(a)
    cached = (time.perf_counter() - t) / len(addrs)
    sym.close()
    new.sort()
    print(f"| first query | new address: median | p90 | max | cached |\n|---|---|---|---|---|\n"
          f"| {first * 1e3:.0f} ms | {statistics.median(new) * 1e3:.2f} ms | {new[int(len(new) * 0.9)] * 1e3:.2f} ms "
          f"| {new[-1] * 1e3:.1f} ms | {cached * 1e6:.2f} us |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernel addresses -> frames for people: kallsyms names always, DWARF file:line and inlines when available.

Every symbolizer has the same two methods, so renderers and exporters do not care which one runs:
- `frames(addr)` returns the frames at one address, OUTERMOST FIRST: the real (kallsyms) function
  first, with `offset` from its start, then the functions inlined into it down to the innermost one
  at that address (`inlined=True`, offset 0). An unknown address gives [].
- `describe(addr)` gives 'name+0xoff' (or the bare hex address when no symbol covers it).
Addresses are symbolized as given (stack return addresses included), as retsnoop prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from retsnoop_otel.symbols.kallsyms import Kallsyms


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    offset: int = 0
    module: str | None = None
    file: str | None = None
    line: int | None = None
    inlined: bool = False


class Symbolizer(Protocol):
    def frames(self, addr: int) -> list[Frame]: ...

    def describe(self, addr: int) -> str: ...


class SourceLookup(Protocol):
    """A DWARF line/inline source such as dwarf.LlvmSymbolizer: frames innermost inline first."""

    def frames(self, addr: int) -> list: ...  # objects with .function, .file, .line


def definition(symbolizer: Symbolizer, addr: int) -> tuple[str, int] | None:
    """(file, line) where the function starting at `addr` is defined, when DWARF says so."""
    frames = symbolizer.frames(addr)
    if frames and frames[0].offset == 0 and frames[0].file and frames[0].line:
        return frames[0].file, frames[0].line
    return None


class KallsymsSymbolizer:
    """Names and offsets only: what every host can give without debug info."""

    def __init__(self, kallsyms: Kallsyms) -> None:
        self._ksyms = kallsyms

    def frames(self, addr: int) -> list[Frame]:
        sym = self._ksyms.lookup(addr)
        return [] if sym is None else [Frame(sym.name, sym.offset, sym.module)]

    def describe(self, addr: int) -> str:
        sym = self._ksyms.lookup(addr)
        return f"0x{addr:x}" if sym is None else f"{sym.name}+0x{sym.offset:x}"


class DwarfSymbolizer(KallsymsSymbolizer):
    """kallsyms for the function and offset, a DWARF source for file:line and the inline chain."""

    def __init__(self, kallsyms: Kallsyms, source: SourceLookup) -> None:
        super().__init__(kallsyms)
        self._source = source

    def frames(self, addr: int) -> list[Frame]:
        base = super().frames(addr)
        if not base or base[0].module is not None:  # DWARF covers vmlinux only
            return base
        src = list(reversed(self._source.frames(addr)))  # outermost first
        if not src:
            return base
        top = base[0]
        out = [Frame(top.name, top.offset, None, src[0].file or None, src[0].line or None)]
        out.extend(Frame(s.function, 0, None, s.file or None, s.line or None, inlined=True) for s in src[1:])
        return out

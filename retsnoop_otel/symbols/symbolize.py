"""Kernel addresses -> frames for people: kallsyms names always, DWARF file:line and inlines when available.

Every symbolizer has the same two methods, so renderers and exporters do not care which one runs:
- `frames(addr)` returns the frames at one address, OUTERMOST FIRST: the real (kallsyms) function
  first, with `offset` from its start, then the functions inlined into it down to the innermost one
  at that address (`inlined=True`, offset 0). An unknown address gives [].
- `describe(addr)` gives 'name+0xoff' (or the bare hex address when no symbol covers it).
Addresses are symbolized as given (stack return addresses included), as retsnoop prints them.
"""

from typing import NamedTuple, Protocol

from retsnoop_otel.symbols.kallsyms import Kallsyms


class Frame(NamedTuple):
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


CACHE_MAX = 1 << 16  # addresses a symbolizer remembers (a few MB at most): stacks repeat, the set is bounded


class KallsymsSymbolizer:
    """Names and offsets only: what every host can give without debug info.

    Results are cached per address (shared lists: callers do not modify them). Kernel stacks repeat
    from session to session, and looking each frame up again was most of the console's time per
    session (bench/console_cost.py)."""

    def __init__(self, kallsyms: Kallsyms) -> None:
        self._ksyms = kallsyms
        self._frames: dict[int, list[Frame]] = {}
        self._generation = kallsyms.generation

    def frames(self, addr: int) -> list[Frame]:
        if self._generation != self._ksyms.generation:  # [bpf] symbols came or went
            self._frames, self._generation = {}, self._ksyms.generation
        hit = self._frames.get(addr)
        if hit is None:
            if len(self._frames) >= CACHE_MAX:
                self._frames = {}
            hit = self._frames[addr] = self._lookup(addr)
        return hit

    def _lookup(self, addr: int) -> list[Frame]:
        sym = self._ksyms.lookup(addr)
        return [] if sym is None else [Frame(sym.name, sym.offset, sym.module)]

    def describe(self, addr: int) -> str:
        frames = self.frames(addr)
        return f"0x{addr:x}" if not frames else f"{frames[0].name}+0x{frames[0].offset:x}"


class DwarfSymbolizer(KallsymsSymbolizer):
    """kallsyms for the function and offset, a DWARF source for file:line and the inline chain."""

    def __init__(self, kallsyms: Kallsyms, source: SourceLookup) -> None:
        super().__init__(kallsyms)
        self._source = source

    def _lookup(self, addr: int) -> list[Frame]:
        base = super()._lookup(addr)
        if not base or base[0].module is not None:  # DWARF covers vmlinux only
            return base
        src = list(reversed(self._source.frames(addr)))  # outermost first
        if not src:
            return base
        top = base[0]
        out = [Frame(top.name, top.offset, None, src[0].file or None, src[0].line or None)]
        out.extend(Frame(s.function, 0, None, s.file or None, s.line or None, inlined=True) for s in src[1:])
        return out

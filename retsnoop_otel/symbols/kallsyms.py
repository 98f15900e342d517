"""/proc/kallsyms: kernel function symbols by address (stack frames) and by name (discovery).

The file has ~120-200k lines, read at the first start of every boot, often inside a TCG VM where
Python runs ~30x slower: the parse is C (kernel_tables.c), and the table is kept as the flat columns
it returns rather than a Python object per symbol: addresses in an array, names as symbols/names.py
keeps them (with their order by name, for binary search), modules as runs. The kernel cache
(kernel/kcache.py) loads that in a few copies; the ~300k objects it used to build took 0.6-2 s of
every start under emulation, and the regex parse that followed them 2-2.5 s of the first start.

The [bpf] symbols (JIT-ed programs, trampolines) come and go with every attach, so they are kept in a
small table of their own beside those columns: bringing them up to date never copies the 100k others.
"""

import bisect
import re
from array import array
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, groupby, repeat
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

from retsnoop_otel.symbols import kernel_tables
from retsnoop_otel.symbols.names import Names, SortedNames

# JIT-ed BPF programs and trampolines: they exist only once the tracer has attached.
_BPF_LINE = re.compile(r"^([0-9a-f]+) [tT] (\S+)[ \t]+\[(bpf)\]$", re.M)
_STATE = "kallsyms-columns-2"  # the layout of state(): another one is refused by from_state()

Item = tuple[int, str, str]  # (address, name, module or '')


class KallsymsError(Exception):
    """/proc/kallsyms is unreadable or hides addresses: one sentence naming the fix."""


class KSym(NamedTuple):
    """A function symbol; `offset` is how far the looked-up address lies past `addr`."""

    name: str
    addr: int
    offset: int = 0
    module: str | None = None
    size: int = 0  # gap to the next function symbol; 0 for the last one (unknown)


class Kallsyms:
    """Function symbols sorted by address, found by address or by name (binary searches both).

    Positions (positions(), ksym_at(), module_at()) count the columns' symbols first, then the [bpf] ones.
    """

    def __init__(self, items: list[Item]) -> None:
        """`items` sorted by (address, name, module)."""
        kernel = [it for it in items if it[2] != "bpf"]
        addrs, names, mods = zip(*kernel, strict=True) if kernel else ((), (), ())
        self._set_columns(*_columns(array("Q", addrs), names, mods))
        self._set_bpf(sorted((a, n) for a, n, m in items if m == "bpf"))

    def _set_columns(self, addrs: array, names: Names, run_starts: list[int], run_mods: list[str],
                     by_name: SortedNames | None = None) -> None:
        self._addrs = addrs
        self._names = names
        # their order by name: sorted when a name is first looked up or the state saved, not when [bpf]
        # symbols come and go (a fentry tracer's first stack, a reload), which only look up addresses
        self._by_name = by_name
        self._run_starts = run_starts  # positions where the module changes
        self._run_mods = run_mods  # the module from there on ('' for vmlinux)
        self._set_bpf([])
        self.generation = 0  # changes whenever the symbols do (symbolizers cache what they looked up)

    def _set_bpf(self, syms: list[tuple[int, str]]) -> None:
        """The [bpf] symbols, sorted by (address, name)."""
        self._bpf_addrs = array("Q", [a for a, _ in syms])
        self._bpf_names = [n for _, n in syms]
        self._bpf_by_name: dict[str, list[int]] = {}
        for j, n in enumerate(self._bpf_names):
            self._bpf_by_name.setdefault(n, []).append(len(self._addrs) + j)

    @classmethod
    def parse(cls, text: str | bytes, stable: bool = False) -> "Kallsyms":
        """Lines 'addr type name' or 'addr type name\t[module]' whose type is a code symbol (t/T/w/W,
        weak ones included). `stable`: without the pseudo-modules that come and go with no module load,
        [bpf] (JIT-ed programs, trampolines) and [__builtin__*] (ftrace and kprobe trampolines). What
        remains depends only on the boot and the loaded modules, which is what kernel/kcache.py keys it by."""
        raw = text.encode() if isinstance(text, str) else text
        try:
            cols = kernel_tables.kallsyms_columns(raw, stable)
        except kernel_tables.TableError as exc:
            if str(exc) == "zero addresses":
                raise KallsymsError(
                    "/proc/kallsyms shows only zero addresses (kernel.kptr_restrict or missing CAP_SYSLOG): "
                    "run as root, or set `sysctl kernel.kptr_restrict=0`") from None
            raise KallsymsError(str(exc)) from None
        names = Names.from_state(cols.names)
        repeated: dict[str, list[int]] = {}
        for k in cols.dups:  # a few thousand: static functions of one name, compiler clones
            repeated.setdefault(names[cols.order[k]], [cols.order[k - 1]]).append(cols.order[k])
        ks = cls.__new__(cls)
        ks._set_columns(cols.addrs, names, cols.run_starts, cols.run_mods, SortedNames(names, cols.order, repeated))
        if not stable:
            ks._set_bpf(_bpf_symbols(raw))
        return ks

    @classmethod
    def load(cls, root: str = "/", stable: bool = False) -> "Kallsyms":
        path = Path(root, "proc/kallsyms")
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise KallsymsError(f"cannot read {path}: {exc.strerror}; kernel symbols are needed to find "
                                "functions and name stack frames") from None
        return cls.parse(text, stable)

    def items(self) -> Iterator[Item]:
        """(address, name, module or '') of every symbol, by address."""
        import heapq  # not at start: no start lists every symbol
        ends = [*self._run_starts[1:], len(self._addrs)]
        runs = zip(self._run_starts, ends, self._run_mods, strict=True)
        mods = chain.from_iterable(repeat(m, end - start) for start, end, m in runs)
        bpf = zip(self._bpf_addrs, self._bpf_names, repeat("bpf"))
        return heapq.merge(zip(self._addrs, self._names.all(), mods, strict=True), bpf, key=itemgetter(0))

    def state(self) -> tuple:
        """Everything lookups and discovery need, as a few flat values (what the kernel cache stores)."""
        return (_STATE, self._addrs.tobytes(), self._sorted().state(), self._run_starts, self._run_mods,
                self._bpf_addrs.tobytes(), tuple(self._bpf_names))

    @classmethod
    def from_state(cls, state: tuple) -> "Kallsyms":
        """Raises ValueError for a state of another layout."""
        tag, addrs, names, run_starts, run_mods, bpf_addrs, bpf_names = state
        if tag != _STATE:
            raise ValueError(f"kallsyms state {tag!r}")
        ks, a, b = cls.__new__(cls), array("Q"), array("Q")
        a.frombytes(addrs)
        b.frombytes(bpf_addrs)
        sorted_names = SortedNames.from_state(names)
        if (len(sorted_names.names) != len(a) or len(run_starts) != len(run_mods) or not run_starts
                or len(b) != len(bpf_names)):
            raise ValueError("kallsyms state of inconsistent lengths")
        ks._set_columns(a, sorted_names.names, list(run_starts), list(run_mods), sorted_names)
        ks._set_bpf(list(zip(b, bpf_names, strict=True)))
        return ks

    def sync_bpf_symbols(self, text: str) -> int:
        """Bring the [bpf] symbols up to date with a fresh kallsyms read (taken after attaching), so stack
        frames inside fexit trampolines and BPF programs are recognised as the tracer's own rather than
        charged to whichever module function happens to precede them. Those of programs that are gone
        are dropped: an agent's reload keeps these tables while it replaces its programs. Returns how
        many were new."""
        now = _bpf_symbols(text)
        have = list(zip(self._bpf_addrs, self._bpf_names, strict=True))
        if now == have:
            return 0
        generation = self.generation
        self._set_bpf(now)
        self.generation = generation + 1
        return len(set(now).difference(have))

    def refresh_bpf_symbols(self, root: str = "/") -> int:
        try:
            text = Path(root, "proc/kallsyms").read_text()
        except OSError:
            return 0
        return self.sync_bpf_symbols(text)

    def __len__(self) -> int:
        return len(self._addrs) + len(self._bpf_addrs)

    def _ksym(self, i: int, offset: int = 0) -> KSym:
        """Its size runs to the next symbol of either table; at one address, [bpf] symbols come last."""
        n, addrs, bpf = len(self._addrs), self._addrs, self._bpf_addrs
        if i < n and not bpf:  # discovery's case: no program of ours yet
            start = addrs[i]
            size = addrs[i + 1] - start if i + 1 < n else 0
            return KSym(self._names[i], start, offset, self.module_at(i), size)
        if i < n:
            start, name = addrs[i], self._names[i]
            after = [addrs[i + 1]] if i + 1 < n else []
            j = bisect.bisect_left(bpf, start)
            after += [bpf[j]] if j < len(bpf) else []
        else:
            start, name = bpf[i - n], self._bpf_names[i - n]
            after = [bpf[i - n + 1]] if i - n + 1 < len(bpf) else []
            k = bisect.bisect_right(addrs, start)
            after += [addrs[k]] if k < n else []
        return KSym(name, start, offset, self.module_at(i), min(after) - start if after else 0)

    def lookup(self, addr: int) -> KSym | None:
        """The function containing `addr` (binary search), or None below the first symbol."""
        if addr < 0:
            return None
        i = bisect.bisect_right(self._addrs, addr) - 1
        j = bisect.bisect_right(self._bpf_addrs, addr) - 1
        if j >= 0 and (i < 0 or self._bpf_addrs[j] >= self._addrs[i]):
            i = len(self._addrs) + j
        elif i < 0:
            return None
        start = self._addrs[i] if i < len(self._addrs) else self._bpf_addrs[i - len(self._addrs)]
        return self._ksym(i, addr - start)

    def names_blob(self) -> str:
        """Every symbol's name but the [bpf] ones, one per line in address order (globs.name_blob()'s
        layout): discovery scans it for every glob, so a name with several instances may match more than
        once (a program or trampoline is never a function to trace)."""
        return self._names.blob

    def by_name(self, name: str) -> list[KSym]:
        """Every instance of `name` (static functions and compiler clones can repeat), by address."""
        return [self._ksym(i) for i in self.positions(name)]

    def positions(self, name: str) -> list[int]:
        """Where the instances of `name` are (for ksym_at/module_at); [] for an unknown name."""
        found = self._sorted().positions(name)
        bpf = self._bpf_by_name.get(name)
        return found + bpf if bpf else found

    def sorted_names(self) -> SortedNames:
        """The symbols' names (the [bpf] ones aside) with their order by name."""
        return self._sorted()

    def positions_many(self, names: list[str]) -> list[list[int]]:
        """positions() of many names at once (discovery's thousands of matched functions)."""
        found = self._sorted().positions_many(names)
        if self._bpf_by_name:
            found = [f + self._bpf_by_name.get(n, []) for f, n in zip(found, names, strict=True)]
        return found

    def _sorted(self) -> SortedNames:
        if self._by_name is None:
            self._by_name = SortedNames.of(self._names)
        return self._by_name

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.positions(name))

    def ksym_at(self, i: int) -> KSym:
        return self._ksym(i)

    def module_at(self, i: int) -> str | None:
        if i >= len(self._addrs):
            return "bpf"
        return self._run_mods[bisect.bisect_right(self._run_starts, i) - 1] or None

    def moved(self, deltas: Mapping[str, int]) -> "Kallsyms | None":
        """These symbols where another boot put them: each run moved by its module's delta ('': the kernel's
        KASLR offset; a module's: where it was loaded), names and their order kept (a copy of the addresses
        only). None when a run has no delta, a module has several runs, or the moved runs would change their
        order by address (modules loaded in another order): then the table is read again."""
        mods = self._run_mods
        if self._bpf_addrs or len(set(mods)) != len(mods) or not all(m in deltas for m in mods):
            return None
        ends, addrs, below = [*self._run_starts[1:], len(self._addrs)], self._addrs, -1
        for start, end, mod in zip(self._run_starts, ends, mods, strict=True):
            if start < end:
                first, last = addrs[start] + deltas[mod], addrs[end - 1] + deltas[mod]
                if first <= below or last >= 1 << 64:
                    return None
                below = last
        moved = addrs[:]
        kernel_tables.shift_runs(moved, self._run_starts, [deltas[m] for m in mods])
        ks = Kallsyms.__new__(Kallsyms)
        ks._set_columns(moved, self._names, list(self._run_starts), list(mods), self._by_name)
        return ks

    @property
    def stext(self) -> int | None:
        """Runtime address of _stext: the KASLR-shifted start of kernel text."""
        syms = self.by_name("_stext")
        return syms[0].addr if syms else None


def head_symbols(root: str = "/", until: tuple[str, ...] = ("_stext", "_text"), limit: int = 1 << 20
                 ) -> list[tuple[int, str]] | None:
    """(address, name) of the kernel's own code symbols at the head of /proc/kallsyms, up to the first named in
    `until`: what tells a table cached at another boot where KASLR put the kernel now, read in a few kB (the
    whole file is ~10 MB, generated line by line by the kernel). None when unreadable or not found in `limit`."""
    out: list[tuple[int, str]] = []
    rest, seen = b"", 0
    try:
        with open(Path(root, "proc/kallsyms"), "rb") as f:
            while seen < limit:
                chunk = f.read(65536)
                if not chunk:
                    break
                seen += len(chunk)
                *lines, rest = (rest + chunk).split(b"\n")  # a line cut by the chunk waits for the next one
                if _code_lines(lines, until, out):
                    return out
    except OSError:
        return None
    return None


def _code_lines(lines: list[bytes], until: tuple[str, ...], out: list[tuple[int, str]]) -> bool:
    """Appends the code symbols of `lines` to `out`; True once one named in `until` is among them."""
    for line in lines:
        f = line.split()
        if len(f) == 3 and f[1] in (b"t", b"T", b"w", b"W"):
            out.append((int(f[0], 16), f[2].decode("utf-8", "replace")))
            if out[-1][1] in until:
                return True
    return False


def _bpf_symbols(text: str | bytes) -> list[tuple[int, str]]:
    """(address, name) of the [bpf] lines, sorted. The kernel lists them after its own and the modules'
    symbols: the regex starts at the first one (a plain search), not at each of 100k+ lines before it."""
    mark, nl = ("[bpf]", "\n") if isinstance(text, str) else (b"[bpf]", b"\n")
    first = text.find(mark)  # type: ignore[arg-type]
    if first < 0:
        return []
    start = text.rfind(nl, 0, first) + 1  # type: ignore[arg-type]
    tail = text[start:] if isinstance(text, str) else text[start:].decode("utf-8", "replace")
    return sorted({(int(a, 16), n) for a, n, _ in _BPF_LINE.findall(tail)})


def _columns(addrs: array, names: Sequence[str], mods: Sequence[str]) -> tuple[array, Names, list[int], list[str]]:
    """The columns of symbols sorted by (address, name, module)."""
    return (addrs, Names(names), *_runs(mods))


def _runs(mods: Sequence[str]) -> tuple[list[int], list[str]]:
    """(positions where the module changes, the module from there on); one run for an empty table."""
    starts, run_mods, at = [], [], 0
    for mod, same in groupby(mods):
        starts.append(at)
        run_mods.append(mod)
        at += len(list(same))
    return (starts, run_mods) if starts else ([0], [""])

"""/proc/kallsyms: kernel function symbols by address (stack frames) and by name (discovery).

The file has ~120-200k lines and is read inside a TCG VM where Python runs ~30x slower, so the
parse is one C-level regex scan over the whole text, addresses stay as fixed-width hex strings
(which sort like the numbers they spell) and are converted to int only for the symbols asked for.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import KeysView
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

# 'addr type name' or 'addr type name\t[module]'; t/T/w/W are code symbols (weak ones included).
_FUNC_LINE = re.compile(r"^([0-9a-f]+) [tTwW] (\S+)(?:[ \t]+\[(\S+)\])?$", re.M)
# JIT-ed BPF programs and trampolines: they exist only once the tracer has attached.
_BPF_LINE = re.compile(r"^([0-9a-f]+) [tT] (\S+)[ \t]+\[(bpf)\]$", re.M)


def _volatile(module: str) -> bool:
    return module == "bpf" or module.startswith("__builtin__")


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
    """Function symbols sorted by address, with a name index for discovery."""

    def __init__(self, items: list[tuple[str, str, str]]) -> None:
        # (zero-padded hex address, name, module or '') sorted by address; all addresses one width
        self._items = items
        self._width = len(items[0][0]) if items else 16
        self._first: dict[str, int] | None = None
        self._multi: dict[str, list[int]] = {}
        self._blob: str | None = None
        self.generation = 0  # changes whenever the symbols do (symbolizers cache what they looked up)

    @classmethod
    def parse(cls, text: str) -> Kallsyms:
        items = _FUNC_LINE.findall(text)
        if not items:
            raise KallsymsError("no function symbols found in kallsyms")
        widths = {len(a) for a, _, _ in items}
        if len(widths) > 1:  # %px prints fixed width; pad anything else so string order = number order
            width = max(widths)
            items = [(a.zfill(width), n, m) for a, n, m in items]
        items.sort()  # nearly sorted already (modules trail): timsort makes this cheap
        if int(items[-1][0], 16) == 0:
            raise KallsymsError(
                "/proc/kallsyms shows only zero addresses (kernel.kptr_restrict or missing CAP_SYSLOG): "
                "run as root, or set `sysctl kernel.kptr_restrict=0`")
        return cls(items)

    @classmethod
    def load(cls, root: str = "/") -> Kallsyms:
        path = Path(root, "proc/kallsyms")
        try:
            text = path.read_text()
        except OSError as exc:
            raise KallsymsError(f"cannot read {path}: {exc.strerror}; kernel symbols are needed to find "
                                "functions and name stack frames") from None
        return cls.parse(text)

    def stable(self) -> Kallsyms:
        """Without the pseudo-modules that come and go with no module load: [bpf] (JIT-ed programs,
        trampolines) and [__builtin__*] (ftrace and kprobe trampolines). What remains depends only
        on the boot and the loaded modules, which is what kernel/kcache.py keys it by."""
        items = [it for it in self._items if not _volatile(it[2])]
        return self if len(items) == len(self._items) else Kallsyms(items)

    def state(self) -> tuple:
        """Everything lookups and discovery need, as plain containers (what the kernel cache stores)."""
        return (self._width, self._items, self._index(), self._multi, self.names_blob())

    @classmethod
    def from_state(cls, state: tuple) -> Kallsyms:
        width, items, first, multi, blob = state
        ks = cls(items)
        ks._width, ks._first, ks._multi, ks._blob = width, first, multi, blob
        return ks

    def sync_bpf_symbols(self, text: str) -> int:
        """Bring the [bpf] symbols up to date with a fresh kallsyms read (taken after attaching), so stack
        frames inside fexit trampolines and BPF programs are recognised as the tracer's own rather than
        charged to whichever module function happens to precede them. Those of programs that are gone
        are dropped: an agent's reload keeps these tables while it replaces its programs. Returns how
        many were new."""
        now = {(a.zfill(self._width), n, m) for a, n, m in _BPF_LINE.findall(text)}
        have = {item for item in self._items if item[2] == "bpf"}
        new, gone = now - have, have - now
        if gone:
            self._items = [item for item in self._items if item not in gone]
        for item in sorted(new):
            bisect.insort(self._items, item)
        if new or gone:
            self._first, self._multi, self._blob = None, {}, None  # positions shifted: rebuild the index lazily
            self.generation += 1
        return len(new)

    def refresh_bpf_symbols(self, root: str = "/") -> int:
        try:
            text = Path(root, "proc/kallsyms").read_text()
        except OSError:
            return 0
        return self.sync_bpf_symbols(text)

    def __len__(self) -> int:
        return len(self._items)

    def _ksym(self, i: int, offset: int = 0) -> KSym:
        hexaddr, name, module = self._items[i]
        start = int(hexaddr, 16)
        size = int(self._items[i + 1][0], 16) - start if i + 1 < len(self._items) else 0
        return KSym(name, start, offset, module or None, size)

    def lookup(self, addr: int) -> KSym | None:
        """The function containing `addr` (binary search), or None below the first symbol."""
        if addr < 0:
            return None
        key = f"{addr:0{self._width}x}"
        i = bisect.bisect_right(self._items, key, key=itemgetter(0)) - 1
        if i < 0:
            return None
        start = int(self._items[i][0], 16)
        return self._ksym(i, addr - start)

    def _index(self) -> dict[str, int]:
        """name -> position of its first instance; names with several instances also go to _multi."""
        if self._first is None:
            names = list(map(itemgetter(1), self._items))
            first = dict(zip(reversed(names), range(len(names) - 1, -1, -1), strict=True))
            if len(first) != len(names):
                dups = {n for n, c in Counter(names).items() if c > 1}
                multi: dict[str, list[int]] = {}
                for i in [i for i, n in enumerate(names) if n in dups]:
                    multi.setdefault(names[i], []).append(i)
                self._multi = multi
            self._first = first
        return self._first

    def names(self) -> KeysView[str]:
        """Distinct function names (discovery matches globs against these)."""
        return self._index().keys()

    def names_blob(self) -> str:
        """globs.name_blob() of names(), built once (discovery scans it for every glob)."""
        if self._blob is None:
            self._blob = "\n" + "\n".join(self._index()) + "\n"
        return self._blob

    def by_name(self, name: str) -> list[KSym]:
        """Every instance of `name` (static functions and compiler clones can repeat), by address."""
        return [self._ksym(i) for i in self.positions(name)]

    def positions(self, name: str) -> list[int]:
        """Where the instances of `name` are (for ksym_at/module_at); [] for an unknown name."""
        first = self._index().get(name)
        if first is None:
            return []
        return self._multi.get(name, [first])

    def __contains__(self, name: str) -> bool:
        return name in self._index()

    def ksym_at(self, i: int) -> KSym:
        return self._ksym(i)

    def module_at(self, i: int) -> str | None:
        return self._items[i][2] or None

    @property
    def stext(self) -> int | None:
        """Runtime address of _stext: the KASLR-shifted start of kernel text."""
        syms = self.by_name("_stext")
        return syms[0].addr if syms else None

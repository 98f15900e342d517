"""available_filter_functions as discovery needs it: which names ftrace can hook, and how often each appears.

A name can appear several times (static functions of one name in several files or modules). Kept sorted
in symbols/names.py's layout, so the kernel cache loads it in two copies and a count is a binary search.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable

from retsnoop_otel.kernel import tracefs
from retsnoop_otel.symbols import kernel_tables
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.names import Names, SearchThenIndex


class Traceable:
    def __init__(self, names: Iterable[str]) -> None:
        self._names = Names(sorted(names))
        self._counts = SearchThenIndex(self._search, lambda: Counter(self._names.all()))
        self._not_in_kallsyms: tuple[str, ...] | None = None

    @classmethod
    def load(cls, root: str = "/") -> Traceable:
        """Raises tracefs.TracefsError naming the fix when the file cannot be read."""
        return cls.parse(tracefs.read_available_filter_functions_bytes(root))

    @classmethod
    def parse(cls, text: bytes) -> Traceable:
        """The file's names (kernel_tables.c: ~50k lines under emulation in milliseconds); modules are not needed."""
        t = cls(())
        t._names = Names.from_state(kernel_tables.traceable_names(text))
        return t

    def state(self) -> tuple[tuple[str, bytes], tuple[str, ...] | None]:
        return self._names.state(), self._not_in_kallsyms

    @classmethod
    def from_state(cls, state: tuple[tuple[str, bytes], tuple[str, ...] | None]) -> Traceable:
        """Raises ValueError for a state of another layout."""
        names, not_in_kallsyms = state
        t = cls(())
        t._names = Names.from_state(names)
        if not_in_kallsyms is not None and not isinstance(not_in_kallsyms, tuple):
            raise ValueError("traceable functions state")
        t._not_in_kallsyms = not_in_kallsyms
        return t

    def not_in(self, kallsyms: Kallsyms) -> tuple[str, ...]:
        """The listed names kallsyms lacks (a few at most), found once: those of the kernel the two tables
        were read from (the kernel cache keeps them together, under one key), kept with this table's state."""
        if self._not_in_kallsyms is None:
            by_name = kallsyms.sorted_names().state()
            self._not_in_kallsyms = tuple(kernel_tables.missing(self._names.state(), *by_name[:2]))
        return self._not_in_kallsyms

    def __len__(self) -> int:
        return len(self._names)

    def names_blob(self) -> str:
        """Every listed name (globs.name_blob()'s layout, repeats included)."""
        return self._names.blob

    def count(self, name: str) -> int:
        """How many times `name` is listed (0: ftrace cannot hook it)."""
        return self._counts.get(name) or 0

    def count_many(self, names: list[str]) -> list[int]:
        """count() of many names at once (one C call instead of a Counter of every name)."""
        found = kernel_tables.find(self._names.state(), None, names)
        return [self.count(n) for n in names] if found is None else [count for _, count in found]

    def _search(self, name: str) -> int:
        return bisect.bisect_right(self._names, name) - bisect.bisect_left(self._names, name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.count(name) > 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Traceable) and other._names.blob == self._names.blob

    __hash__ = None  # type: ignore[assignment]

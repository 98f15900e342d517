"""Many short names as one string: the layout kallsyms and available_filter_functions are kept in.

A table of ~100k names as Python objects takes the kernel cache 30-50 ms to load on a host and seconds
under emulation, at every start. Here the names are one newline-separated string (globs.name_blob()'s
layout, which discovery's glob scans read directly) and the offsets where each begins, in an array: the
cache loads both as two copies, and a name is sliced out only when it is asked for.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, pairwise
from typing import Generic, TypeVar

from retsnoop_otel.symbols import kernel_tables
from retsnoop_otel.symbols.globs import blob_names, name_blob

# Lookups answered by a binary search over the blob (~10 us each on a host) before a dict of every name is
# built (~30 ms for 100k names): a start that asks about twenty functions never builds it, one with
# thousands does, and then looks each up in well under a microsecond.
SEARCHES_BEFORE_INDEX = 64
V = TypeVar("V")


class SearchThenIndex(Generic[V]):
    """A name's value by `search` (a binary search) for the first SEARCHES_BEFORE_INDEX lookups, then from
    the mapping `index` builds once: what each table keyed by name answers lookups with."""

    def __init__(self, search: Callable[[str], V | None], index: Callable[[], Mapping[str, V]]) -> None:
        self._search, self._index_of = search, index
        self._searches = 0

    def get(self, name: str) -> V | None:
        if self._searches < SEARCHES_BEFORE_INDEX:
            self._searches += 1
            return self._search(name)
        self.get = self._index_of().get  # type: ignore[method-assign]  # from now on the mapping's own get
        return self.get(name)


class Names(Sequence[str]):
    def __init__(self, names: Sequence[str]) -> None:
        self.blob = name_blob(names)  # "\nname0\nname1\n...\n"
        self._starts = array("I", accumulate(map((1).__add__, map(len, names)), initial=1))  # and the end sentinel

    def state(self) -> tuple[str, bytes]:
        return self.blob, self._starts.tobytes()

    @classmethod
    def from_state(cls, state: tuple[str, bytes]) -> Names:
        """Raises ValueError for a state of another layout."""
        blob, starts = state
        out = cls.__new__(cls)
        out.blob, out._starts = blob, array("I")
        out._starts.frombytes(starts)
        if not blob.startswith("\n") or not out._starts or out._starts[-1] != len(blob):
            raise ValueError("names state")
        return out

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.blob[self._starts[i]:self._starts[i + 1] - 1]

    def all(self) -> list[str]:
        return blob_names(self.blob)


class SortedNames:
    """Names found by binary search over their order by name, then, once many are asked for, by a dict:
    nothing to build for a start that looks up twenty, no ten thousand slow searches for one that looks
    up ten thousand."""

    def __init__(self, names: Names, order: array, repeated: dict[str, list[int]]) -> None:
        self.names = names
        self._order = order  # positions in `names`, sorted by name (then position)
        self._repeated = repeated  # the names at several positions (a few hundred): all of them
        self._first = SearchThenIndex(self._search, self._index)  # name -> a position of it

    @classmethod
    def of(cls, names: Names) -> SortedNames:
        every = names.all()
        order = sorted(range(len(every)), key=every.__getitem__)
        repeated: dict[str, list[int]] = {}
        for prev, at in pairwise(order):  # once per table read; the kernel cache keeps the result
            if every[prev] == every[at]:
                repeated.setdefault(every[at], [prev]).append(at)
        return cls(names, array("I", order), repeated)

    def state(self) -> tuple[tuple[str, bytes], bytes, dict[str, list[int]]]:
        return self.names.state(), self._order.tobytes(), self._repeated

    @classmethod
    def from_state(cls, state: tuple[tuple[str, bytes], bytes, dict[str, list[int]]]) -> SortedNames:
        names_state, order_bytes, repeated = state
        names, order = Names.from_state(names_state), array("I")
        order.frombytes(order_bytes)
        if len(order) != len(names) or not isinstance(repeated, dict):
            raise ValueError("sorted names state")
        return cls(names, order, repeated)

    def positions(self, name: str) -> list[int]:
        """Where `name` is in `names`, ascending."""
        at = self._first.get(name)
        return [] if at is None else self._repeated.get(name) or [at]

    def positions_many(self, names: list[str]) -> list[list[int]]:
        """positions() of each name, found in one C call (kernel_tables.find) rather than one by one."""
        found = kernel_tables.find(self.names.state(), self._order.tobytes(), names)
        if found is None:
            return [self.positions(name) for name in names]
        order = self._order
        return [order[k:k + count].tolist() for k, count in found]

    def _search(self, name: str) -> int | None:
        at = bisect.bisect_left(self._order, name, key=self.names.__getitem__)
        return self._order[at] if at < len(self._order) and self.names[self._order[at]] == name else None

    def _index(self) -> dict[str, int]:
        every = self.names.all()  # C-level: 30 ms for 100k names on a host, once
        return dict(zip(every, range(len(every)), strict=True))

"""Many short names as one string: the layout kallsyms and available_filter_functions are kept in.

A table of ~100k names as Python objects takes the kernel cache 30-50 ms to load on a host and seconds
under emulation, at every start. Here the names are one newline-separated string (globs.name_blob()'s
layout, which discovery's glob scans read directly) and the offsets where each begins, in an array: the
cache loads both as two copies, and a name is sliced out only when it is asked for.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from itertools import accumulate

from retsnoop_otel.symbols.globs import name_blob

# Lookups answered by a binary search over the blob (~10 us each on a host) before a list or dict of every
# name is built (~30 ms for 100k names): a start that asks about twenty functions never builds it, one
# with thousands does.
SEARCHES_BEFORE_INDEX = 256


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
        return self.blob[1:-1].split("\n") if len(self) else []


class SortedNames:
    """Names sorted, found by binary search: no index of them all to build or load."""

    def __init__(self, names: Names, order: array) -> None:
        self.names, self._order = names, order  # order: positions in `names`, sorted by name (then position)
        self._searches = 0
        self._sorted: list[str] | None = None  # the names in that order, once enough have been looked up

    @classmethod
    def of(cls, names: Names) -> SortedNames:
        return cls(names, array("I", sorted(range(len(names)), key=names.all().__getitem__)))

    def state(self) -> tuple[tuple[str, bytes], bytes]:
        return self.names.state(), self._order.tobytes()

    @classmethod
    def from_state(cls, state: tuple[tuple[str, bytes], bytes]) -> SortedNames:
        names_state, order_bytes = state
        names, order = Names.from_state(names_state), array("I")
        order.frombytes(order_bytes)
        if len(order) != len(names):
            raise ValueError("sorted names state")
        return cls(names, order)

    def positions(self, name: str) -> list[int]:
        """Where `name` is in `names`, ascending."""
        if self._sorted is None and self._searches >= SEARCHES_BEFORE_INDEX:
            # a list of the names in order makes each search C-level (~1 us instead of ~10): 30 ms once
            self._sorted = list(map(self.names.all().__getitem__, self._order))
        if self._sorted is not None:
            lo = bisect.bisect_left(self._sorted, name)
            return list(self._order[lo:bisect.bisect_right(self._sorted, name, lo)])
        self._searches += 1
        at = bisect.bisect_left(self._order, name, key=self.names.__getitem__)
        out = []
        while at < len(self._order) and self.names[self._order[at]] == name:
            out.append(self._order[at])
            at += 1
        return out

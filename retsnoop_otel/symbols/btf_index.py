"""Every kernel function's BTF id and return kind, from one pass over the raw vmlinux BTF.

libbpf's btf__find_by_name_kind() scans all ~130,000 types per call: 4 ms each under emulation,
5 s for a thousand traced functions, 40 s for ten thousand. One pass over the same bytes
(kernel_tables.c) indexes every FUNC at once, in milliseconds, and the index, which cannot change
while the kernel build stays the same, is cached per build-id (kernel/kcache.py).
The classification rules are those of symbols/btf.py (classify_type), applied to the raw records;
tests/native/test_btf_kinds.py holds the two to the same answers on the running kernel.
"""

from __future__ import annotations

import array
import bisect
from collections.abc import Iterable

from retsnoop_otel.capture.model import RET_KIND_CODES, RetKind
from retsnoop_otel.symbols import kernel_tables
from retsnoop_otel.symbols.names import Names, SearchThenIndex

_KIND_OF_CODE = {code: kind for kind, code in RET_KIND_CODES.items()}


class BtfFormatError(ValueError):
    """Raw BTF this parser does not understand (a kind newer than it): use libbpf's lookups instead."""


class FuncTypes:
    """Return kinds and BTF ids of kernel functions by name; functions without BTF are UNKNOWN / None.

    The same interface as symbols.btf.ReturnKinds (callable for the kind, `func_id` for fentry). Kept as
    sorted names (symbols/names.py) and an array of packed values, found by binary search: the kernel
    cache loads ~50k of them in two copies instead of building a dict (0.15-0.4 s under emulation)."""

    def __init__(self, index: dict[str, int]) -> None:
        items = sorted(index.items())
        self._names = Names([name for name, _ in items])
        self._packed = array.array("Q", [packed for _, packed in items])
        self._lookup = SearchThenIndex(self._search, lambda: dict(zip(self._names.all(), self._packed, strict=True)))

    def state(self) -> tuple[tuple[str, bytes], bytes]:
        return self._names.state(), self._packed.tobytes()

    @classmethod
    def from_raw_btf(cls, data: bytes) -> FuncTypes:
        """Every named FUNC of a raw BTF blob (the first FUNC of a name, as btf__find_by_name_kind finds it).

        Raises BtfFormatError for a blob it does not understand."""
        try:
            columns = kernel_tables.btf_funcs(data)
        except kernel_tables.TableError as exc:
            raise BtfFormatError(str(exc)) from None
        return cls.from_state((columns.names, columns.packed.tobytes()))

    @classmethod
    def from_state(cls, state: tuple[tuple[str, bytes], bytes]) -> FuncTypes:
        """Raises ValueError (or TypeError) for a state of another layout."""
        names_state, packed = state
        out = cls({})
        out._names = Names.from_state(names_state)
        out._packed = array.array("Q")
        out._packed.frombytes(packed)
        if len(out._packed) != len(out._names):
            raise ValueError("function types state of inconsistent lengths")
        return out

    def __len__(self) -> int:
        return len(self._packed)

    def _search(self, name: str) -> int | None:
        i = bisect.bisect_left(self._names, name)
        return self._packed[i] if i < len(self._packed) and self._names[i] == name else None

    def names_returning(self, kinds: Iterable[RetKind]) -> list[str]:
        """Every function whose return kind is one of `kinds`, in name order (the syscall preset's candidates)."""
        codes = {RET_KIND_CODES[k] for k in kinds}
        return [name for name, packed in zip(self._names.all(), self._packed, strict=True) if packed & 0xF in codes]

    def func_id(self, name: str) -> int | None:
        packed = self._lookup.get(name)
        return None if packed is None else packed >> 4

    def __call__(self, name: str) -> RetKind:
        packed = self._lookup.get(name)
        return RetKind.UNKNOWN if packed is None else _KIND_OF_CODE[packed & 0xF]

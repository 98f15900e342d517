"""Every kernel function's BTF id and return kind, from one pass over the raw vmlinux BTF.

libbpf's btf__find_by_name_kind() scans all ~130,000 types per call: 4 ms each under emulation,
5 s for a thousand traced functions, 40 s for ten thousand. One pass in Python over the same
bytes indexes every FUNC at once (half a second under emulation), and the index, which cannot
change while the kernel build stays the same, is cached per build-id (kernel/kcache.py).
The classification rules are those of symbols/btf.py (classify_type), applied to the raw records.
"""

from __future__ import annotations

import array
import bisect
import struct
import sys
from itertools import accumulate

from retsnoop_otel.capture.model import RET_KIND_CODES, RetKind
from retsnoop_otel.kernel import libbpf_btf as lb
from retsnoop_otel.symbols.names import Names, SearchThenIndex

BTF_MAGIC = 0xEB9F
_KIND_OF_CODE = {code: kind for kind, code in RET_KIND_CODES.items()}
# 32-bit words that follow the 12-byte common record: (fixed, per vlen member), by kind (uapi linux/btf.h)
_EXTRA_WORDS = {
    1: (1, 0),  # INT: encoding, offset, bits
    2: (0, 0), 7: (0, 0), 8: (0, 0), 9: (0, 0), 10: (0, 0), 11: (0, 0), 12: (0, 0), 16: (0, 0), 18: (0, 0),
    3: (3, 0),  # ARRAY
    4: (0, 3), 5: (0, 3),  # STRUCT, UNION: members
    6: (0, 2),  # ENUM
    13: (0, 2),  # FUNC_PROTO: params
    14: (1, 0),  # VAR
    15: (0, 3),  # DATASEC
    17: (1, 0),  # DECL_TAG
    19: (0, 3),  # ENUM64
}
_MODIFIERS = {lb.BTF_KIND_TYPEDEF, lb.BTF_KIND_VOLATILE, lb.BTF_KIND_CONST, lb.BTF_KIND_RESTRICT,
              lb.BTF_KIND_TYPE_TAG}


class BtfFormatError(ValueError):
    """Raw BTF this parser does not understand (a kind newer than it): use libbpf's lookups instead."""


def index_raw_btf(data: bytes) -> dict[str, int]:
    """FUNC name -> (BTF id << 4 | return kind code), for every FUNC of a raw BTF blob."""
    if len(data) < 24:
        raise BtfFormatError("BTF blob too short")
    magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data)
    if magic != BTF_MAGIC or sys.byteorder != "little":
        raise BtfFormatError("not little-endian BTF")
    start = hdr_len + type_off
    words = array.array("I")
    words.frombytes(data[start:start + type_len - type_len % 4])
    raw = data[hdr_len + str_off:hdr_len + str_off + str_len].decode("latin-1")  # one char per byte: offsets hold
    parts = raw.split("\0")
    names = dict(zip(accumulate(map((1).__add__, map(len, parts)), initial=0), parts, strict=False))
    extra = [(0, 0)] * 32
    for kind, sizes in _EXTRA_WORDS.items():
        extra[kind] = sizes
    known = [kind in _EXTRA_WORDS for kind in range(32)]
    offs = array.array("I", [0])  # word offset of each type id (id 0 is void)
    funcs: list[tuple[int, int]] = []  # (name offset, id)
    n, i, tid = len(words), 0, 0
    while i < n:
        tid += 1
        offs.append(i)
        info = words[i + 1]
        kind = (info >> 24) & 0x1F
        if not known[kind]:
            raise BtfFormatError(f"unknown BTF kind {kind} at type {tid}")
        if kind == 12:
            funcs.append((words[i], tid))
        fixed, per = extra[kind]
        i += 3 + fixed + per * (info & 0xFFFF)
    cache: dict[int, int] = {}
    out: dict[str, int] = {}
    for name_off, fid in funcs:
        name = names.get(name_off)
        if not name:
            continue
        proto = words[offs[fid] + 2]
        ret = words[offs[proto] + 2] if 0 < proto < len(offs) else -1
        code = cache.get(ret)
        if code is None:
            code = cache[ret] = RET_KIND_CODES[_classify(words, offs, ret)]
        out.setdefault(name, fid << 4 | code)  # the first FUNC of a name, as btf__find_by_name_kind returns
    return out


def _classify(words: array.array, offs: array.array, tid: int) -> RetKind:
    if tid < 0 or tid >= len(offs):
        return RetKind.UNKNOWN
    for _ in range(64):  # modifier chains are short; a cycle would be malformed BTF
        if tid == 0:
            return RetKind.VOID
        at = offs[tid]
        info, sot = words[at + 1], words[at + 2]
        kind = (info >> 24) & 0x1F
        if kind in _MODIFIERS:
            if sot == 0:
                return RetKind.VOID
            if sot >= len(offs):
                return RetKind.UNKNOWN
            tid = sot
            continue
        if kind == lb.BTF_KIND_PTR:
            return RetKind.POINTER
        if kind == lb.BTF_KIND_INT:
            enc = words[at + 3] >> 24
            if enc & lb.BTF_INT_BOOL:
                return RetKind.BOOL
            if not enc & lb.BTF_INT_SIGNED or sot < 4:
                return RetKind.UNSIGNED
            return RetKind.INT32 if sot == 4 else RetKind.SIGNED
        if kind in (lb.BTF_KIND_ENUM, lb.BTF_KIND_ENUM64):
            return RetKind.INT32 if sot == 4 else RetKind.SIGNED
        return RetKind.UNKNOWN
    return RetKind.UNKNOWN


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

    def func_id(self, name: str) -> int | None:
        packed = self._lookup.get(name)
        return None if packed is None else packed >> 4

    def __call__(self, name: str) -> RetKind:
        packed = self._lookup.get(name)
        return RetKind.UNKNOWN if packed is None else _KIND_OF_CODE[packed & 0xF]

"""The raw BTF function index: every kind's size is skipped right, return kinds follow symbols/btf.py's rules."""

from __future__ import annotations

import struct

import pytest

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.symbols.btf_index import BtfFormatError, FuncTypes
from retsnoop_otel.symbols.names import SEARCHES_BEFORE_INDEX


class BtfBuilder:
    """Raw little-endian BTF, one type record at a time (ids from 1, in the order added)."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types: list[bytes] = []

    def name(self, text: str) -> int:
        if not text:
            return 0
        off = len(self.strings)
        self.strings += text.encode() + b"\0"
        return off

    def add(self, kind: int, name: str = "", vlen: int = 0, size_or_type: int = 0, extra: bytes = b"",
            kflag: int = 0) -> int:
        self.types.append(struct.pack("<III", self.name(name), kflag << 31 | kind << 24 | vlen, size_or_type) + extra)
        return len(self.types)

    def int_(self, name: str, size: int, encoding: int) -> int:
        return self.add(1, name, size_or_type=size, extra=struct.pack("<I", encoding << 24 | size * 8))

    def func(self, name: str, ret: int, params: int = 0) -> int:
        proto = self.add(13, vlen=params, size_or_type=ret,
                         extra=b"".join(struct.pack("<II", self.name(f"p{i}"), ret or 1) for i in range(params)))
        return self.add(12, name, vlen=1, size_or_type=proto)

    def blob(self) -> bytes:
        types = b"".join(self.types)
        return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(self.strings)) \
            + types + bytes(self.strings)


@pytest.fixture
def index() -> tuple[FuncTypes, dict[str, int]]:
    b = BtfBuilder()
    i32 = b.int_("int", 4, 1)
    u32 = b.int_("unsigned int", 4, 0)
    i64 = b.int_("long", 8, 1)
    i16 = b.int_("short", 2, 1)
    boolean = b.int_("_Bool", 1, 4)
    ptr = b.add(2, size_or_type=0)  # void *
    # every variable-length kind between the functions, so a wrong size would shift every later record
    b.add(3, extra=struct.pack("<III", i32, i32, 4))  # ARRAY
    b.add(4, "s", vlen=2, size_or_type=8, extra=struct.pack("<III", b.name("a"), i32, 0) * 2)  # STRUCT
    b.add(5, "u", vlen=1, size_or_type=4, extra=struct.pack("<III", b.name("b"), i32, 0))  # UNION
    enum = b.add(6, "e", vlen=3, size_or_type=4, extra=struct.pack("<Ii", b.name("E"), -1) * 3)  # ENUM
    enum64 = b.add(19, "e64", vlen=1, size_or_type=8, extra=struct.pack("<III", b.name("F"), 1, 0))  # ENUM64
    b.add(14, "v", size_or_type=i32, extra=struct.pack("<I", 1))  # VAR
    b.add(15, ".data", vlen=1, size_or_type=4, extra=struct.pack("<III", 1, 0, 4))  # DATASEC
    b.add(17, "tag", size_or_type=i32, extra=struct.pack("<i", -1))  # DECL_TAG
    b.add(16, "double", size_or_type=8)  # FLOAT
    b.add(7, "fwd")  # FWD
    typedef = b.add(8, "u8_t", size_or_type=u32)
    const = b.add(10, size_or_type=typedef)
    volatile_void = b.add(9, size_or_type=0)
    tagged = b.add(18, "user", size_or_type=ptr)  # TYPE_TAG
    struct_id = b.add(4, "big", vlen=0, size_or_type=16)
    ids = {
        "f_int": b.func("f_int", i32, params=3),
        "f_uint": b.func("f_uint", const),
        "f_long": b.func("f_long", i64),
        "f_short": b.func("f_short", i16),
        "f_bool": b.func("f_bool", boolean),
        "f_ptr": b.func("f_ptr", tagged),
        "f_void": b.func("f_void", 0),
        "f_volatile_void": b.func("f_volatile_void", volatile_void),
        "f_enum": b.func("f_enum", enum),
        "f_enum64": b.func("f_enum64", enum64),
        "f_struct": b.func("f_struct", struct_id),
    }
    b.func("f_int", i64)  # a later FUNC of the same name: the first one counts, as in libbpf's lookup
    return FuncTypes.from_raw_btf(b.blob()), ids


@pytest.mark.parametrize("name, kind", [
    ("f_int", RetKind.INT32), ("f_uint", RetKind.UNSIGNED), ("f_long", RetKind.SIGNED),
    ("f_short", RetKind.UNSIGNED), ("f_bool", RetKind.BOOL), ("f_ptr", RetKind.POINTER),
    ("f_void", RetKind.VOID), ("f_volatile_void", RetKind.VOID), ("f_enum", RetKind.INT32),
    ("f_enum64", RetKind.SIGNED), ("f_struct", RetKind.UNKNOWN), ("not_there", RetKind.UNKNOWN),
])
def test_return_kinds(index: tuple[FuncTypes, dict[str, int]], name: str, kind: RetKind) -> None:
    types, ids = index
    assert types(name) == kind
    assert types.func_id(name) == ids.get(name)


def test_every_function_is_indexed(index: tuple[FuncTypes, dict[str, int]]) -> None:
    assert len(index[0]) == len(index[1])


def test_state_round_trip(index: tuple[FuncTypes, dict[str, int]]) -> None:
    """What the kernel cache stores answers the same; a state of another layout is refused (a miss)."""
    types, ids = index
    back = FuncTypes.from_state(types.state())
    asked = [*ids, "no_such_function", "", "~"]
    for name in asked * (SEARCHES_BEFORE_INDEX // len(asked) + 2):  # past the searches that build an index
        assert (back(name), back.func_id(name)) == (types(name), types.func_id(name)), name
    with pytest.raises((TypeError, ValueError)):
        FuncTypes.from_state({"f": 1 << 4})  # type: ignore[arg-type]


def test_unknown_kinds_and_bad_blobs_are_refused() -> None:
    b = BtfBuilder()
    b.add(25, "future")
    b.func("f", 0)
    with pytest.raises(BtfFormatError, match="unknown BTF kind 25"):
        FuncTypes.from_raw_btf(b.blob())
    with pytest.raises(BtfFormatError):
        FuncTypes.from_raw_btf(b"\xeb\x9f" + b"\0" * 30)  # big-endian magic
    with pytest.raises(BtfFormatError):
        FuncTypes.from_raw_btf(b"short")

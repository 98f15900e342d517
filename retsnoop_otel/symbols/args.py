"""-A: what to capture of each function argument (from BTF), and how to show what was captured.

The kernel side copies, per argument, the register value and (for pointers to structs/unions and
char strings) up to MAX_ARG_DATA bytes behind it; this module decides that from the BTF prototype
and turns the bytes back into `name=value` text, walking struct members with BTF.
"""

from __future__ import annotations

from dataclasses import dataclass

from retsnoop_otel.capture.model import ArgValue
from retsnoop_otel.capture.records import (
    ARG_KIND_SHIFT,
    ARG_PTR,
    ARG_RAW,
    ARG_STR,
    DEFAULT_ARG_SIZES,
    MAX_ARG_DATA,
    MAX_FUNC_ARGS,
    ArgSizes,
)
from retsnoop_otel.kernel import libbpf_btf as lb

_SKIP = (lb.BTF_KIND_TYPEDEF, lb.BTF_KIND_VOLATILE, lb.BTF_KIND_CONST, lb.BTF_KIND_RESTRICT, lb.BTF_KIND_TYPE_TAG)
BTF_KIND_ARRAY = 3


@dataclass(frozen=True, slots=True)
class ArgDesc:
    name: str
    type_id: int
    kind: int  # ARG_RAW / ARG_PTR / ARG_STR
    size: int  # bytes to copy behind a pointer
    type_name: str


def _strip(btf: lb.Btf, tid: int) -> lb.BtfType | None:
    if tid == 0:
        return None
    t = btf.type_by_id(tid)
    while t.kind in _SKIP and t.size_or_type:
        t = btf.type_by_id(t.size_or_type)
    return t


def _type_name(btf: lb.Btf, tid: int) -> str:
    t = _strip(btf, tid)
    if t is None:
        return "void"
    if t.kind == lb.BTF_KIND_PTR:
        return _type_name(btf, t.size_or_type) + " *"
    prefix = {lb.BTF_KIND_STRUCT: "struct ", lb.BTF_KIND_UNION: "union ", lb.BTF_KIND_ENUM: "enum "}.get(t.kind, "")
    return prefix + (t.name or "(anon)")


def describe_args(btf: lb.Btf, func_name: str, sizes: ArgSizes = DEFAULT_ARG_SIZES) -> list[ArgDesc]:
    """What to copy of each argument: strings up to `sizes.string` bytes, structs up to `sizes.sized`, and
    no more than `sizes.total` over the call (earlier arguments first; one left with no room shows as
    (trunc)). Each is capped at MAX_ARG_DATA, what the kernel side copies at most per argument."""
    fid = btf.find(func_name, lb.BTF_KIND_FUNC)
    if fid is None:
        return []
    proto = btf.type_by_id(fid).size_or_type
    room = sizes.total
    out = []
    for name, tid in btf.func_params(proto)[:MAX_FUNC_ARGS]:
        t = _strip(btf, tid)
        kind, size = ARG_RAW, 0
        if t is not None and t.kind == lb.BTF_KIND_PTR:
            target = _strip(btf, t.size_or_type)
            if target is not None and target.kind == lb.BTF_KIND_INT and target.int_bits == 8:
                kind, size = ARG_STR, min(sizes.string, MAX_ARG_DATA, room)
            elif target is not None and target.kind in (lb.BTF_KIND_STRUCT, lb.BTF_KIND_UNION):
                kind, size = ARG_PTR, min(target.size_or_type, sizes.sized, MAX_ARG_DATA, room)
        room -= size
        out.append(ArgDesc(name or f"arg{len(out)}", tid, kind, size, _type_name(btf, tid)))
    return out


def spec_words(descs: list[ArgDesc]) -> list[int]:
    """The arg_spec map value for the BPF side."""
    words = [(d.kind << ARG_KIND_SHIFT) | d.size for d in descs]
    return words + [0] * (MAX_FUNC_ARGS - len(words))


class ArgFormatter:
    """Formats captured arguments as `name=value` using BTF, in one of retsnoop's args.fmt-mode layouts.

compact (the default) writes one argument as one line, struct members `{a=1,b=2}`, and keeps zero-valued
fields (unlike retsnoop): a zero is often the very value that made the kernel say -EINVAL (max_entries=0).
multiline is retsnoop's: `name = value` for the console to put on a line of its own, zero fields left out.
verbose has no width limit and writes a struct over several lines, one member a line, zero fields kept.
`width`: characters of one value before it is cut with '…' (compact and multiline; 0: never).
`raw_ptrs`: a pointer's own value, `(0x…)`, before what it points to (needs `show_pointers`).
"""

    def __init__(self, btf: lb.Btf, descs: dict[int, list[ArgDesc]], width: int = 120,
                 show_pointers: bool = True, mode: str = "compact", raw_ptrs: bool = False) -> None:
        self.btf = btf
        self.descs = descs
        self.mode = mode
        self.width = 0 if mode == "verbose" else width
        self.show_pointers = show_pointers
        self.raw_ptrs = raw_ptrs and show_pointers
        self.zeroes = mode != "multiline"
        self._sep = "=" if mode == "compact" else " = "

    def format(self, func_id: int, values: tuple[ArgValue, ...] | None) -> list[str]:
        if values is None:
            return []
        out = []
        for desc, val in zip(self.descs.get(func_id, []), values, strict=False):
            text = self._value(desc, val)
            if self.width and len(text) > self.width:
                text = text[: self.width] + "…"
            out.append(f"{desc.name}{self._sep}{text}")
        return out

    def _value(self, desc: ArgDesc, val: ArgValue) -> str:
        if desc.kind in (ARG_STR, ARG_PTR) and val.raw != 0 and desc.size == 0:
            return "(trunc)"  # args.max-total-args-size spent on the arguments before this one
        raw = f"(0x{val.raw:x})" if self.raw_ptrs and val.raw != 0 and val.data is not None else ""
        if desc.kind == ARG_STR:
            if val.raw == 0:
                return "NULL"
            if val.data is None:  # e.g. a user-space pointer: not readable as kernel memory
                return f"0x{val.raw:x}" if self.show_pointers else "(unreadable)"
            text = val.data[:desc.size].split(b"\0", 1)[0].decode(errors="replace")
            return raw + '"' + text.replace('"', '\\"') + '"'
        if desc.kind == ARG_PTR:
            if val.raw == 0:
                return "NULL"
            if val.data is None:
                return f"0x{val.raw:x}" if self.show_pointers else "(unreadable)"
            target = _strip(self.btf, _strip(self.btf, desc.type_id).size_or_type)  # type: ignore[union-attr]
            return raw + "&" + self._struct(target, val.data, 0)  # type: ignore[arg-type]
        return self._scalar(_strip(self.btf, desc.type_id), val.raw)

    def _scalar(self, t: lb.BtfType | None, raw: int) -> str:
        if t is None:
            return str(raw)
        if t.kind == lb.BTF_KIND_PTR:
            return "NULL" if raw == 0 else (f"0x{raw:x}" if self.show_pointers else "(ptr)")
        size = t.size_or_type if t.kind in (lb.BTF_KIND_INT, lb.BTF_KIND_ENUM, lb.BTF_KIND_ENUM64) else 8
        raw &= (1 << (8 * size)) - 1
        if t.kind == lb.BTF_KIND_INT and t.int_encoding & lb.BTF_INT_BOOL:
            return "true" if raw else "false"
        if t.kind == lb.BTF_KIND_INT and t.int_encoding & lb.BTF_INT_SIGNED and raw >> (8 * size - 1):
            raw -= 1 << (8 * size)
        return str(raw)

    def _struct(self, t: lb.BtfType, data: bytes, depth: int) -> str:
        parts = self._parts(t, data, depth)
        if self.mode != "verbose" or not parts:
            return "{" + ",".join(parts) + "}"
        pad = "    "
        return "{\n" + "".join(f"{pad * (depth + 1)}{p},\n" for p in parts) + pad * depth + "}"

    def _parts(self, t: lb.BtfType, data: bytes, depth: int) -> list[str]:
        members = self.btf.members(t.id)
        if t.kind == lb.BTF_KIND_UNION and members:
            members = members[:1]  # a union shows its first member (e.g. bpf_attr's map-create attributes)
        parts: list[str] = []
        for name, mtype, bit_off, bits in members:
            mt = _strip(self.btf, mtype)
            if mt is None:
                continue
            off = bit_off // 8
            if not name and mt.kind in (lb.BTF_KIND_STRUCT, lb.BTF_KIND_UNION):  # anonymous: flatten
                parts.extend(self._parts(mt, data[off:off + mt.size_or_type], depth))
                continue
            text = self._member(mt, data, off, bit_off, bits, depth)
            if text is not None:
                parts.append(f"{name}={text}")
            if self.width and sum(len(p) + 1 for p in parts) > self.width:
                break
        return parts

    def _member(self, mt: lb.BtfType, data: bytes, off: int, bit_off: int, bits: int, depth: int) -> str | None:
        if mt.kind in (lb.BTF_KIND_STRUCT, lb.BTF_KIND_UNION):
            if depth >= 1 or off + mt.size_or_type > len(data):
                return None
            inner = self._struct(mt, data[off:off + mt.size_or_type], depth + 1)
            return None if inner == "{}" else inner
        if mt.kind == BTF_KIND_ARRAY:
            return None  # arrays (names, padding) are left out of the compact form
        size = mt.size_or_type if mt.kind in (lb.BTF_KIND_INT, lb.BTF_KIND_ENUM, lb.BTF_KIND_ENUM64) else 8
        if off + size > len(data):
            return None
        raw = int.from_bytes(data[off:off + size], "little")
        if bits:
            raw = (int.from_bytes(data[off:off + 8].ljust(8, b"\0"), "little") >> (bit_off % 8)) & ((1 << bits) - 1)
        if raw == 0 and not self.zeroes:
            return None
        return self._scalar(mt, raw)

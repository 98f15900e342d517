"""BTF through libbpf: the kernel's (traced functions' return and argument types) and our object's
(where its configuration variables lie).

libbpf parses in C, which keeps loading the kernel's tens of thousands of types fast even under
emulation; this module only reads the records libbpf hands back.
"""

import ctypes
import errno as _errno
from typing import NamedTuple

from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_abi as abi

# BTF kinds and int encodings (uapi linux/btf.h).
BTF_KIND_INT = 1
BTF_KIND_PTR = 2
BTF_KIND_STRUCT = 4
BTF_KIND_UNION = 5
BTF_KIND_ENUM = 6
BTF_KIND_TYPEDEF = 8
BTF_KIND_VOLATILE = 9
BTF_KIND_CONST = 10
BTF_KIND_RESTRICT = 11
BTF_KIND_FUNC = 12
BTF_KIND_FUNC_PROTO = 13
BTF_KIND_DATASEC = 15
BTF_KIND_TYPE_TAG = 18
BTF_KIND_ENUM64 = 19
BTF_INT_SIGNED = 1
BTF_INT_BOOL = 4


class BtfType(NamedTuple):
    id: int
    kind: int
    name: str
    size_or_type: int  # size for INT/ENUM/STRUCT/UNION, referenced type id for PTR/TYPEDEF/FUNC/...
    int_encoding: int = 0  # BTF_INT_* bits, INT only
    int_bits: int = 0  # INT only


class Btf:
    """Read-only view of a BTF object held by libbpf."""

    def __init__(self, ptr: int, owned: bool = True) -> None:
        self._ptr: int | None = ptr
        self._owned = owned

    @classmethod
    def load_vmlinux(cls) -> "Btf":
        lb.lib().take_log()
        return cls(lb.check_ptr(lb.lib().lib.btf__load_vmlinux_btf(), "load kernel BTF"))

    @classmethod
    def of_object(cls, obj: lb.BpfObject) -> "Btf":
        """A BPF object's BTF, data-section offsets fixed up by libbpf at open (owned by the object)."""
        return cls(lb.check_ptr(lb.lib().lib.bpf_object__btf(obj.ptr), f"BTF of {obj.path}"), owned=False)

    def find(self, name: str, kind: int) -> int | None:
        tid = lb.lib().lib.btf__find_by_name_kind(self._ptr, name.encode(), kind)
        return tid if tid > 0 else None

    def type_by_id(self, tid: int) -> BtfType:
        t = lb.lib().lib.btf__type_by_id(self._ptr, tid)
        if not t:
            raise lb.LibbpfError(f"BTF type id {tid} not found", _errno.ENOENT)
        rec = t.contents
        kind = (rec.info >> 24) & 0x1F
        name = lb.lib().lib.btf__name_by_offset(self._ptr, rec.name_off) or b""
        enc = bits = 0
        if kind == BTF_KIND_INT:
            extra = ctypes.cast(ctypes.addressof(rec) + ctypes.sizeof(abi.BtfTypeRecord),
                                ctypes.POINTER(ctypes.c_uint32)).contents.value
            enc, bits = (extra >> 24) & 0x0F, extra & 0xFF
        return BtfType(tid, kind, name.decode(), rec.size_or_type, enc, bits)

    def shape(self, tid: int) -> tuple[int, int, int]:
        """(kind, vlen, size or referenced type id) of a type, without its name: for walks over many types."""
        rec = lb.lib().lib.btf__type_by_id(self._ptr, tid).contents
        return (rec.info >> 24) & 0x1F, rec.info & 0xFFFF, rec.size_or_type

    def param_types(self, proto_id: int) -> list[int]:
        """The type id of each parameter of a FUNC_PROTO (0 for a trailing '...')."""
        proto = lb.lib().lib.btf__type_by_id(self._ptr, proto_id)
        base = ctypes.addressof(proto.contents) + ctypes.sizeof(abi.BtfTypeRecord)
        return list((ctypes.c_uint32 * (2 * (proto.contents.info & 0xFFFF))).from_address(base))[1::2]

    def func_params(self, proto_id: int) -> list[tuple[str, int]]:
        """(name, type id) of each parameter of a FUNC_PROTO."""
        proto = lb.lib().lib.btf__type_by_id(self._ptr, proto_id)
        vlen = proto.contents.info & 0xFFFF
        base = ctypes.addressof(proto.contents) + ctypes.sizeof(abi.BtfTypeRecord)
        params = (abi.BtfParam * vlen).from_address(base)
        out = []
        for p in params:
            name = lb.lib().lib.btf__name_by_offset(self._ptr, p.name_off) or b""
            out.append((name.decode(), p.type))
        return out

    def members(self, tid: int) -> list[tuple[str, int, int, int]]:
        """(name, type id, bit offset, bitfield size or 0) of a STRUCT/UNION's members."""
        t = lb.lib().lib.btf__type_by_id(self._ptr, tid)
        info = t.contents.info
        vlen, kflag = info & 0xFFFF, info >> 31
        base = ctypes.addressof(t.contents) + ctypes.sizeof(abi.BtfTypeRecord)
        out = []
        for name_off, mtype, offset in (ctypes.c_uint32 * 3 * vlen).from_address(base):
            name = lb.lib().lib.btf__name_by_offset(self._ptr, name_off) or b""
            bits, off = (offset >> 24, offset & 0xFFFFFF) if kflag else (0, offset)
            out.append((name.decode(), mtype, off, bits))
        return out

    def enumerators(self, name: str) -> dict[str, int]:
        """The enumerators of a (32-bit) enum by its name, e.g. the kernel's bpf_attach_type: {} when it has none."""
        tid = self.find(name, BTF_KIND_ENUM)
        if tid is None:
            return {}
        t = lb.lib().lib.btf__type_by_id(self._ptr, tid)
        base = ctypes.addressof(t.contents) + ctypes.sizeof(abi.BtfTypeRecord)
        out = {}
        for name_off, val in (ctypes.c_uint32 * 2 * (t.contents.info & 0xFFFF)).from_address(base):
            out[(lb.lib().lib.btf__name_by_offset(self._ptr, name_off) or b"").decode()] = val
        return out

    def datasec_vars(self, section: str) -> dict[str, tuple[int, int]]:
        """Variables of a data section (.rodata, .bss) as name -> (offset, size)."""
        sec_id = self.find(section, BTF_KIND_DATASEC)
        if sec_id is None:
            return {}
        sec = lb.lib().lib.btf__type_by_id(self._ptr, sec_id)
        vlen = sec.contents.info & 0xFFFF
        base = ctypes.addressof(sec.contents) + ctypes.sizeof(abi.BtfTypeRecord)
        out = {}
        for var_type, offset, size in ((ctypes.c_uint32 * 3 * vlen).from_address(base)):
            out[self.type_by_id(var_type).name] = (offset, size)
        return out

    def free(self) -> None:
        if self._ptr and self._owned:
            lb.lib().lib.btf__free(self._ptr)
            self._ptr = None

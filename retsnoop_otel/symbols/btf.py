"""Return-type classification of kernel functions from BTF (drives the kernel's error logic)."""

from __future__ import annotations

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.kernel import libbpf_btf as lb

_MODIFIERS = (lb.BTF_KIND_TYPEDEF, lb.BTF_KIND_VOLATILE, lb.BTF_KIND_CONST, lb.BTF_KIND_RESTRICT,
              lb.BTF_KIND_TYPE_TAG)


def classify_type(btf: lb.Btf, tid: int) -> RetKind:
    """Map a BTF type to how its value is read: void/bool/unsigned never fail, pointers fail on NULL."""
    if tid == 0:
        return RetKind.VOID
    t = btf.type_by_id(tid)
    while t.kind in _MODIFIERS:
        if t.size_or_type == 0:
            return RetKind.VOID
        t = btf.type_by_id(t.size_or_type)
    if t.kind == lb.BTF_KIND_PTR:
        return RetKind.POINTER
    if t.kind == lb.BTF_KIND_INT:
        if t.int_encoding & lb.BTF_INT_BOOL:
            return RetKind.BOOL
        if not t.int_encoding & lb.BTF_INT_SIGNED or t.size_or_type < 4:
            return RetKind.UNSIGNED
        return RetKind.INT32 if t.size_or_type == 4 else RetKind.SIGNED
    if t.kind in (lb.BTF_KIND_ENUM, lb.BTF_KIND_ENUM64):
        return RetKind.INT32 if t.size_or_type == 4 else RetKind.SIGNED
    return RetKind.UNKNOWN


class ReturnKinds:
    """Looks up functions by name in kernel BTF; functions without BTF are UNKNOWN."""

    def __init__(self, btf: lb.Btf) -> None:
        self._btf = btf
        self._cache: dict[str, RetKind] = {}

    def func_id(self, name: str) -> int | None:
        return self._btf.find(name, lb.BTF_KIND_FUNC)

    def __call__(self, name: str) -> RetKind:
        kind = self._cache.get(name)
        if kind is None:
            fid = self.func_id(name)
            if fid is None:
                kind = RetKind.UNKNOWN
            else:
                proto = self._btf.type_by_id(self._btf.type_by_id(fid).size_or_type)
                kind = classify_type(self._btf, proto.size_or_type)
            self._cache[name] = kind
        return kind

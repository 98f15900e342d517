"""Which functions a BPF trampoline can take, read from their BTF prototype before the kernel is asked.

A tracing_multi link (fsession.multi) is refused whole for one function the kernel cannot trace, and finding
such functions by halving the set leaves a link per surviving part (a 10,000-function set with ZSTD's
struct-by-value parameters took 324 links, 29 s to attach under emulation). The rules below are the kernel's
own (Linux 7.2: btf_distill_func_proto() in kernel/bpf/btf.c, the noreturn_deny set of kernel/bpf/verifier.c
and x86-64's arch_prepare_bpf_trampoline()), so that the functions they refuse can be left out in one pass.
Deduplicated BTF shares prototypes between functions: each prototype and type is judged once.
"""

from __future__ import annotations

from collections.abc import Iterable

from retsnoop_otel.kernel import libbpf_btf as kb

MAX_ARGS = 12  # MAX_BPF_FUNC_ARGS: arguments, and (x86-64) 8-byte argument slots
MAX_ARG_SIZE = 16  # a struct passed by value takes at most two registers
MAX_RET_SIZE = 8  # fexit and fsession read the return value from one register
# functions that never return: the kernel refuses exit programs (fexit, fsession) for them
NORETURN = frozenset({"do_exit", "do_group_exit", "make_task_dead", "kthread_complete_and_exit",
                      "__module_put_and_kthread_exit", "__x64_sys_exit", "__x64_sys_exit_group", "__ia32_sys_exit",
                      "__ia32_sys_exit_group", "__kunit_abort", "kunit_try_catch_throw"})
_MODIFIERS = (kb.BTF_KIND_TYPEDEF, kb.BTF_KIND_VOLATILE, kb.BTF_KIND_CONST, kb.BTF_KIND_RESTRICT,
              kb.BTF_KIND_TYPE_TAG)
_SIZED = (kb.BTF_KIND_INT, kb.BTF_KIND_ENUM, kb.BTF_KIND_ENUM64, kb.BTF_KIND_STRUCT, kb.BTF_KIND_UNION)
_AGGREGATES = (kb.BTF_KIND_STRUCT, kb.BTF_KIND_UNION)


class _Judge:
    """One BTF's prototypes judged by the kernel's rules, each prototype and value type once."""

    def __init__(self, btf: kb.Btf) -> None:
        self._btf = btf
        self._values: dict[int, tuple[int, int]] = {}
        self._protos: dict[int, str | None] = {}

    def passed_as(self, tid: int) -> tuple[int, int]:
        """(kind, size) of a value of this type as a trampoline saves it; size -1 where it cannot (only pointers,
        integers, enums, structs and unions have a size there; void is 0)."""
        if tid not in self._values:
            self._values[tid] = self._resolve(tid)
        return self._values[tid]

    def _resolve(self, tid: int) -> tuple[int, int]:
        if tid == 0:
            return 0, 0
        kind, _, sot = self._btf.shape(tid)
        while kind in _MODIFIERS:
            if sot == 0:  # a typedef of void names no sized type
                return kind, -1
            kind, _, sot = self._btf.shape(sot)
        if kind == kb.BTF_KIND_PTR:
            return kind, 8
        return (kind, sot) if kind in _SIZED else (kind, -1)

    def refusal(self, func_btf_id: int, name: str) -> str | None:
        """Why the kernel refuses an exit-reading trampoline program for this function, or None if it takes it."""
        if name in NORETURN:
            return "it never returns"
        proto = self._btf.shape(func_btf_id)[2]
        if proto not in self._protos:
            self._protos[proto] = self._proto_refusal(proto)
        return self._protos[proto]

    def _proto_refusal(self, proto: int) -> str | None:
        _, nargs, ret = self._btf.shape(proto)
        if nargs > MAX_ARGS:
            return f"it has {nargs} arguments (at most {MAX_ARGS})"
        kind, size = self.passed_as(ret)
        if size < 0 or kind in _AGGREGATES or size > MAX_RET_SIZE:
            return "its return value is not an integer, enum or pointer of at most 8 bytes"
        params = self._btf.param_types(proto)
        if params and params[-1] == 0:
            return "it takes variable arguments"
        sizes = [self.passed_as(tid)[1] for tid in params]
        if any(s <= 0 or s > MAX_ARG_SIZE for s in sizes):
            return f"an argument is not an integer, enum, pointer or struct of 1 to {MAX_ARG_SIZE} bytes"
        if sum((s + 7) // 8 for s in sizes) > MAX_ARGS:
            return f"its arguments take more than {MAX_ARGS} 8-byte slots"
        return None


def refusals(btf: kb.Btf, funcs: Iterable[tuple[int, str]]) -> dict[int, str]:
    """BTF id -> why, for the (BTF id of a FUNC, name) pairs whose exit-reading trampoline the kernel refuses."""
    judge = _Judge(btf)
    return {tid: why for tid, name in funcs if (why := judge.refusal(tid, name)) is not None}

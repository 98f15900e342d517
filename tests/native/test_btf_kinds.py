"""Return-type classification against the running kernel's real BTF (the rules of the kernel's error logic)."""

from __future__ import annotations

import pytest

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.symbols.btf import ReturnKinds


@pytest.fixture(scope="module")
def kinds() -> ReturnKinds:
    return ReturnKinds(Btf.load_vmlinux())


@pytest.mark.parametrize("func,kind", [
    ("__sys_bpf", RetKind.INT32),                 # int
    ("array_map_alloc_check", RetKind.INT32),     # int
    ("bpf_map_area_alloc", RetKind.POINTER),      # void *
    ("capable", RetKind.BOOL),                    # bool
    ("bpf_map_put", RetKind.VOID),                # void
    ("__x64_sys_bpf", RetKind.SIGNED),            # long
    ("jiffies_to_msecs", RetKind.UNSIGNED),       # unsigned int
    ("no_such_function_here", RetKind.UNKNOWN),   # no BTF: treated like int, as retsnoop does
])
def test_kernel_functions_are_classified_by_their_btf_return_type(kinds, func, kind):
    assert kinds(func) == kind

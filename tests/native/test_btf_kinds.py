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


def test_raw_btf_index_agrees_with_libbpf_on_the_running_kernel(kinds) -> None:
    """symbols/btf_index.py parses /sys/kernel/btf/vmlinux itself (kernel_tables.c): same ids and kinds as
    libbpf's lookups for every 20th function of the running kernel (all of them take libbpf a minute: it
    scans per name)."""
    from pathlib import Path

    from retsnoop_otel.symbols.btf_index import FuncTypes
    from retsnoop_otel.symbols.globs import blob_names
    types = FuncTypes.from_raw_btf(Path("/sys/kernel/btf/vmlinux").read_bytes())
    assert len(types) > 10_000
    names = blob_names(types.state()[0][0])[::20] + ["__sys_bpf", "capable", "bpf_map_put", "jiffies_to_msecs"]
    assert [(n, types(n), types.func_id(n)) for n in names] == [(n, kinds(n), kinds.func_id(n)) for n in names]

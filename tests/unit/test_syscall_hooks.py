"""The syscall preset's tracepoint boundaries: the number table (symbols/syscall_numbers.py) against a real kernel's
function names, and which entries the tracepoints hook and what goes into their map (kernel/syscall_hooks.py).

The recorded names are tests/fixtures/syscall_preset/btf_funcs_6.18.txt (Linux 6.18 x86_64 BTF: every *sys_*
function). They hold the trap the table's entry names avoid: x86-64 builds `__x64_sys_stat`, `__x64_sys_fstat`,
`__x64_sys_uname` and `__x64_sys_sendfile` too, but syscalls 4, 5, 63 and 40 run newstat, newfstat, newuname and
sendfile64.
"""

from __future__ import annotations

import struct
from pathlib import Path

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import capture_config, syscall_hooks
from retsnoop_otel.runtime.config import ProbeSetConfig
from retsnoop_otel.runtime.syscall_set import boundaries
from retsnoop_otel.symbols.syscall_numbers import entry_numbers

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "syscall_preset" / "btf_funcs_6.18.txt"
NAMES = {line.split()[1] for line in RECORDED.read_text().splitlines() if line and not line.startswith("#")}
X86 = entry_numbers("x86_64")


def test_syscalls_whose_entry_is_not_named_after_them_map_to_the_entry_the_kernel_runs() -> None:
    for nr, entry, trap in ((4, "newstat", "stat"), (5, "newfstat", "fstat"), (6, "newlstat", "lstat"),
                            (40, "sendfile64", "sendfile"), (63, "newuname", "uname"), (166, "umount", None)):
        assert X86[f"__x64_sys_{entry}"] == (nr,)
        assert f"__x64_sys_{entry}" in NAMES
        if trap:
            assert f"__x64_sys_{trap}" in NAMES and f"__x64_sys_{trap}" not in X86


def test_syscalls_without_a_64_bit_entry_are_not_mapped_to_the_32_bit_stub_of_their_name() -> None:
    # set_thread_area (205) and uselib (134) run sys_ni_syscall on x86-64; the stubs exist for ia32
    assert {"__x64_sys_set_thread_area", "__x64_sys_get_thread_area", "__x64_sys_uselib"} <= NAMES
    assert not {"__x64_sys_set_thread_area", "__x64_sys_get_thread_area", "__x64_sys_uselib"} & set(X86)
    other_abi = {n for n in NAMES if n.startswith("__x64_sys_") and n.endswith(("16", "time32", "_pgoff"))}
    assert other_abi and not other_abi & set(X86)


def test_the_table_names_the_kernels_entry_functions_and_numbers_them_once() -> None:
    present = [n for n in X86 if n in NAMES]
    assert len(present) > 330, len(present)
    nrs = [nr for nrs in X86.values() for nr in nrs]
    assert len(nrs) == len(set(nrs)) and max(nrs) < syscall_hooks.MAX_SYSCALL_NR
    assert X86["__x64_sys_bpf"] == (321,) and X86["__x64_sys_openat"] == (257,)


def test_arm64_numbers_follow_the_generic_table() -> None:
    arm = entry_numbers("aarch64")
    assert arm == entry_numbers("arm64")
    assert arm["__arm64_sys_bpf"] == (280,) and arm["__arm64_sys_openat"] == (56,)
    assert arm["__arm64_sys_newfstat"] == (80,) and arm["__arm64_sys_fadvise64_64"] == (223,)
    assert "__arm64_sys_fstat" not in arm and "__arm64_sys_nfsservctl" not in arm


def test_an_architecture_without_a_table_hooks_nothing() -> None:
    assert entry_numbers("riscv64") == {}
    assert boundaries(ProbeSetConfig(name="p", entry=("x",), syscalls=True), machine="riscv64") == {}


def test_only_the_preset_enters_by_the_tracepoints() -> None:
    assert boundaries(ProbeSetConfig(name="p", entry=("__x64_sys_bpf",)), machine="x86_64") == {}
    assert boundaries(ProbeSetConfig(name="p", syscalls=True), machine="x86_64") == X86


def _f(fid: int, name: str, is_entry: bool = True, **kw) -> TracedFunc:
    return TracedFunc(fid, name, 0x1000 + fid, RetKind.SIGNED, is_entry, **kw)


def test_the_tracepoints_hook_the_numbered_kernel_entries_and_the_mode_links_the_rest() -> None:
    funcs = [_f(0, "__x64_sys_bpf"), _f(1, "__x64_sys_ni_syscall"), _f(2, "array_map_alloc_check", False),
             _f(3, "__x64_sys_read", False), _f(4, "__x64_sys_openat", module="m"),
             _f(5, "__x64_sys_write", binary="/bin/x"), _f(6, "__x64_sys_newstat")]
    hooks = syscall_hooks.hooked(funcs, {**X86, "__x64_sys_ni_syscall": (2000,)})
    assert hooks == {0: (321,), 6: (4,)}  # not: unnumbered, out of the map, not an entry, a module's, a user's
    assert [f.id for f in capture_config.mode_funcs(funcs, hooks)] == [1, 2, 3, 4]


def test_each_number_of_a_hooked_entry_finds_its_function_id_plus_one() -> None:
    written: dict[bytes, bytes] = {}

    class Map:
        def update(self, key: bytes, value: bytes) -> None:
            written[key] = value

    class Obj:
        def map(self, name: str) -> Map:
            assert name == "nr_ids"
            return Map()

    syscall_hooks.fill(Obj(), {7: (4, 8), 0: (321,)})  # type: ignore[arg-type]
    assert {struct.unpack("<I", k)[0]: struct.unpack("<I", v)[0] for k, v in written.items()} == {4: 8, 8: 8,
                                                                                                  321: 1}
    syscall_hooks.fill(Obj(), {})  # type: ignore[arg-type]  # nothing hooked: the map is not touched
    assert len(written) == 3

"""Which architecture a package's files were built for: the ELF machine of its shared libraries and the register
layout its BPF object was compiled against. Asked of the wheels (tests/test_wheel.py) and of the libraries inside the
arm64 image (tests/test_image_arm64.py), which must be aarch64 code whatever the host builds it on."""

from __future__ import annotations

import re
from collections.abc import Mapping

EM_X86_64, EM_AARCH64 = 62, 183
ELF_MACHINE = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}
# what the BPF object's BTF names only when built for that architecture (vmlinux_min.h's register layouts)
BPF_ARCH_MARK = {"x86_64": b"orig_ax", "aarch64": b"user_pt_regs"}
SHARED_LIBRARY = re.compile(r"\.so(\.\d+)*$")


def elf_machine(data: bytes) -> int:
    assert data[:4] == b"\x7fELF" and data[5] == 1, "a little-endian ELF file"
    return int.from_bytes(data[18:20], "little")


def check_machine_code(files: Mapping[str, bytes], bpf_object: bytes, machine: str) -> None:
    """Every shared library of `files` (name: contents) is machine code for `machine` (uname -m's name), and the BPF
    object was built for it."""
    em = ELF_MACHINE[machine]
    libs = [n for n in files if SHARED_LIBRARY.search(n)]
    assert len(libs) >= 4, libs  # libbpf, publisher, kernel tables, libelf (auditwheel)
    for name in libs:
        assert elf_machine(files[name]) == em, (name, machine)
    others = [mark for m, mark in BPF_ARCH_MARK.items() if m != machine]
    assert BPF_ARCH_MARK[machine] in bpf_object and not any(mark in bpf_object for mark in others), machine

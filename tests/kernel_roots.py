"""Fixture kernel roots: tests/fixtures/kernel_root (kallsyms, available_filter_functions) copied into a test's
tmp_path, with the files the kernel cache's key is made of: /sys/kernel/notes (build-id),
/proc/sys/kernel/random/boot_id and /proc/modules."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "kernel_root"
MODULES = ("kvm 1204224 1 kvm_intel, Live 0xffffffffc0400000\n"
           "nf_tables 352256 0 - Live 0xffffffffc0a00000\n")


def notes(build_id: bytes) -> bytes:
    return struct.pack("<III", 4, len(build_id), 3) + b"GNU\0" + build_id


def make_root(tmp_path: Path, build_id: bytes = b"\x12" * 20, boot: str = "boot-1", modules: str = MODULES) -> Path:
    root = tmp_path / "root"
    if not root.exists():
        shutil.copytree(FIXTURE, root)
    (root / "sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "sys/kernel/notes").write_bytes(notes(build_id))
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    (root / "proc/modules").write_text(modules)
    return root


def btf_blob() -> bytes:
    """int f_int(void); long f_long(void): the smallest BTF with two functions."""
    strings = b"\0int\0f_int\0long\0f_long\0"
    types = b"".join([
        struct.pack("<III", 1, 1 << 24, 4), struct.pack("<I", 1 << 24 | 32),  # 1: INT int, signed, 32 bits
        struct.pack("<III", 0, 13 << 24, 1),  # 2: FUNC_PROTO -> int
        struct.pack("<III", 5, 12 << 24 | 1, 2),  # 3: FUNC f_int
        struct.pack("<III", 11, 1 << 24, 8), struct.pack("<I", 1 << 24 | 64),  # 4: INT long
        struct.pack("<III", 0, 13 << 24, 4),  # 5: FUNC_PROTO -> long
        struct.pack("<III", 16, 12 << 24 | 1, 5),  # 6: FUNC f_long
    ])
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings)) + types + strings

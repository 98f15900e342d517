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

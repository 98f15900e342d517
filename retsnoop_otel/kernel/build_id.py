"""The running kernel's GNU build-id: what ties a vmlinux, its BTF and caches to one kernel build."""

from __future__ import annotations

from pathlib import Path


def parse_notes_build_id(data: bytes) -> str | None:
    """The GNU build-id from a raw ELF notes blob (/sys/kernel/notes)."""
    off = 0
    while off + 12 <= len(data):
        namesz, descsz, ntype = (int.from_bytes(data[off + i:off + i + 4], "little") for i in (0, 4, 8))
        name_off = off + 12
        desc_off = name_off + ((namesz + 3) & ~3)
        if ntype == 3 and data[name_off:name_off + namesz].rstrip(b"\0") == b"GNU":
            return data[desc_off:desc_off + descsz].hex()
        off = desc_off + ((descsz + 3) & ~3)
    return None


def running_build_id(root: str = "/") -> str | None:
    try:
        return parse_notes_build_id(Path(root, "sys/kernel/notes").read_bytes())
    except OSError:
        return None


def module_build_id(name: str, root: str = "/") -> str:
    """A loaded module's GNU build-id ('' when it has none or it cannot be read): with its name and size, what
    says a module loaded at another boot is the same file, its symbols at the same offsets from its base."""
    try:
        data = Path(root, "sys/module", name, "notes/.note.gnu.build-id").read_bytes()
    except OSError:
        return ""
    return parse_notes_build_id(data) or ""

"""Finding the running kernel's vmlinux with DWARF: the standard places, checked by build-id.

Kept apart from symbols/dwarf.py (symbolization, source-path index) so that starting without a
vmlinux costs only a few stat() calls, not the import of pyelftools.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from retsnoop_otel.inputs.files import plain
from retsnoop_otel.kernel.build_id import running_build_id


class DwarfError(Exception):
    """A vmlinux problem the user can fix (wrong file, no DWARF, tools missing)."""


def elf_build_id(path: str) -> str | None:
    from elftools.elf.elffile import ELFFile  # pyelftools takes seconds to import under emulation: only with a file
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        for sec in elf.iter_sections():
            if sec.header["sh_type"] != "SHT_NOTE":
                continue
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    desc = note["n_desc"]
                    # vmlinux carries a dummy 8-byte note for the decompressor: skip it
                    if isinstance(desc, str) and len(desc) >= 32:
                        return desc
    return None


def candidate_paths(release: str, root: str = "/") -> list[Path]:
    """Where distributions put a vmlinux with DWARF (retsnoop looks in the same places)."""
    rel = [f"boot/vmlinux-{release}", f"lib/modules/{release}/vmlinux-{release}",
           f"lib/modules/{release}/vmlinux", f"lib/modules/{release}/build/vmlinux",
           f"usr/lib/modules/{release}/kernel/vmlinux", f"usr/lib/debug/boot/vmlinux-{release}",
           f"usr/lib/debug/boot/vmlinux-{release}.debug", f"usr/lib/debug/lib/modules/{release}/vmlinux"]
    return [Path(root, p) for p in rel]


def find_vmlinux(explicit: str | None = None, root: str = "/", release: str | None = None) -> str | None:
    """The vmlinux matching the running kernel, or None; a wrong explicit file is an error (its message
    starts with the path: the caller adds how the user gave it)."""
    release = release or os.uname().release
    want = running_build_id(root)
    if explicit:
        named = plain(explicit)  # as messages echo a path: one line, bounded
        try:
            if not stat.S_ISREG(os.stat(explicit).st_mode):
                raise DwarfError(f"{named}: not a file")
        except FileNotFoundError:
            raise DwarfError(f"{named}: no such file") from None
        except OSError as exc:
            raise DwarfError(f"{named}: cannot read it ({exc.strerror or exc}); run as root or give a "
                             "readable vmlinux") from None
        try:
            have = elf_build_id(explicit)
        except OSError as exc:
            raise DwarfError(f"{named}: cannot read it ({exc.strerror or exc}); run as root or give a "
                             "readable vmlinux") from None
        except Exception as exc:  # noqa: BLE001 - pyelftools raises many types on non-ELF input
            raise DwarfError(f"{named}: not an ELF vmlinux ({exc})") from None
        if want and have and want != have:
            raise DwarfError(f"{named} belongs to another kernel build (build-id {have}, running kernel "
                             f"{want}): give the vmlinux of the running kernel ({release})")
        return explicit
    for path in candidate_paths(release, root):
        try:  # a candidate this user cannot read (an unprivileged run) is skipped like a missing one
            if not path.is_file():
                continue
            have = elf_build_id(str(path))
        except Exception:  # noqa: BLE001 - OSError, or pyelftools' many types on non-ELF input
            continue
        if not want or not have or have == want:
            return str(path)
    return None

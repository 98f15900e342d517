"""What the console and the exported spans both say of captured frames: which LBR records are relevant, and how
a user-space frame reads. Kept apart from render/ (text for people) and export/ (OTLP), which both use it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from retsnoop_otel.capture.model import Branch, UserFrame


def relevant(records: Sequence[Branch], func_addr: int, func_size: int) -> tuple[list[Branch], bool]:
    """retsnoop's relevance cut: records are newest first; drop the newest ones up to the first whose
    source or target lies inside the deepest traced function. Returns (kept, filtered?); when no
    record touches that function, everything is kept and filtered is False."""
    end = func_addr + max(func_size, 1)
    for i, b in enumerate(records):
        if func_addr <= b.src < end or func_addr <= b.dst < end:
            return list(records[i:]), True
    return list(records), False


def user_frame_symbol(f: UserFrame) -> str:
    if f.function is None:
        return f"0x{f.addr:x}"
    return f". {f.function}" if f.inlined else f"{f.function}+0x{f.offset:x}"


def user_frame_where(f: UserFrame) -> str:
    src = f"({f.file}:{f.line})" if f.file else ""
    mod = f"[{os.path.basename(f.module)}]" if f.module else ""
    return f"{src} {mod}".strip()


def user_frame_text(f: UserFrame, with_address: bool = False) -> str:
    """'name+0xoff (file:line) [module]'; addresses only on request: user addresses reveal ASLR."""
    text = f"{user_frame_symbol(f)} {user_frame_where(f)}".strip()
    return f"0x{f.addr:016x} {text}" if with_address and f.function is not None else text

"""The user-space stack of a session's thread as text: one frame per line, outermost first.

Frames come symbolized (symbols.user_symbols) while the process was alive; they are printed under
the kernel stack in the stack view's columns, and exported one per line on the root span.
"""

from __future__ import annotations

import os

from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.capture.model import Session, UserFrame


def _symbol(f: UserFrame) -> str:
    if f.function is None:
        return f"0x{f.addr:x}"
    return f". {f.function}" if f.inlined else f"{f.function}+0x{f.offset:x}"


def _where(f: UserFrame) -> str:
    src = f"({f.file}:{f.line})" if f.file else ""
    mod = f"[{os.path.basename(f.module)}]" if f.module else ""
    return f"{src} {mod}".strip()


def user_frame_text(f: UserFrame, with_address: bool = False) -> str:
    """'name+0xoff (file:line) [module]'; addresses only on request: user addresses reveal ASLR."""
    text = f"{_symbol(f)} {_where(f)}".strip()
    return f"0x{f.addr:016x} {text}" if with_address and f.function is not None else text


def user_stack_lines(session: Session) -> list[str]:
    """The block printed under the kernel stack; empty when no user stack was taken."""
    if session.ustack_error:
        return [f"user stack: not captured ({errno_name(session.ustack_error) or session.ustack_error})"]
    if not session.user_frames:
        return []
    frames = list(reversed(session.user_frames))  # innermost first as taken: print outermost first
    width = max(len(_symbol(f)) for f in frames)
    return ["user stack:", *(f"   {_symbol(f):<{width}}  {_where(f)}".rstrip() for f in frames)]

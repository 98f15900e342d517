"""The user-space stack of a session's thread as text: one frame per line, outermost first.

Frames come symbolized (symbols.user_symbols, off the capture loop: appctx/stacks.py); a stack whose symbols
did not come in time is printed as its addresses. They are printed under the kernel stack in the stack
view's columns, and exported one per line on the root span.
"""

from __future__ import annotations

from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.capture.frames import user_frame_symbol, user_frame_where
from retsnoop_otel.capture.model import Session


def user_stack_lines(session: Session) -> list[str]:
    """The block printed under the kernel stack; empty when no user stack was taken."""
    if session.ustack_error:
        return [f"user stack: not captured ({errno_name(session.ustack_error) or session.ustack_error})"]
    if not session.user_frames:
        return []
    frames = list(reversed(session.user_frames))  # innermost first as taken: print outermost first
    width = max(len(user_frame_symbol(f)) for f in frames)
    why = f" (not symbolized: {session.ustack_unsymbolized})" if session.ustack_unsymbolized else ""
    rows = (f"   {user_frame_symbol(f):<{width}}  {user_frame_where(f)}".rstrip() for f in frames)
    return [f"user stack{why}:", *rows]

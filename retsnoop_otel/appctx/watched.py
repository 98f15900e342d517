"""Whether a probe set's sessions go through the application watcher (appctx/watch.py): apart from it, so that
a start whose probe sets read no application imports neither the watcher nor its process readers."""

from __future__ import annotations

from typing import Protocol

from retsnoop_otel.kernel.attach_modes import BY_NAME


class WatchedSet(Protocol):
    """What the watcher reads of a probe set's configuration (runtime.config.ProbeSetConfig)."""

    app_context: bool
    user_stacks: bool
    mode: str
    attach_mode: str


def watches(ps: WatchedSet) -> bool:
    """Whether a probe set's sessions go through the watcher: it reads thread context or takes user stacks
    (a metrics-only set reports no session, and a mode without sessions, --origins-only, has none)."""
    kmode = BY_NAME.get(ps.attach_mode)
    return (ps.app_context or ps.user_stacks) and ps.mode != "metrics" and (kmode is None or kmode.sessions)

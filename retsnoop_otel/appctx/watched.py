"""Whether a probe set's sessions go through the application watcher (appctx/watch.py): apart from it, so that
a start whose probe sets read no application imports neither the watcher nor its process readers."""

from __future__ import annotations

from typing import Protocol


class WatchedSet(Protocol):
    """What the watcher reads of a probe set's configuration (runtime.config.ProbeSetConfig)."""

    app_context: bool
    user_stacks: bool
    mode: str


def watches(ps: WatchedSet) -> bool:
    """Whether a probe set's sessions go through the watcher: it reads thread context or takes user stacks
    (a metrics-only set reports no session)."""
    return (ps.app_context or ps.user_stacks) and ps.mode != "metrics"

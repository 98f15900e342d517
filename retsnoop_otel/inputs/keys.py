"""The refusal of a key a YAML file (the agent's config, the web config of /metrics) does not know."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def unknown_key(name: str, known: Sequence[str]) -> str:
    """'unknown key; did you mean ...?' with the nearest known key, else the list of them."""
    close = difflib.get_close_matches(name, known, n=1)
    return "unknown key; " + (f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}")

"""The refusal of a key a YAML file (the agent's config, the web config of /metrics) does not know."""

from __future__ import annotations

from collections.abc import Sequence


def unknown_key(name: str, known: Sequence[str]) -> str:
    """'unknown key; did you mean ...?' with the nearest known key, else the list of them."""
    import difflib  # only for a bad key: a start with good input does not import it

    close = difflib.get_close_matches(name, known, n=1)
    return "unknown key; " + (f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}")

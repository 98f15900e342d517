"""retsnoop's glob dialect: only `*` (any run, also empty) and `?` (one character) are special."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=1024)
def glob_to_regex(glob: str) -> re.Pattern[str]:
    parts = []
    for ch in glob:
        if ch == "*":
            parts.append(".*")
        elif ch == "?":
            parts.append(".")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts), re.DOTALL)


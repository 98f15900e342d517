"""retsnoop's glob dialect: only `*` (any run, also empty) and `?` (one character) are special."""

from __future__ import annotations

import re
from collections.abc import Iterable
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



def name_blob(names: Iterable[str]) -> str:
    """Names one per line with a newline before the first and after the last: what lines_matching scans."""
    joined = "\n".join(names)
    return f"\n{joined}\n" if joined else "\n"


def blob_names(blob: str) -> list[str]:
    """The names of a name_blob(), in order."""
    return blob[1:-1].split("\n") if len(blob) > 1 else []


@lru_cache(maxsize=1024)
def _line_regex(glob: str) -> re.Pattern[str]:
    """The glob as a regex over one line of a name blob (wildcards never cross a newline)."""
    body = "".join("[^\n]*" if ch == "*" else "[^\n]" if ch == "?" else re.escape(ch) for ch in glob)
    return re.compile(f"\n({body})(?=\n)")


def lines_matching(glob: str, blob: str) -> set[str]:
    """The names of a name_blob() that `glob` matches whole, found by C-level scans.

    A regex anchored on the line start (`^...$` with re.M) tries every position of a blob of a
    hundred thousand names: about ten times slower than one that starts with a literal newline and
    the glob's literal prefix, which the regex engine finds by fast search. A glob that starts with a
    wildcard (`*sys_bpf`) is found through its longest literal part instead, checked line by line.
    """
    if "*" not in glob and "?" not in glob:
        return {glob} if f"\n{glob}\n" in blob else set()
    if glob[0] not in "*?":
        return set(_line_regex(glob).findall(blob))
    literal = max(re.split(r"[*?]", glob), key=len)
    if not literal:  # only wildcards
        return set(_line_regex(glob).findall(blob))
    whole = glob_to_regex(glob)
    out: set[str] = set()
    at = blob.find(literal, 1)
    while at >= 0:
        start = blob.rfind("\n", 0, at) + 1
        end = blob.find("\n", at)
        line = blob[start:end]
        if "\n" not in literal and whole.fullmatch(line):
            out.add(line)
        at = blob.find(literal, end)
    return out

"""`trace`'s argument parser: getopt's way with values, a record of what it declares, and linear in the words.

argparse alone is quadratic in the number of option words (each one looks up the next option among all the
later ones, and each `append` copies the list so far): 10,000 `-a x` took 12 s, 100,000 more than two minutes.
So a long command line is parsed in chunks of about CHUNK_WORDS words, each cut just before a word that can only
be an option (argparse never takes such a word as a value, so a cut changes no word's meaning), each into a fresh
namespace; the chunks' values are then merged the way one parse would have set them (an `append` concatenated,
a `count` summed, any other the last one given). A mutually exclusive pair given in two chunks is refused as one
parse would refuse it. Everything else is argparse's own: types, choices, messages, help.

The parser keeps what it declares (`declared`, `exclusive`, `groups`) because argparse keeps it only in private
attributes: the docs generator and the tests read these.
"""

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from retsnoop_otel.command.help_format import OneLineParser

CHUNK_WORDS = 64  # a chunk's parse costs its words squared: 64 keeps that near the per-chunk set-up cost
APPENDS = ("append", "append_const", "extend")


class Declared(NamedTuple):
    """One argument as declared: its help group's title, argparse's action, and how its values merge."""

    group: str
    action: argparse.Action
    merge: str  # "append" (concatenate), "count" (sum) or "last" (the last chunk that set it)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def merge_kind(action: object) -> str:
    """How a value given twice combines: argparse's `action` keyword, or a custom Action class's `merge`."""
    if isinstance(action, str):
        return "append" if action in APPENDS else "count" if action == "count" else "last"
    return getattr(action, "merge", "last")


def option_words(parser: "FlagParser") -> tuple[frozenset[str], frozenset[str]]:
    """(every option spelling, the short ones): what a word must start with to be only an option."""
    names = frozenset(o for d in parser.declared for o in d.action.option_strings)
    return names, frozenset(o for o in names if len(o) == 2 and o[0] == "-" and o[1] != "-")


def is_option(word: str, names: frozenset[str], shorts: frozenset[str]) -> bool:
    """A word argparse can only read as an option: a spelling, `--name=value`, or a known short letter with more
    after it (`-vv`, `-afoo`)."""
    if word in names or word[:2] in shorts:
        return True
    return word.startswith("--") and word.partition("=")[0] in names


def chunks(words: Sequence[str], names: frozenset[str], shorts: frozenset[str],
           size: int = CHUNK_WORDS) -> list[list[str]]:
    """`words` cut into runs of at least `size` words, each run but the first starting with an option word;
    '--' and all after it stay in the last run (after it, words are never options)."""
    out: list[list[str]] = []
    cur: list[str] = []
    for i, word in enumerate(words):
        if word == "--":
            cur.extend(words[i:])
            break
        if len(cur) >= size and is_option(word, names, shorts):
            out.append(cur)
            cur = []
        cur.append(word)
    out.append(cur)
    return out


def joined_values(words: Sequence[str], takes_value: frozenset[str]) -> list[str]:
    """getopt's reading: a flag that takes a value takes the next word even when it starts with '-' (`-x -ENOMEM`),
    written as `flag=value` so argparse does too. Not '--': argparse drops it from a value, leaving a list."""
    out: list[str] = []
    i = 0
    while i < len(words):
        if words[i] in takes_value and i + 1 < len(words) and words[i + 1].startswith("-") and words[i + 1] != "--":
            out.append(f"{words[i]}={words[i + 1]}")
            i += 2
            continue
        out.append(words[i])
        i += 1
    return out


class FlagGroup:
    """An argparse argument group (or mutually exclusive group) that tells its parser what it declares."""

    def __init__(self, parser: "FlagParser", title: str, group: Any, exclusive: list[argparse.Action] | None = None):
        self.parser, self.title, self.group, self.members = parser, title, group, exclusive

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        action = self.group.add_argument(*names, **kwargs)
        self.parser.declared.append(Declared(self.title, action, merge_kind(kwargs.get("action", "store"))))
        if self.members is not None:
            self.members.append(action)
        return action

    def add_mutually_exclusive_group(self) -> "FlagGroup":
        members: list[argparse.Action] = []
        self.parser.exclusive.append(members)
        return FlagGroup(self.parser, self.title, self.group.add_mutually_exclusive_group(), members)


class FlagParser(OneLineParser):
    """OneLineParser with getopt's values, declared arguments on record, and a parse linear in the words."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.declared: list[Declared] = []
        self.exclusive: list[list[argparse.Action]] = []
        self.groups: dict[str, FlagGroup] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:  # type: ignore[override]
        """Arguments outside a group (argparse's own -h among them) are declared in the 'options' group."""
        action = super().add_argument(*names, **kwargs)
        self.declared.append(Declared("options", action, merge_kind(kwargs.get("action", "store"))))
        return action

    def flag_group(self, title: str) -> FlagGroup:
        """The help group `title`, made the first time it is asked for."""
        if title not in self.groups:
            self.groups[title] = FlagGroup(self, title, self.add_argument_group(title))
        return self.groups[title]

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        takes_value = frozenset(o for d in self.declared if d.action.nargs is None for o in d.action.option_strings)
        words = joined_values(list(sys.argv[1:] if args is None else args), takes_value)
        names, shorts = option_words(self)
        runs = chunks(words, names, shorts)
        if len(runs) == 1:
            return super().parse_known_args(words, namespace)
        return self._parse_chunks(runs, namespace)

    def _parse_chunks(self, runs: list[list[str]], namespace: argparse.Namespace | None):
        kinds = {d.action.dest: d.merge for d in self.declared if d.action.dest is not argparse.SUPPRESS}
        merged, extras = super().parse_known_args([], namespace)  # every default, as one parse sets them
        given: dict[str, list[Any]] = {}  # dest -> its value from each chunk that set it
        for run in runs:
            fresh = argparse.Namespace(**{dest: [] if kind == "append" else 0 if kind == "count" else UNSET
                                          for dest, kind in kinds.items()})
            ns, rest = super().parse_known_args(run, fresh)
            extras.extend(rest)
            for dest, kind in kinds.items():
                value = getattr(ns, dest)
                if value is not UNSET and value != [] and not (kind == "count" and value == 0):
                    given.setdefault(dest, []).append(value)
        self._check_exclusive(given)
        for dest, values in given.items():
            kind, start = kinds[dest], getattr(merged, dest, None)
            if kind == "append":
                setattr(merged, dest, list(start or []) + [v for chunk in values for v in chunk])
            elif kind == "count":
                setattr(merged, dest, (start or 0) + sum(values))
            else:
                setattr(merged, dest, values[-1])
        return merged, extras

    def _check_exclusive(self, given: dict[str, list[Any]]) -> None:
        """Two members of a mutually exclusive group set in different chunks: argparse's refusal of one parse."""
        for members in self.exclusive:
            seen = [a for a in members if a.dest in given
                    and (a.const is None or any(v == a.const for v in given[a.dest]))]
            if len(seen) > 1:
                first, later = ("/".join(a.option_strings) for a in seen[:2])
                self.error(f"argument {later}: not allowed with argument {first}")

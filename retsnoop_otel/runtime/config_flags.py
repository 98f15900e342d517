"""`trace`'s flags made from the keys' declarations (config_keys.Flag): the argparse argument of a key's flag
takes the key's reading and range, convert, check, default, choices and doc line, so that the flag and the key
cannot say different things. Flags without a config key are written by hand in trace/flags.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from retsnoop_otel.command.flag_parser import FlagParser
from retsnoop_otel.inputs.numbers import NumberError
from retsnoop_otel.runtime.config_keys import FIELD, Flag, Key, Section

SWITCHES = ("store_true", "store_false", "store_const")


class KeyType:
    """A flag's text as its key's field value: the kind's reading (its range), the key's check, then its convert.
    A bad value is argparse's one error line: `argument -p/--pid: must be an integer between ...`."""

    def __init__(self, key: Key, flag: Flag) -> None:
        self.key, self.read, self.checked = key, flag.parse or key.kind.parse or str, flag.checked
        self.item = flag.action == "append"  # each occurrence is one item of the key's list
        self.__name__ = key.name  # argparse names the value by its type's name

    def __call__(self, text: str) -> Any:
        try:
            value = self.read(text)
        except (NumberError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        bad = self.key.check([value] if self.item else value) if self.key.check and self.checked else None
        if bad:
            raise argparse.ArgumentTypeError(bad)
        return self.key.convert(value) if self.key.convert else value


def flags_of(key: Key) -> tuple[Flag, ...]:
    return () if key.flag is None else (key.flag,) if isinstance(key.flag, Flag) else key.flag


def help_of(key: Key, flag: Flag) -> str:
    """The key's doc line, then what the flag does beyond it (argparse %-formats help: '%' doubled)."""
    return (f"{key.doc}; {flag.note}" if flag.note else key.doc).replace("%", "%%")


def default_of(section: Section, key: Key, flag: Flag) -> Any:
    """The flag's default: its own when it has one, [] for a repeated flag, else the field's (the file's too)."""
    if flag.default is not FIELD:
        return flag.default
    if flag.action == "append":
        return []
    return getattr(section.target, "_field_defaults", {}).get(key.fields[0])


def keyword_args(section: Section, key: Key, flag: Flag) -> dict[str, Any]:
    """argparse's add_argument keywords for `flag` of `key`."""
    kwargs: dict[str, Any] = {"dest": flag.dest, "action": flag.action, "default": default_of(section, key, flag),
                              "help": help_of(key, flag)}
    if flag.action == "store_const":
        kwargs["const"] = flag.const
    if flag.action not in SWITCHES:
        kwargs["type"] = KeyType(key, flag)
        kwargs["metavar"] = flag.metavar
        if key.kind.choices and flag.parse is None:
            kwargs["choices"] = key.kind.choices
        if flag.nargs is not None:
            kwargs.update(nargs=flag.nargs, const=flag.const)
    return kwargs


def add_key_flags(group: Any, section: Section, name: str) -> None:
    """The argparse arguments of key `name`'s flags, in `group`; a key with several switches (one value
    each) gets them as a mutually exclusive group."""
    key = section.key(name)
    flags = flags_of(key)
    assert flags, f"{section.name}.{name} has no flag"
    where = group.add_mutually_exclusive_group() if len(flags) > 1 else group
    for flag in flags:
        where.add_argument(*flag.names, **keyword_args(section, key, flag))


def add_other_key_flags(parser: FlagParser, sections: tuple[Section, ...]) -> None:
    """The declared flags not placed yet, each in its help group (Flag.group, made when new): a new key's flag
    needs no line in trace/flags.py."""
    placed = {o for d in parser.declared for o in d.action.option_strings}
    for section in sections:
        for key in section.keys:
            flags = [f for f in flags_of(key) if f.names[0] != "-C" and f.names[0] not in placed]
            if flags:
                add_key_flags(parser.flag_group(flags[0].group), section, key.name)


def field_values(args: argparse.Namespace, *sections: Section) -> dict[str, Any]:
    """The fields the declared flags set as they are (a key of one field; a switch of a bool field): the
    command line's part of the sections' target, which the caller completes with what it reads otherwise."""
    out: dict[str, Any] = {}
    for section in sections:
        fields = getattr(section.target, "_fields", ())
        for key in section.keys:
            if len(key.fields) != 1 or key.fields[0] not in fields:
                continue
            field_default = section.target._field_defaults.get(key.fields[0])
            for flag in flags_of(key):
                value = getattr(args, flag.dest, None)  # None: not given (a None default) or not this parser's
                if value is None or (flag.action in ("store_true", "store_false")
                                     and not isinstance(field_default, bool)):  # a switch meaning more (-T, -S)
                    continue
                out[key.fields[0]] = tuple(value) if flag.action == "append" else value
    return out


def declared(sections: tuple[Section, ...]) -> Iterator[tuple[Section, Key, Flag]]:
    """Every command-line flag (not -C keys) the sections declare."""
    for section in sections:
        for key in section.keys:
            for flag in flags_of(key):
                if flag.names[0] != "-C":
                    yield section, key, flag


def c_keys(section: Section) -> dict[str, tuple[Section, Key, Flag]]:
    """The -C KEY=VALUE keys (retsnoop's) the section's keys declare, by -C name."""
    return {flag.names[1]: (section, key, flag) for key in section.keys for flag in flags_of(key)
            if flag.names[0] == "-C"}


def c_help(section: Section, key: Key, flag: Flag) -> str:
    """--config-help's line of a -C key that is a config key: its doc line, type and range, default."""
    return f"{help_of(key, flag)}: {key.kind.what} (default {default_of(section, key, flag)})".replace("%%", "%")

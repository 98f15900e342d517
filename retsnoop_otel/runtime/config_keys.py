"""How the agent file's keys are declared: each key once, as a Key of its Section, with how its value is read
(a Kind: reader, type in words, JSON Schema, the same range for a flag's text), one doc line and the `trace`
flag that sets the same value (a Flag).

The default is the target NamedTuple's field default (runtime/config.py and the like): a key left out of the
file is left out of the constructor call, so no default is written twice. read_section() reads a section by
its declarations; the reference table (docs/reference/config.md), the JSON Schema (config/agent.schema.json,
agent/config_schema.py) and `trace`'s flags (runtime/config_flags.py) are made from the same declarations.
Here, below trace/ and agent/, so that both build on them; PyYAML is imported only when a file is read.
"""

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from retsnoop_otel.inputs.files import shown
from retsnoop_otel.inputs.numbers import IntRange, NumberError, parse_int, parse_size
from retsnoop_otel.runtime.yaml_nodes import (
    Nodes,
    boolean,
    choice,
    integer,
    items,
    mapping,
    number,
    opt_string,
    size,
    string,
    yaml,
)

Reader = Callable[[Nodes, "yaml.Node", str, Mapping[str, "yaml.Node"]], Any]  # node, dotted key, the section's nodes


class Kind(NamedTuple):
    """What a key's value is: how it is read, said in words (the docs' type column) and as a JSON Schema."""

    read: Reader
    what: str
    schema: Mapping[str, Any]
    section: "Section | None" = None  # a mapping of declared keys (documented and schema'd key by key)
    parse: Callable[[str], Any] | None = None  # a flag's text as this value, same range (raises NumberError)
    choices: tuple[str, ...] | None = None  # the names it takes (a flag gets argparse's choices)


FIELD = object()  # Flag.default: the field's default, as the file's


class Flag(NamedTuple):
    """The `trace` flag that sets a key's value. Its type (the kind's parse, then the key's convert), range,
    default (the field's), metavar and help (the key's doc line) come from the key (runtime/config_flags.py):
    this says only what the flag does otherwise (a switch for one value, repeats, a default of its own)."""

    names: tuple[str, ...]  # retsnoop's spellings first; ("-C", "KEY"): a -C KEY=VALUE key
    dest: str  # where trace/flags.py reads it
    action: str = "store"  # append: repeatable; store_true/store_false/store_const: a switch
    note: str = ""  # what the flag does beyond the doc line, appended to its help
    metavar: str | None = None
    nargs: str | None = None
    const: Any = None
    default: Any = FIELD  # FIELD: the field's default ([] for append)
    parse: Callable[[str], Any] | None = None  # a flag-only reading of the text (None: the kind's parse)
    group: str = "settings of the agent file"  # trace --help's group, when trace/flags.py does not place it
    checked: bool = True  # False: the runtime checks the value, naming the flag (trace's -k)

    @property
    def shown(self) -> str:
        """As the reference table names it."""
        return " ".join(self.names) if self.names[0] == "-C" else self.names[0]


class Key(NamedTuple):
    name: str  # as written in the file
    kind: Kind
    doc: str  # one line
    field: str | tuple[str, ...] = ""  # the target's field(s) it sets ("": its name; a tuple: one value each)
    flag: Flag | tuple[Flag, ...] | None = None  # trace's flag for the same value (switches: one per value)
    convert: Callable[[Any], Any] | None = None  # the value as read -> the field's value
    check: Callable[[Any], str | None] | None = None  # a problem with the value read, said for its line
    required: str = ""  # the message when it is missing (then the key is required)
    default: Callable[[], Any] | None = None  # the default as the file writes it, when that is not the field's

    @property
    def fields(self) -> tuple[str, ...]:
        return self.field if isinstance(self.field, tuple) else (self.field or self.name,)


class Section(NamedTuple):
    name: str  # dotted, as errors and the docs name it ("probe_sets[]" for each probe set)
    target: type | None  # the NamedTuple whose field defaults are the keys' defaults
    keys: tuple[Key, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)

    def key(self, name: str) -> Key:
        return next(k for k in self.keys if k.name == name)

    def default(self, key: Key) -> Any:
        """The default of `key`, as a value of the file (None: unset, or no default to show)."""
        if key.default is not None:
            return key.default()
        defaults = getattr(self.target, "_field_defaults", {})
        return defaults.get(key.fields[0])


def read_section(ctx: Nodes, node: "yaml.Node", prefix: str, section: Section,
                 only: tuple[str, ...] | None = None) -> "tuple[dict[str, Any], dict[str, yaml.Node]]":
    """The values of the keys given, by field (keys left out are left out: the target's defaults apply), and
    the nodes by key. `only`: the keys allowed here (the others are unknown keys, errors as such)."""
    m = mapping(ctx, node, prefix, section.names if only is None else only)
    for key in section.keys:
        if key.required and key.name not in m and (only is None or key.name in only):
            raise ctx.fail(node, prefix or key.name, key.required)
    values: dict[str, Any] = {}
    for key in section.keys:
        if key.name not in m:
            continue
        where = f"{prefix}.{key.name}" if prefix else key.name
        value = key.kind.read(ctx, m[key.name], where, m)
        bad = key.check(value) if key.check else None
        if bad:
            raise ctx.fail(m[key.name], where, bad)
        if key.field == "*":  # a mapping whose keys set the section's own fields (a probe set's filters)
            values.update(value)
            continue
        value = key.convert(value) if key.convert else value
        values.update(zip(key.fields, value if len(key.fields) > 1 else (value,), strict=True))
    return values, m


# ---- kinds ------------------------------------------------------------------------------------------------


def simple(read: Callable[[Nodes, "yaml.Node", str], Any], what: str, schema: Mapping[str, Any],
           parse: Callable[[str], Any] | None = str, choices: tuple[str, ...] | None = None) -> Kind:
    return Kind(lambda ctx, node, key, _m: read(ctx, node, key), what, schema, parse=parse, choices=choices)


BOOL = simple(boolean, "bool", {"type": "boolean"}, parse=None)
STR = simple(string, "string", {"type": "string"})
OPT_STR = simple(opt_string, "string", {"type": ["string", "null"]})
STRS = simple(lambda ctx, node, key: items(ctx, node, key, lambda n, k: string(ctx, n, k), "a list of strings"),
              "list of strings", {"type": ["array", "string", "null"], "items": {"type": "string"}})


def choices(names: tuple[str, ...]) -> Kind:
    return simple(lambda ctx, node, key: choice(ctx, node, key, names), " \\| ".join(names), {"enum": list(names)},
                  choices=names)


def number_text(text: str, lo: float, hi: float | None, word: str) -> float:
    """A flag's number within [lo, hi], as the file's `number` reads it (NaN and infinity refused)."""
    try:
        value = float(text)
    except ValueError:
        raise NumberError(f"expected a number of {word}, got {shown(text)}") from None
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        bound = f"from {lo:g} to {hi:.15g}" if hi is not None else f"of at least {lo:g}"
        raise NumberError(f"expected a number of {word} {bound}, got {shown(text)}")
    return value


def num(lo: float, hi: float | None = None, unit: str = "", word: str = "") -> Kind:
    """`unit`: the docs' " (s)"; `word`: how a flag's error names it ("seconds", the unit's word by default)."""
    bounds = f"{lo:g} to {hi:g}" if hi is not None else f"at least {lo:g}"
    schema: dict[str, Any] = {"type": "number", "minimum": lo}
    if hi is not None:
        schema["maximum"] = hi
    word = word or {" (s)": "seconds", " (ms)": "milliseconds"}.get(unit, "a number")
    return simple(lambda ctx, node, key: number(ctx, node, key, lo, hi), f"number{unit}, {bounds}", schema,
                  parse=lambda text: number_text(text, lo, hi, word))


def integer_in(rng: IntRange, prefixes: bool = True) -> Kind:
    """`prefixes`: a flag takes 0x/0o/0b too (retsnoop's -C values do)."""
    return simple(lambda ctx, node, key: integer(ctx, node, key, rng), f"integer, {rng.lo} to {rng.hi}",
                  {"type": "integer", "minimum": rng.lo, "maximum": rng.hi},
                  parse=lambda text: parse_int(text, rng, prefixes=prefixes))


def size_in(rng: IntRange) -> Kind:
    return simple(lambda ctx, node, key: size(ctx, node, key, rng), f"bytes (K/M/G suffixes), {rng.lo} to {rng.hi}",
                  {"anyOf": [{"type": "integer", "minimum": rng.lo, "maximum": rng.hi}, {"type": "string"}]},
                  parse=lambda text: parse_size(text, rng))


def nested(section: Section, read: Reader, what: str = "mapping", null: bool = False) -> Kind:
    """A mapping of declared keys, read by `read` (usually read_section and a check across its keys)."""
    return Kind(read, what, {"type": ["object", "null"] if null else "object"}, section)


def into(section: Section) -> Kind:
    """A mapping of declared keys that makes the section's target, the keys left out at its defaults."""
    assert section.target is not None
    return nested(section, lambda ctx, node, key, _m: section.target(**read_section(ctx, node, key, section)[0]))


def walk(section: Section, prefix: str = "") -> Iterator[tuple[str, Section, Key]]:
    """Every key of a section and of the sections nested in it, with its dotted name."""
    for key in section.keys:
        yield f"{prefix}{key.name}", section, key
        if key.kind.section is not None:
            yield from walk(key.kind.section, f"{prefix}{key.name}.")


# ---- the reference table ----------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple) and not value:
        return "[]"
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a section's NamedTuple at its defaults
        return "{}" if value == type(value)() else ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def table_rows(section: Section, prefix: str = "") -> list[str]:
    """`| key | type | default | trace flag | meaning |` rows of a section and its nested ones."""
    rows = []
    for name, sect, key in walk(section, prefix):
        default = "required" if key.required else _shown(sect.default(key))
        cells = (f"`{name}`", key.kind.what, f"`{default}`" if default else "",
                 ", ".join(f"`{f.shown}`" for f in ((key.flag,) if isinstance(key.flag, Flag) else key.flag))
                 if key.flag else "", key.doc)
        rows.append("| " + " | ".join(c.replace("|", "\\|") if i != 1 else c for i, c in enumerate(cells)) + " |")
    return rows

"""Reading a YAML node tree so that every error names file, line and key.

yaml.compose keeps each node's position; values are checked here rather than after
yaml.safe_load, which would lose the line numbers people need to fix a file on a host.
Unknown keys are errors (a typo would otherwise silently fall back to a default).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from retsnoop_otel.inputs.files import plain, shown
from retsnoop_otel.inputs.keys import unknown_key
from retsnoop_otel.inputs.numbers import IntRange, NumberError, parse_size


class _PyYaml:
    """PyYAML, imported at its first use: `trace` builds its flags from the keys declared with these readers and
    reads no YAML (the import is 40 ms of its start, tests/unit/test_startup.py)."""

    def __getattr__(self, name: str) -> Any:
        import yaml as module
        return getattr(module, name)


if TYPE_CHECKING:
    import yaml
else:
    yaml = _PyYaml()


class ConfigError(ValueError):
    """One problem in the config file: `file:line: key: what is wrong` plus what to do."""


_TYPE_NAMES = {"int": "int", "float": "float", "bool": "bool", "null": "null", "str": "string",
               "seq": "list", "map": "mapping"}


class Nodes:
    """One file's nodes: values are constructed on demand, errors carry the file name and line."""

    def __init__(self, filename: str) -> None:
        self.filename = plain(filename)  # it leads every message: one line whatever the file is called
        self._loader = yaml.SafeLoader("")
        # what each '@FILE' the config names held, by its reader (runtime/config_sections.py): each file is read
        # once per load of the config, however many keys name it
        self.files: dict[tuple[str, str], Any] = {}

    def fail(self, node: yaml.Node, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.filename}:{node.start_mark.line + 1}: {plain(key) or 'the top level'}: {msg}")

    def value(self, node: yaml.Node, key: str = "") -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # an unknown tag (`!foo`), a bad timestamp or binary...
            why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{self.filename}:{node.start_mark.line + 1}: not valid YAML here: "
                              f"{' '.join(str(why).split())}") from None
        except ValueError:  # an integer of more than 4300 digits, which Python refuses to convert
            where = f"{key}: " if key else "not valid YAML here: "
            raise ConfigError(f"{self.filename}:{node.start_mark.line + 1}: {where}"
                              f"{shown(getattr(node, 'value', ''))} is too long a number for any setting") from None


MAX_NODES = 100_000  # what a config may expand to, aliases counted each time they are used


def expansion_bounded(ctx: Nodes, root: yaml.Node, limit: int = MAX_NODES) -> None:
    """Refuse a node graph that expands to more than `limit` nodes. yaml.compose keeps an alias as a second
    reference to its anchor's node, so a few hundred bytes of nested aliases (a "billion laughs") stand for
    more nodes than memory holds, and every reader below walks them all: each node is counted every time it
    is reached, through each alias, and the walk stops at the limit (a recursive alias too)."""
    seen = 0
    stack = [root]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > limit:
            raise ConfigError(f"{ctx.filename}: the config expands to more than {limit:,} YAML nodes (an alias "
                              "counts each time it is used), the limit; put long glob lists in an '@FILE' glob file "
                              "and do not nest aliases")
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append(k)
                stack.append(v)


def kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return _TYPE_NAMES.get(node.tag.rsplit(":", 1)[-1], node.tag.rsplit(":", 1)[-1])


def got(ctx: Nodes, node: yaml.Node) -> str:
    what = kind(node)
    if isinstance(node, yaml.ScalarNode) and what != "null":
        value = ctx.value(node)
        if isinstance(value, str):
            return f"{what} {shown(value)}"
        # as written for integers: Python cannot print one of more than 4300 digits (and 0x... stays 0x...)
        return f"{what} {shown(node.value if what == 'int' else repr(value), quote=False)}"
    return what


def mapping(ctx: Nodes, node: yaml.Node, key: str, known: tuple[str, ...]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, key, f"expected a mapping, got {got(ctx, node)}")
    out: dict[str, yaml.Node] = {}
    for knode, vnode in node.value:
        name = ctx.value(knode)
        where = f"{key}.{name}" if key else str(name)
        if not isinstance(name, str):
            raise ctx.fail(knode, where, f"keys must be strings, got {got(ctx, knode)}")
        if name not in known:
            raise ctx.fail(knode, where, unknown_key(name, known))
        if name in out:
            raise ctx.fail(knode, where, "duplicate key (the first one would be silently overridden)")
        out[name] = vnode
    return out


def scalar(ctx: Nodes, node: yaml.Node, key: str, types: tuple[type, ...], what: str) -> Any:
    value = ctx.value(node, key) if isinstance(node, yaml.ScalarNode) else None
    ok = isinstance(node, yaml.ScalarNode) and isinstance(value, types) and not (
        isinstance(value, bool) and bool not in types)
    if not ok:
        raise ctx.fail(node, key, f"expected {what}, got {got(ctx, node)}")
    return value


def string(ctx: Nodes, node: yaml.Node, key: str) -> str:
    return scalar(ctx, node, key, (str,), "a string")


def opt_string(ctx: Nodes, node: yaml.Node | None, key: str) -> str | None:
    if node is None or kind(node) == "null":
        return None
    return string(ctx, node, key)


def boolean(ctx: Nodes, node: yaml.Node, key: str) -> bool:
    return scalar(ctx, node, key, (bool,), "true or false")


def number(ctx: Nodes, node: yaml.Node, key: str, lo: float, hi: float | None = None) -> float:
    """A finite number within [lo, hi]: .nan and .inf are refused here (NaN would pass every comparison)."""
    raw = scalar(ctx, node, key, (int, float), "a number")
    try:
        value = float(raw)
    except OverflowError:  # an integer past what a float can hold
        value = math.inf if raw > 0 else -math.inf
    if not math.isfinite(value):
        raise ctx.fail(node, key, f"expected a finite number, got {got(ctx, node)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo:g} and {hi:g}" if hi is not None else f"at least {lo:g}"
        raise ctx.fail(node, key, f"must be {bound}, got {value:g}")
    return value


def integer(ctx: Nodes, node: yaml.Node, key: str, rng: IntRange) -> int:
    """An integer within the range of where it ends up (a pid_t, a BPF map's max_entries, a count)."""
    value = scalar(ctx, node, key, (int,), f"an integer {rng.describe()}")
    bad = rng.problem(value, node.value)
    if bad:
        raise ctx.fail(node, key, bad)
    return value


def size(ctx: Nodes, node: yaml.Node, key: str, rng: IntRange) -> int:
    """Bytes as an integer or with a K/M/G suffix ('8M', '16MiB'), within `rng` (inputs.numbers.parse_size)."""
    value = ctx.value(node, key) if isinstance(node, yaml.ScalarNode) else None
    if isinstance(value, int) and not isinstance(value, bool):
        bad = rng.problem(value, node.value)
        if bad:
            raise ctx.fail(node, key, bad.replace("an integer", "a size in bytes", 1))
        return value
    if not isinstance(value, str):
        raise ctx.fail(node, key, f"expected a size in bytes such as 8388608 or '8M', got {got(ctx, node)}")
    try:
        return parse_size(value, rng)
    except NumberError as exc:
        raise ctx.fail(node, key, str(exc)) from None


def choice(ctx: Nodes, node: yaml.Node, key: str, choices: tuple[str, ...]) -> str:
    value = ctx.value(node) if isinstance(node, yaml.ScalarNode) else None
    if not isinstance(value, str) or value not in choices:
        raise ctx.fail(node, key, f"expected one of {', '.join(choices)}, got {got(ctx, node)}")
    return value


def items(ctx: Nodes, node: yaml.Node, key: str, item: Callable[[yaml.Node, str], Any], what: str) -> tuple:
    """A list (a single scalar is accepted as a one-item list)."""
    if isinstance(node, yaml.ScalarNode) and kind(node) == "null":
        return ()
    if isinstance(node, yaml.ScalarNode) and kind(node) == "string":
        return (item(node, key),)
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, key, f"expected {what}, got {got(ctx, node)}")
    return tuple(item(n, f"{key}[{i}]") for i, n in enumerate(node.value))

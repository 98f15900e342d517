"""The agent file as a JSON Schema (draft 2020-12), made from the keys' declarations (config_keys): editors
complete and check agent.yaml with it (shipped as config/agent.schema.json; the yaml-language-server line
`# yaml-language-server: $schema=agent.schema.json` points an editor at it).

It checks what a schema can: the keys, their types, ranges and choices. What needs the machine (a vmlinux that
exists, globs that parse, a directory for the OTLP file) stays with `agent --check`.
"""

from __future__ import annotations

import json
from typing import Any

from retsnoop_otel.runtime.config_keys import Key, Section
from retsnoop_otel.runtime.config_sections import TOP


def _json(value: Any) -> Any:
    """A default as JSON, or None when it has no JSON form (a section's NamedTuple, an unset value)."""
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return list(value)
    return value if isinstance(value, (bool, int, float, str)) else None


def _object(section: Section, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    keys = [k for k in section.keys if k.name not in skip]
    out: dict[str, Any] = {"type": "object", "additionalProperties": False,
                           "properties": {k.name: _value(section, k) for k in keys}}
    required = [k.name for k in keys if k.required]
    if required:
        out["required"] = required
    if {"entry", "syscalls"} <= {k.name for k in keys}:  # a probe set: its entry globs, the syscall preset or both
        out["anyOf"] = [{"required": ["entry"]},
                        {"required": ["syscalls"], "properties": {"syscalls": {"const": True}}}]
    return out


def _value(section: Section, key: Key) -> dict[str, Any]:
    out = dict(key.kind.schema)
    nested = key.kind.section
    if nested is not None and "array" in out["type"]:  # a list of the nested sections, or a mapping of them by name
        first = nested.keys[0].name
        out.update(items=_object(nested), minItems=1, additionalProperties=_object(nested, skip=(first,)),
                   minProperties=1)
    elif nested is not None:
        out.update({k: v for k, v in _object(nested).items() if k != "type"})
    out["description"] = key.doc
    default = _json(section.default(key))
    if default is not None and not key.required:
        out["default"] = default
    return out


def schema() -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "retsnoop-otel agent configuration",
            **_object(TOP)}


def schema_text() -> str:
    """config/agent.schema.json as shipped."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"

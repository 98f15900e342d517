"""The agent's YAML configuration: the capture runtime's config, read so that every error names
file, line and key (see yaml_nodes), plus the agent's own logging settings.

Every key is declared once, in runtime/config_sections.py (a Key of its Section): its reader, range or choices,
doc line and trace flag; its default is its target's field default (runtime/config.py). This reads a file by
those declarations.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import yaml  # at the agent's import, not in its inputs phase: it always reads its config

from retsnoop_otel.inputs.files import MAX_CONFIG_BYTES, read_text
from retsnoop_otel.kernel.kcache import AGENT_CACHE_DIR
from retsnoop_otel.runtime.config import ExporterConfig, RuntimeConfig, SymbolsConfig
from retsnoop_otel.runtime.config_keys import read_section
from retsnoop_otel.runtime.config_sections import TOP, LoggingConfig
from retsnoop_otel.runtime.yaml_nodes import ConfigError, Nodes, expansion_bounded

__all__ = ["AgentConfig", "ConfigError", "LoggingConfig", "load_config", "parse_config"]


class AgentConfig(NamedTuple):
    """The runtime's configuration as the agent's file gives it, plus what only the agent has."""

    runtime: RuntimeConfig
    path: str = ""
    logging: LoggingConfig = LoggingConfig()
    lines: Mapping[str, int] = MappingProxyType({})  # line of each key, dotted as errors name them

    def where(self, message: str) -> str:
        """A message that starts with one of the file's keys (the runtime's errors name them), with that key's
        file and line in front, as the file's own errors have them."""
        key = max((k for k in self.lines if message.startswith(k) and message[len(k):len(k) + 1] in (":", "=")),
                  key=len, default=None)
        return message if key is None else f"{os.path.basename(self.path)}:{self.lines[key]}: {message}"


def _key_lines(ctx: Nodes, node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Where each key of the file's sections is (the probe sets' keys carry their own lines in their errors)."""
    out: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            name = f"{prefix}{ctx.value(k)}"
            if name == "probe_sets":
                continue
            out[name] = k.start_mark.line + 1
            out.update(_key_lines(ctx, v, f"{name}."))
    return out


def parse_config(text: str, filename: str = "<config>") -> AgentConfig:
    """Validate a whole config; raises ConfigError at the first problem."""
    ctx = Nodes(os.path.basename(filename))
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{ctx.filename}:{mark.line + 1}" if mark is not None else ctx.filename
        why = getattr(exc, "problem", None) or getattr(exc, "reason", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {' '.join(str(why).split())}") from None
    except RecursionError:
        raise ConfigError(f"{ctx.filename}: not valid YAML: nested too deeply") from None
    if root is None:
        raise ConfigError(f"{ctx.filename}:1: the file is empty; it needs at least a 'probe_sets:' section")
    expansion_bounded(ctx, root)
    values, m = read_section(ctx, root, "", TOP)
    exporter = values.get("exporter", ExporterConfig())
    if exporter.otlp is None and exporter.file is None and exporter.console is None and any(
            ps.mode != "metrics" for ps in values["probe_sets"]):
        raise ctx.fail(m["exporter"], "exporter", "no exporter left for the probe sets that make traces: set otlp, "
                       "file or console: true, or give every probe set mode: metrics")
    runtime = RuntimeConfig(**{k: v for k, v in values.items() if k in RuntimeConfig._fields},
                            symbols=SymbolsConfig(vmlinux=values.get("vmlinux"), cache_dir=AGENT_CACHE_DIR))
    return AgentConfig(runtime, path=filename, logging=values.get("logging", LoggingConfig()),
                       lines=MappingProxyType(_key_lines(ctx, root)))


def load_config(path: str | Path, name: str = "config file") -> AgentConfig:
    """`name`: what the file is called in messages ('--config file', '--check file')."""
    text = read_text(path, name, MAX_CONFIG_BYTES, ConfigError)
    return parse_config(text, str(path))

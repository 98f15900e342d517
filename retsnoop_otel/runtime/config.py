"""The agent's YAML configuration: parsed from the node tree so every error names file, line and key.

yaml.compose keeps each node's position; values are checked against a small schema here rather
than after yaml.safe_load, which would lose the line numbers people need to fix a file on a host.
Unknown keys are errors (a typo would otherwise silently fall back to a default).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.symbols.discovery import DiscoveryError, expand_glob_args, parse_glob

PROBE_MODES = ("stack", "calls", "metrics")
ATTACH_MODES = ("auto", "fentry", "kprobe", "kprobe_multi")
PROTOCOLS = ("grpc", "http/protobuf")
COMPRESSIONS = ("gzip", "deflate", "none")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LISTEN = "0.0.0.0:9464"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?)?\s*$", re.I)


class ConfigError(ValueError):
    """One problem in the config file: `file:line: key: what is wrong` plus what to do."""


@dataclass(frozen=True)
class Sampling:
    """Error sessions are always kept; successful ones by probability or by rate per entry function."""

    success_probability: float = 0.0
    success_rate_per_s: float | None = None

    @property
    def captures_success(self) -> bool:
        return self.success_probability > 0 or bool(self.success_rate_per_s)


@dataclass(frozen=True)
class ProbeSetConfig:
    name: str
    entry: tuple[str, ...]
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    mode: str = "stack"  # stack: the error chain only; calls: a span for every traced call; metrics: no traces
    attach_mode: str = "auto"
    pids: tuple[int, ...] = ()
    no_pids: tuple[int, ...] = ()
    comms: tuple[str, ...] = ()
    no_comms: tuple[str, ...] = ()
    cgroup: str | None = None
    min_duration_ms: float = 0.0
    errors: ErrorFilter = field(default_factory=ErrorFilter)
    sampling: Sampling = field(default_factory=Sampling)
    lbr_branch_types: int = 0  # `lbr: SPEC`: perf branch types snapshotted at the deepest failing return


@dataclass(frozen=True)
class OtlpConfig:
    """None means: let the SDK read the matching OTEL_EXPORTER_OTLP_* variable."""

    endpoint: str | None = None
    protocol: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    compression: str | None = None
    timeout_s: float | None = None
    insecure: bool | None = None
    certificate: str | None = None


@dataclass(frozen=True)
class ExporterConfig:
    otlp: OtlpConfig | None = field(default_factory=OtlpConfig)
    file: str | None = None  # OTLP-JSON lines, one export request per line
    console: bool = False  # retsnoop-style text on stdout
    export_addresses: bool = False


@dataclass(frozen=True)
class MetricsConfig:
    host: str = "0.0.0.0"
    port: int = 9464
    stall_after_s: float = 30.0  # /healthz answers 503 when the capture loop has not polled for this long
    otlp: OtlpConfig | None = None  # also push the metrics over OTLP (for users without Prometheus)
    otlp_interval_s: float = 60.0
    max_error_types: int = 0  # per function; 0 = every error type gets its own series
    functions: tuple[str, ...] = ()  # globs of functions with their own series; () = all

    @property
    def listen(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Limits:
    max_spans_per_trace: int = 4096
    export_queue_spans: int = 65536
    ringbuf_size: int = 8 << 20
    max_sessions: int = 4096


@dataclass(frozen=True)
class LoggingConfig:
    format: str = "text"
    level: str = "info"


@dataclass(frozen=True)
class AgentConfig:
    path: str
    probe_sets: tuple[ProbeSetConfig, ...]
    exporter: ExporterConfig = field(default_factory=ExporterConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: Limits = field(default_factory=Limits)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    vmlinux: str | None = None  # None: kallsyms names only; "auto": standard paths; else a path


# ---- node helpers --------------------------------------------------------------------------------

_TYPE_NAMES = {"int": "int", "float": "float", "bool": "bool", "null": "null", "str": "string",
               "seq": "list", "map": "mapping"}


class _Ctx:
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self._loader = yaml.SafeLoader("")

    def fail(self, node: yaml.Node, key: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.filename}:{node.start_mark.line + 1}: {key}: {msg}")

    def value(self, node: yaml.Node) -> Any:
        return self._loader.construct_object(node, deep=True)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return _TYPE_NAMES.get(node.tag.rsplit(":", 1)[-1], node.tag.rsplit(":", 1)[-1])


def _got(ctx: _Ctx, node: yaml.Node) -> str:
    kind = _kind(node)
    if isinstance(node, yaml.ScalarNode) and kind != "null":
        return f"{kind} {ctx.value(node)!r}"
    return kind


def _mapping(ctx: _Ctx, node: yaml.Node, key: str, known: tuple[str, ...]) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, key, f"expected a mapping, got {_got(ctx, node)}")
    out: dict[str, yaml.Node] = {}
    for knode, vnode in node.value:
        name = ctx.value(knode)
        where = f"{key}.{name}" if key else str(name)
        if not isinstance(name, str):
            raise ctx.fail(knode, where, f"keys must be strings, got {_got(ctx, knode)}")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
            raise ctx.fail(knode, where, f"unknown key; {hint}")
        if name in out:
            raise ctx.fail(knode, where, "duplicate key (the first one would be silently overridden)")
        out[name] = vnode
    return out


def _scalar(ctx: _Ctx, node: yaml.Node, key: str, types: tuple[type, ...], what: str) -> Any:
    value = ctx.value(node) if isinstance(node, yaml.ScalarNode) else None
    ok = isinstance(node, yaml.ScalarNode) and isinstance(value, types) and not (
        isinstance(value, bool) and bool not in types)
    if not ok:
        raise ctx.fail(node, key, f"expected {what}, got {_got(ctx, node)}")
    return value


def _str(ctx: _Ctx, node: yaml.Node, key: str) -> str:
    return _scalar(ctx, node, key, (str,), "a string")


def _opt_str(ctx: _Ctx, node: yaml.Node | None, key: str) -> str | None:
    if node is None or _kind(node) == "null":
        return None
    return _str(ctx, node, key)


def _bool(ctx: _Ctx, node: yaml.Node, key: str) -> bool:
    return _scalar(ctx, node, key, (bool,), "true or false")


def _number(ctx: _Ctx, node: yaml.Node, key: str, lo: float, hi: float | None = None) -> float:
    value = float(_scalar(ctx, node, key, (int, float), "a number"))
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo:g} and {hi:g}" if hi is not None else f"at least {lo:g}"
        raise ctx.fail(node, key, f"must be {bound}, got {value:g}")
    return value


def _pos_int(ctx: _Ctx, node: yaml.Node, key: str) -> int:
    value = _scalar(ctx, node, key, (int,), "a positive integer")
    if value <= 0:
        raise ctx.fail(node, key, f"must be a positive integer, got {value}")
    return value


def _size(ctx: _Ctx, node: yaml.Node, key: str) -> int:
    """Bytes as an integer or with a K/M/G suffix ('8M', '16MiB')."""
    value = ctx.value(node) if isinstance(node, yaml.ScalarNode) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if not m or int(m.group(1)) <= 0:
        raise ctx.fail(node, key, f"expected a size in bytes such as 8388608 or '8M', got {_got(ctx, node)}")
    shift = {"": 0, "k": 10, "m": 20, "g": 30}[(m.group(2) or "")[:1].lower()]
    return int(m.group(1)) << shift


def _choice(ctx: _Ctx, node: yaml.Node, key: str, choices: tuple[str, ...]) -> str:
    value = ctx.value(node) if isinstance(node, yaml.ScalarNode) else None
    if not isinstance(value, str) or value not in choices:
        raise ctx.fail(node, key, f"expected one of {', '.join(choices)}, got {_got(ctx, node)}")
    return value


def _list(ctx: _Ctx, node: yaml.Node, key: str, item: Callable[[yaml.Node, str], Any], what: str) -> tuple:
    """A list (a single scalar is accepted as a one-item list)."""
    if isinstance(node, yaml.ScalarNode) and _kind(node) == "null":
        return ()
    if isinstance(node, yaml.ScalarNode) and _kind(node) == "string":
        return (item(node, key),)
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, key, f"expected {what}, got {_got(ctx, node)}")
    return tuple(item(n, f"{key}[{i}]") for i, n in enumerate(node.value))


# ---- sections ------------------------------------------------------------------------------------


def _globs(ctx: _Ctx, node: yaml.Node, key: str) -> tuple[str, ...]:
    def one(n: yaml.Node, k: str) -> str:
        text = _scalar(ctx, n, k, (str,), "a glob string")
        try:
            for g in expand_glob_args([text]):  # '@file' globs: the file must exist and parse too
                parse_glob(g)
        except DiscoveryError as exc:
            raise ctx.fail(n, k, f"{exc}") from None
        return text

    if isinstance(node, yaml.ScalarNode) and _kind(node) not in ("string", "null"):
        raise ctx.fail(node, key, f"expected a list of globs, got {_got(ctx, node)}")
    return _list(ctx, node, key, one, "a list of globs")


def _pids(ctx: _Ctx, node: yaml.Node, key: str) -> tuple[int, ...]:
    if isinstance(node, yaml.ScalarNode) and _kind(node) == "int":
        return (_pos_int(ctx, node, key),)
    return _list(ctx, node, key, lambda n, k: _pos_int(ctx, n, k), "a list of process ids")


def _strs(ctx: _Ctx, node: yaml.Node, key: str) -> tuple[str, ...]:
    return _list(ctx, node, key, lambda n, k: _str(ctx, n, k), "a list of strings")


def _sampling(ctx: _Ctx, node: yaml.Node, key: str) -> Sampling:
    m = _mapping(ctx, node, key, ("errors", "success_probability", "success_rate_per_s"))
    if "errors" in m and _number(ctx, m["errors"], f"{key}.errors", 0, 1) != 1.0:
        raise ctx.fail(m["errors"], f"{key}.errors", "error sessions are always kept: use 1.0 or leave it out")
    if "success_probability" in m and "success_rate_per_s" in m:
        raise ctx.fail(m["success_rate_per_s"], f"{key}.success_rate_per_s",
                       "give either success_probability or success_rate_per_s, not both")
    prob = _number(ctx, m["success_probability"], f"{key}.success_probability", 0, 1) \
        if "success_probability" in m else 0.0
    rate = _number(ctx, m["success_rate_per_s"], f"{key}.success_rate_per_s", 0) \
        if "success_rate_per_s" in m else None
    return Sampling(prob, rate or None)


_FILTER_KEYS = ("pids", "no_pids", "comms", "no_comms", "cgroup", "min_duration_ms", "allow_errors", "deny_errors")
_SET_KEYS = ("name", "entry", "allow", "deny", "mode", "attach_mode", "filters", "sampling", "lbr")


def _lbr(ctx: _Ctx, node: yaml.Node, key: str, mode: str) -> int:
    """`lbr: true` (any_return), or the --lbr specs as a string ('any_return', 'any,cond', '0x20')."""
    from retsnoop_otel.render.lbr import LbrError, parse_specs
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, key, f"expected true, false or branch types such as 'any_return', got {_got(ctx, node)}")
    value = ctx.value(node)
    if value is False or value is None:
        return 0
    if mode == "metrics":
        raise ctx.fail(node, key, "branch records travel with reported sessions: use mode stack or calls, "
                       "or drop 'lbr'")
    if value is True:
        return parse_specs([])
    if not isinstance(value, str):
        raise ctx.fail(node, key, f"expected true, false or branch types such as 'any_return', got {_got(ctx, node)}")
    try:
        return parse_specs([value])
    except LbrError as exc:
        raise ctx.fail(node, key, str(exc).replace("--lbr value", "branch type")) from None


def _probe_set(ctx: _Ctx, node: yaml.Node, key: str, name: str | None) -> ProbeSetConfig:
    m = _mapping(ctx, node, key, _SET_KEYS if name is None else _SET_KEYS[1:])
    if name is None:
        if "name" not in m:
            raise ctx.fail(node, key, "missing 'name' (each probe set needs a unique name, used as the "
                           "probe_set metric label)")
        name = _str(ctx, m["name"], f"{key}.name")
        name_node = m["name"]
    else:
        name_node = node
    if not _NAME.match(name):
        raise ctx.fail(name_node, f"{key}.name", f"'{name}' is not a valid name: use 1-64 letters, digits, '_', "
                       "'-' or '.'")
    if "entry" not in m:
        raise ctx.fail(node, key, "missing 'entry': a list of entry function globs (for example ['*sys_bpf'])")
    entry = _globs(ctx, m["entry"], f"{key}.entry")
    if not entry:
        raise ctx.fail(m["entry"], f"{key}.entry", "needs at least one entry function glob")
    f = _mapping(ctx, m["filters"], f"{key}.filters", _FILTER_KEYS) if "filters" in m else {}
    fk = f"{key}.filters"
    try:
        errors = ErrorFilter.parse(_strs(ctx, f["allow_errors"], f"{fk}.allow_errors") if "allow_errors" in f else (),
                                   _strs(ctx, f["deny_errors"], f"{fk}.deny_errors") if "deny_errors" in f else ())
    except ValueError as exc:
        bad = f.get("allow_errors") or f["deny_errors"]
        msg = str(exc).split(": ", 1)[-1]
        raise ctx.fail(bad, f"{fk}.allow_errors" if bad is f.get("allow_errors") else f"{fk}.deny_errors",
                       f"{msg} (use errno names such as EINVAL, -ENOMEM, NULL or any)") from None
    return ProbeSetConfig(
        name=name, entry=entry,
        allow=_globs(ctx, m["allow"], f"{key}.allow") if "allow" in m else (),
        deny=_globs(ctx, m["deny"], f"{key}.deny") if "deny" in m else (),
        mode=_choice(ctx, m["mode"], f"{key}.mode", PROBE_MODES) if "mode" in m else "stack",
        attach_mode=_choice(ctx, m["attach_mode"], f"{key}.attach_mode", ATTACH_MODES) if "attach_mode" in m
        else "auto",
        pids=_pids(ctx, f["pids"], f"{fk}.pids") if "pids" in f else (),
        no_pids=_pids(ctx, f["no_pids"], f"{fk}.no_pids") if "no_pids" in f else (),
        comms=_strs(ctx, f["comms"], f"{fk}.comms") if "comms" in f else (),
        no_comms=_strs(ctx, f["no_comms"], f"{fk}.no_comms") if "no_comms" in f else (),
        cgroup=_opt_str(ctx, f.get("cgroup"), f"{fk}.cgroup"),
        min_duration_ms=_number(ctx, f["min_duration_ms"], f"{fk}.min_duration_ms", 0) if "min_duration_ms" in f
        else 0.0,
        errors=errors,
        sampling=_sampling(ctx, m["sampling"], f"{key}.sampling") if "sampling" in m else Sampling(),
        lbr_branch_types=_lbr(ctx, m["lbr"], f"{key}.lbr", ctx.value(m["mode"]) if "mode" in m else "stack")
        if "lbr" in m else 0)


def _probe_sets(ctx: _Ctx, node: yaml.Node) -> tuple[ProbeSetConfig, ...]:
    if isinstance(node, yaml.SequenceNode):
        sets = [_probe_set(ctx, n, f"probe_sets[{i}]", None) for i, n in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        sets = []
        for knode, vnode in node.value:
            name = ctx.value(knode)
            if not isinstance(name, str):
                raise ctx.fail(knode, "probe_sets", f"probe set names must be strings, got {_got(ctx, knode)}")
            sets.append(_probe_set(ctx, vnode, f"probe_sets.{name}", name))
    else:
        raise ctx.fail(node, "probe_sets", f"expected a list (or mapping) of probe sets, got {_got(ctx, node)}")
    if not sets:
        raise ctx.fail(node, "probe_sets", "needs at least one probe set")
    seen: set[str] = set()
    for i, ps in enumerate(sets):
        if ps.name in seen:
            item = node.value[i] if isinstance(node, yaml.SequenceNode) else node.value[i][0]
            raise ctx.fail(item, "probe_sets", f"probe set name '{ps.name}' is used twice; names must be unique")
        seen.add(ps.name)
    return tuple(sets)


def check_endpoint(endpoint: str) -> str | None:
    """Why an OTLP endpoint URL is unusable, or None."""
    try:
        parsed = urlparse(endpoint)
        port = parsed.port
    except ValueError as exc:
        return f"'{endpoint}' is not a valid URL ({exc})"
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"'{endpoint}' must look like http://HOST:PORT (plaintext) or https://HOST:PORT (TLS)"
    if port == 0:
        return f"'{endpoint}': port 0 is not a usable port"
    return None


def _otlp(ctx: _Ctx, node: yaml.Node, key: str) -> OtlpConfig:
    m = _mapping(ctx, node, key, ("endpoint", "protocol", "headers", "compression", "timeout", "insecure",
                                  "certificate"))
    endpoint = _opt_str(ctx, m.get("endpoint"), f"{key}.endpoint")
    if endpoint is not None and (why := check_endpoint(endpoint)):
        raise ctx.fail(m["endpoint"], f"{key}.endpoint", why)
    headers: list[tuple[str, str]] = []
    if "headers" in m:
        hm = _mapping_any(ctx, m["headers"], f"{key}.headers")
        headers = [(k, str(_scalar(ctx, v, f"{key}.headers.{k}", (str, int, float), "a string")))
                   for k, v in hm.items()]
    cert = _opt_str(ctx, m.get("certificate"), f"{key}.certificate")
    if cert is not None and not os.path.isfile(cert):
        raise ctx.fail(m["certificate"], f"{key}.certificate", f"{cert}: no such file (give the CA certificate in "
                       "PEM format that signs the collector's TLS certificate)")
    comp = _choice(ctx, m["compression"], f"{key}.compression", COMPRESSIONS) if "compression" in m else None
    return OtlpConfig(
        endpoint=endpoint,
        protocol=_choice(ctx, m["protocol"], f"{key}.protocol", PROTOCOLS) if "protocol" in m else None,
        headers=tuple(headers), compression=comp,
        timeout_s=_number(ctx, m["timeout"], f"{key}.timeout", 0.001) if "timeout" in m else None,
        insecure=_bool(ctx, m["insecure"], f"{key}.insecure") if "insecure" in m else None,
        certificate=cert)


def _mapping_any(ctx: _Ctx, node: yaml.Node, key: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, key, f"expected a mapping, got {_got(ctx, node)}")
    return {str(ctx.value(k)): v for k, v in node.value}


def _exporter(ctx: _Ctx, node: yaml.Node) -> ExporterConfig:
    m = _mapping(ctx, node, "exporter", ("otlp", "file", "console", "export_addresses"))
    otlp = None
    if "otlp" in m:
        otlp = None if _kind(m["otlp"]) == "null" else _otlp(ctx, m["otlp"], "exporter.otlp")
    elif "file" not in m and "console" not in m:
        otlp = OtlpConfig()
    path = _opt_str(ctx, m.get("file"), "exporter.file")
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ctx.fail(m["file"], "exporter.file", f"the directory of {path} does not exist")
    console = _bool(ctx, m["console"], "exporter.console") if "console" in m else False
    return ExporterConfig(otlp=otlp, file=path, console=console,
                          export_addresses=_bool(ctx, m["export_addresses"], "exporter.export_addresses")
                          if "export_addresses" in m else False)


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); raises ValueError with the expected form."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\s\[\]]*):(\d+)", text.strip())
    if not m:
        raise ValueError(f"'{text}' is not HOST:PORT (for example 0.0.0.0:9464 or [::]:9464)")
    host = m.group(1) if m.group(1) is not None else (m.group(3) or "0.0.0.0")
    port = int(m.group(2) or m.group(4))
    if port > 65535:
        raise ValueError(f"port {port} in '{text}' is not a TCP port (0..65535)")
    return host, port


def _metrics(ctx: _Ctx, node: yaml.Node) -> MetricsConfig:
    m = _mapping(ctx, node, "metrics", ("listen", "stall_after_s", "otlp", "otlp_interval", "max_error_types",
                                        "functions"))
    host, port = MetricsConfig.host, MetricsConfig.port
    if "listen" in m:
        try:
            host, port = parse_listen(_str(ctx, m["listen"], "metrics.listen"))
        except ValueError as exc:
            raise ctx.fail(m["listen"], "metrics.listen", str(exc)) from None
    stall = _number(ctx, m["stall_after_s"], "metrics.stall_after_s", 1) if "stall_after_s" in m else 30.0
    otlp = None
    if "otlp" in m and _kind(m["otlp"]) != "null":
        otlp = _otlp(ctx, m["otlp"], "metrics.otlp")
    interval = _number(ctx, m["otlp_interval"], "metrics.otlp_interval", 1) if "otlp_interval" in m else 60.0
    max_errs = _pos_int(ctx, m["max_error_types"], "metrics.max_error_types") if "max_error_types" in m else 0
    funcs = _globs(ctx, m["functions"], "metrics.functions") if "functions" in m else ()
    return MetricsConfig(host, port, stall, otlp, interval, max_errs, funcs)


def _limits(ctx: _Ctx, node: yaml.Node) -> Limits:
    m = _mapping(ctx, node, "limits", ("max_spans_per_trace", "export_queue_spans", "ringbuf_size", "max_sessions"))
    d = Limits()
    return Limits(
        max_spans_per_trace=_pos_int(ctx, m["max_spans_per_trace"], "limits.max_spans_per_trace")
        if "max_spans_per_trace" in m else d.max_spans_per_trace,
        export_queue_spans=_pos_int(ctx, m["export_queue_spans"], "limits.export_queue_spans")
        if "export_queue_spans" in m else d.export_queue_spans,
        ringbuf_size=_size(ctx, m["ringbuf_size"], "limits.ringbuf_size") if "ringbuf_size" in m else d.ringbuf_size,
        max_sessions=_pos_int(ctx, m["max_sessions"], "limits.max_sessions")
        if "max_sessions" in m else d.max_sessions)


def _logging(ctx: _Ctx, node: yaml.Node) -> LoggingConfig:
    m = _mapping(ctx, node, "logging", ("format", "level"))
    return LoggingConfig(
        format=_choice(ctx, m["format"], "logging.format", LOG_FORMATS) if "format" in m else "text",
        level=_choice(ctx, m["level"], "logging.level", LOG_LEVELS) if "level" in m else "info")


_TOP_KEYS = ("probe_sets", "exporter", "metrics", "limits", "logging", "vmlinux")


def parse_config(text: str, filename: str = "<config>") -> AgentConfig:
    """Validate a whole config; raises ConfigError at the first problem."""
    ctx = _Ctx(os.path.basename(filename))
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{ctx.filename}:{mark.line + 1}" if mark is not None else ctx.filename
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if root is None:
        raise ConfigError(f"{ctx.filename}:1: the file is empty; it needs at least a 'probe_sets:' section")
    m = _mapping(ctx, root, "", _TOP_KEYS)
    if "probe_sets" not in m:
        raise ctx.fail(root, "probe_sets", "missing: the config needs at least one probe set")
    vmlinux = _opt_str(ctx, m.get("vmlinux"), "vmlinux")
    if vmlinux not in (None, "auto") and not os.path.isfile(vmlinux):
        raise ctx.fail(m["vmlinux"], "vmlinux", f"{vmlinux}: no such file (give a vmlinux with DWARF, 'auto' to "
                       "search the standard places, or leave it out)")
    probe_sets = _probe_sets(ctx, m["probe_sets"])
    exporter = _exporter(ctx, m["exporter"]) if "exporter" in m else ExporterConfig()
    if exporter.otlp is None and exporter.file is None and not exporter.console and any(
            ps.mode != "metrics" for ps in probe_sets):
        raise ctx.fail(m["exporter"], "exporter", "no exporter left for the probe sets that make traces: set otlp, "
                       "file or console: true, or give every probe set mode: metrics")
    return AgentConfig(
        path=filename, probe_sets=probe_sets,
        exporter=exporter,
        metrics=_metrics(ctx, m["metrics"]) if "metrics" in m else MetricsConfig(),
        limits=_limits(ctx, m["limits"]) if "limits" in m else Limits(),
        logging=_logging(ctx, m["logging"]) if "logging" in m else LoggingConfig(),
        vmlinux=vmlinux)


def load_config(path: str | Path) -> AgentConfig:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    return parse_config(text, str(path))

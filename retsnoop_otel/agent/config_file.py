"""The agent's YAML configuration: the capture runtime's config, read so that every error names
file, line and key (see yaml_nodes), plus the agent's own logging settings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import yaml

from retsnoop_otel.agent.config_kubernetes import parse_kubernetes
from retsnoop_otel.agent.yaml_nodes import (
    ConfigError,
    Nodes,
    boolean,
    choice,
    expansion_bounded,
    got,
    integer,
    items,
    kind,
    mapping,
    number,
    opt_string,
    scalar,
    size,
    string,
)
from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.capture.inject import InjectError, InjectSpec, parse_specs, read_spec_file
from retsnoop_otel.capture.sampling import Sampling
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.export.service_name import SERVICE_NAME_FROM
from retsnoop_otel.inputs.addresses import parse_listen
from retsnoop_otel.inputs.files import MAX_CONFIG_BYTES, read_text
from retsnoop_otel.inputs.numbers import COUNT, MAP_ENTRIES, PID, RINGBUF_BYTES
from retsnoop_otel.kernel.kcache import AGENT_CACHE_DIR
from retsnoop_otel.metrics.buckets import DurationRange, RangeError, parse_duration_ns
from retsnoop_otel.runtime.config import (
    ATTACH_MODES,
    PROBE_MODES,
    USER_ATTACH_MODES,
    WORKLOAD_LABELS,
    ConsoleConfig,
    ExporterConfig,
    Limits,
    MetricsConfig,
    ProbeSetConfig,
    RuntimeConfig,
    SymbolsConfig,
)
from retsnoop_otel.symbols.discovery import DiscoveryError, expand_glob_args, parse_glob
from retsnoop_otel.workload.k8s_settings import KubernetesConfig

PROTOCOLS = ("grpc", "http/protobuf")
COMPRESSIONS = ("gzip", "deflate", "none")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_MS = float((1 << 63) // 1_000_000)  # milliseconds whose nanoseconds fit the kernel's 64-bit durations

__all__ = ["AgentConfig", "ConfigError", "LoggingConfig", "load_config", "parse_config"]


class LoggingConfig(NamedTuple):
    format: str = "text"
    level: str | None = None  # None: not in the file; OTEL_LOG_LEVEL, else info (agent/main.py)


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


# ---- sections ------------------------------------------------------------------------------------


def _globs(ctx: Nodes, node: yaml.Node, key: str) -> tuple[str, ...]:
    """The globs in order, each '@file' replaced by its lines: a glob file is read and checked here, once per load
    of the config however many keys name it, and nothing after this reads it again (the runtime gets the globs as
    values; a reload loads the config, and so its glob files, anew)."""
    def one(n: yaml.Node, k: str) -> tuple[str, ...]:
        text = scalar(ctx, n, k, (str,), "a glob string")
        if ("globs", text) in ctx.files:
            return ctx.files["globs", text]
        try:
            globs = tuple(expand_glob_args([text]))  # '@file' globs: the file must exist and parse too
            for g in globs:
                parse_glob(g)
        except DiscoveryError as exc:
            raise ctx.fail(n, k, f"{exc}") from None
        if text.startswith("@"):
            ctx.files["globs", text] = globs
        return globs

    if isinstance(node, yaml.ScalarNode) and kind(node) not in ("string", "null"):
        raise ctx.fail(node, key, f"expected a list of globs, got {got(ctx, node)}")
    parts = items(ctx, node, key, one, "a list of globs")
    return parts[0] if len(parts) == 1 else tuple(g for globs in parts for g in globs)


def _pids(ctx: Nodes, node: yaml.Node, key: str) -> tuple[int, ...]:
    if isinstance(node, yaml.ScalarNode) and kind(node) == "int":
        return (integer(ctx, node, key, PID),)
    return items(ctx, node, key, lambda n, k: integer(ctx, n, k, PID), "a list of process ids")


def _strs(ctx: Nodes, node: yaml.Node, key: str) -> tuple[str, ...]:
    return items(ctx, node, key, lambda n, k: string(ctx, n, k), "a list of strings")


def _sampling(ctx: Nodes, node: yaml.Node, key: str) -> Sampling:
    m = mapping(ctx, node, key, ("errors", "success_probability", "success_rate_per_s"))
    if "errors" in m and number(ctx, m["errors"], f"{key}.errors", 0, 1) != 1.0:
        raise ctx.fail(m["errors"], f"{key}.errors", "error sessions are always kept: use 1.0 or leave it out")
    if "success_probability" in m and "success_rate_per_s" in m:
        raise ctx.fail(m["success_rate_per_s"], f"{key}.success_rate_per_s",
                       "give either success_probability or success_rate_per_s, not both")
    prob = number(ctx, m["success_probability"], f"{key}.success_probability", 0, 1) \
        if "success_probability" in m else 0.0
    rate = number(ctx, m["success_rate_per_s"], f"{key}.success_rate_per_s", 0) \
        if "success_rate_per_s" in m else None
    return Sampling(prob, rate or None)


def _duration_range(ctx: Nodes, node: yaml.Node, key: str) -> DurationRange:
    """`{min: 1us, max: 10s}`: the histogram bucket range (either end may be left at the kernel's)."""
    m = mapping(ctx, node, key, ("min", "max"))
    if not m:
        raise ctx.fail(node, key, "give min, max or both, for example {min: 1us, max: 10s}")
    ns: dict[str, int] = {}
    for end, vnode in m.items():
        text = ctx.value(vnode) if isinstance(vnode, yaml.ScalarNode) else None
        try:
            if not isinstance(text, str):
                raise RangeError(f"expected a duration with a unit such as 1us, 250ms or 10s, got {got(ctx, vnode)}")
            ns[f"{end}_ns"] = parse_duration_ns(text)
        except RangeError as exc:
            raise ctx.fail(vnode, f"{key}.{end}", str(exc)) from None
    try:
        return DurationRange(**ns)
    except RangeError as exc:  # "min ..." / "max ...": the line of that end
        end = str(exc).split(" ", 1)[0]
        raise ctx.fail(m.get(end, node), f"{key}.{end}" if end in m else key, str(exc)) from None


_FILTER_KEYS = ("pids", "no_pids", "comms", "no_comms", "cgroup", "min_duration_ms", "allow_errors", "deny_errors")
_SET_KEYS = ("name", "entry", "allow", "deny", "mode", "attach_mode", "user_attach_mode", "filters", "sampling", "lbr",
             "capture_args", "app_context", "user_stacks", "duration_range", "workload_label", "inject")


def _lbr(ctx: Nodes, node: yaml.Node, key: str, mode: str) -> int:
    """`lbr: true` (any_return), or the --lbr specs as a string ('any_return', 'any,cond', '0x20')."""
    from retsnoop_otel.kernel.lbr import LbrError, parse_specs
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, key, f"expected true, false or branch types such as 'any_return', got {got(ctx, node)}")
    value = ctx.value(node)
    if value is False or value is None:
        return 0
    if mode == "metrics":
        raise ctx.fail(node, key, "branch records travel with reported sessions: use mode stack or calls, "
                       "or drop 'lbr'")
    if value is True:
        return parse_specs([])
    if not isinstance(value, str):
        raise ctx.fail(node, key, f"expected true, false or branch types such as 'any_return', got {got(ctx, node)}")
    try:
        return parse_specs([value])
    except LbrError as exc:
        raise ctx.fail(node, key, str(exc).replace("--lbr value", "branch type")) from None


def _inject(ctx: Nodes, node: yaml.Node, key: str, mode: str) -> tuple[InjectSpec, ...]:
    """-J's specs (retsnoop's forms, @FILE too); they travel with the call records, which mode metrics has not."""
    def read(path: str) -> str:  # a spec file: read once per load of the config, however many sets name it
        if ("specs", path) not in ctx.files:
            ctx.files["specs", path] = read_spec_file(path)
        return ctx.files["specs", path]

    try:
        specs = parse_specs(_strs(ctx, node, key), read)
    except InjectError as exc:
        raise ctx.fail(node, key, str(exc).replace("-J ", "")) from None
    if specs and mode == "metrics":
        raise ctx.fail(node, key, "injected probes are recorded in reported sessions: use mode stack or calls")
    return specs


def _probe_set(ctx: Nodes, node: yaml.Node, key: str, name: str | None) -> ProbeSetConfig:
    m = mapping(ctx, node, key, _SET_KEYS if name is None else _SET_KEYS[1:])
    if name is None:
        if "name" not in m:
            raise ctx.fail(node, key, "missing 'name' (each probe set needs a unique name, used as the "
                           "probe_set metric label)")
        name = string(ctx, m["name"], f"{key}.name")
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
    f = mapping(ctx, m["filters"], f"{key}.filters", _FILTER_KEYS) if "filters" in m else {}
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
        mode=choice(ctx, m["mode"], f"{key}.mode", PROBE_MODES) if "mode" in m else "stack",
        attach_mode=choice(ctx, m["attach_mode"], f"{key}.attach_mode", ATTACH_MODES) if "attach_mode" in m
        else "auto",
        user_attach_mode=choice(ctx, m["user_attach_mode"], f"{key}.user_attach_mode", USER_ATTACH_MODES)
        if "user_attach_mode" in m else "auto",
        pids=_pids(ctx, f["pids"], f"{fk}.pids") if "pids" in f else (),
        no_pids=_pids(ctx, f["no_pids"], f"{fk}.no_pids") if "no_pids" in f else (),
        comms=_strs(ctx, f["comms"], f"{fk}.comms") if "comms" in f else (),
        no_comms=_strs(ctx, f["no_comms"], f"{fk}.no_comms") if "no_comms" in f else (),
        cgroup=opt_string(ctx, f.get("cgroup"), f"{fk}.cgroup"),
        min_duration_ns=int(number(ctx, f["min_duration_ms"], f"{fk}.min_duration_ms", 0, _MAX_MS) * 1_000_000)
        if "min_duration_ms" in f else 0,
        errors=errors,
        sampling=_sampling(ctx, m["sampling"], f"{key}.sampling") if "sampling" in m else Sampling(),
        lbr_branch_types=_lbr(ctx, m["lbr"], f"{key}.lbr", ctx.value(m["mode"]) if "mode" in m else "stack")
        if "lbr" in m else 0,
        capture_args=boolean(ctx, m["capture_args"], f"{key}.capture_args") if "capture_args" in m else False,
        app_context=boolean(ctx, m["app_context"], f"{key}.app_context") if "app_context" in m else True,
        user_stacks=boolean(ctx, m["user_stacks"], f"{key}.user_stacks") if "user_stacks" in m else False,
        duration_range=_duration_range(ctx, m["duration_range"], f"{key}.duration_range")
        if "duration_range" in m else None,
        workload_label=choice(ctx, m["workload_label"], f"{key}.workload_label", WORKLOAD_LABELS)
        if "workload_label" in m else None,
        inject=_inject(ctx, m["inject"], f"{key}.inject", ctx.value(m["mode"]) if "mode" in m else "stack")
        if "inject" in m else ())


def _probe_sets(ctx: Nodes, node: yaml.Node) -> tuple[ProbeSetConfig, ...]:
    if isinstance(node, yaml.SequenceNode):
        sets = [_probe_set(ctx, n, f"probe_sets[{i}]", None) for i, n in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        sets = []
        for knode, vnode in node.value:
            name = ctx.value(knode)
            if not isinstance(name, str):
                raise ctx.fail(knode, "probe_sets", f"probe set names must be strings, got {got(ctx, knode)}")
            sets.append(_probe_set(ctx, vnode, f"probe_sets.{name}", name))
    else:
        raise ctx.fail(node, "probe_sets", f"expected a list (or mapping) of probe sets, got {got(ctx, node)}")
    if not sets:
        raise ctx.fail(node, "probe_sets", "needs at least one probe set")
    seen: set[str] = set()
    for i, ps in enumerate(sets):
        if ps.name in seen:
            item = node.value[i] if isinstance(node, yaml.SequenceNode) else node.value[i][0]
            raise ctx.fail(item, "probe_sets", f"probe set name '{ps.name}' is used twice; names must be unique")
        seen.add(ps.name)
    return tuple(sets)


_OTLP_KEYS = ("endpoint", "protocol", "headers", "compression", "timeout", "insecure", "certificate", "client_key",
              "client_certificate")


def _otlp(ctx: Nodes, node: yaml.Node, key: str) -> OtlpConfig:
    m = mapping(ctx, node, key, _OTLP_KEYS)
    headers: list[tuple[str, str]] = []
    if "headers" in m:
        hm = _mapping_any(ctx, m["headers"], f"{key}.headers")
        headers = [(k, str(scalar(ctx, v, f"{key}.headers.{k}", (str, int, float), "a string")))
                   for k, v in hm.items()]
    # resolved with the environment by the runtime (runtime/settings.py); AgentConfig.where() locates its errors
    return OtlpConfig(
        endpoint=opt_string(ctx, m.get("endpoint"), f"{key}.endpoint"),
        protocol=choice(ctx, m["protocol"], f"{key}.protocol", PROTOCOLS) if "protocol" in m else None,
        headers=tuple(headers),
        compression=choice(ctx, m["compression"], f"{key}.compression", COMPRESSIONS) if "compression" in m else None,
        timeout_s=number(ctx, m["timeout"], f"{key}.timeout", 0.001) if "timeout" in m else None,
        insecure=boolean(ctx, m["insecure"], f"{key}.insecure") if "insecure" in m else None,
        certificate=opt_string(ctx, m.get("certificate"), f"{key}.certificate"),
        client_key=opt_string(ctx, m.get("client_key"), f"{key}.client_key"),
        client_certificate=opt_string(ctx, m.get("client_certificate"), f"{key}.client_certificate"))


def _mapping_any(ctx: Nodes, node: yaml.Node, key: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, key, f"expected a mapping, got {got(ctx, node)}")
    return {str(ctx.value(k)): v for k, v in node.value}


def _exporter(ctx: Nodes, node: yaml.Node) -> ExporterConfig:
    m = mapping(ctx, node, "exporter", ("otlp", "file", "console", "export_addresses", "service_name_from"))
    otlp = None
    if "otlp" in m:
        otlp = None if kind(m["otlp"]) == "null" else _otlp(ctx, m["otlp"], "exporter.otlp")
    elif "file" not in m and "console" not in m:
        otlp = OtlpConfig()
    path = opt_string(ctx, m.get("file"), "exporter.file")
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ctx.fail(m["file"], "exporter.file", f"the directory of {path} does not exist")
    console = boolean(ctx, m["console"], "exporter.console") if "console" in m else False
    service = choice(ctx, m["service_name_from"], "exporter.service_name_from", SERVICE_NAME_FROM) \
        if "service_name_from" in m else "workload"
    return ExporterConfig(otlp=otlp, file=path, console=ConsoleConfig(prefix=True) if console else None,
                          export_addresses=boolean(ctx, m["export_addresses"], "exporter.export_addresses")
                          if "export_addresses" in m else False, service_name_from=service)


def _metrics(ctx: Nodes, node: yaml.Node) -> MetricsConfig:
    m = mapping(ctx, node, "metrics", ("listen", "stall_after_s", "otlp", "otlp_interval", "max_error_types",
                                        "functions", "duration_range", "max_workloads", "web_config_file"))
    host, port = MetricsConfig().host, MetricsConfig().port
    if "listen" in m:
        try:
            host, port = parse_listen(string(ctx, m["listen"], "metrics.listen"))
        except ValueError as exc:
            raise ctx.fail(m["listen"], "metrics.listen", str(exc)) from None
    stall = number(ctx, m["stall_after_s"], "metrics.stall_after_s", 1) if "stall_after_s" in m else 30.0
    otlp = None
    if "otlp" in m and kind(m["otlp"]) != "null":
        otlp = _otlp(ctx, m["otlp"], "metrics.otlp")
    interval = number(ctx, m["otlp_interval"], "metrics.otlp_interval", 1) if "otlp_interval" in m else None
    max_errs = integer(ctx, m["max_error_types"], "metrics.max_error_types", COUNT) if "max_error_types" in m else 0
    funcs = _globs(ctx, m["functions"], "metrics.functions") if "functions" in m else ()
    buckets = _duration_range(ctx, m["duration_range"], "metrics.duration_range") if "duration_range" in m else None
    workloads = integer(ctx, m["max_workloads"], "metrics.max_workloads", COUNT) if "max_workloads" in m \
        else MetricsConfig().max_workloads
    web = opt_string(ctx, m.get("web_config_file"), "metrics.web_config_file")  # read by the runtime, at start
    return MetricsConfig(host, port, stall, otlp, interval, max_errs, funcs, buckets, workloads,
                         web_config_file=web or None)


def _limits(ctx: Nodes, node: yaml.Node) -> Limits:
    m = mapping(ctx, node, "limits", ("max_spans_per_trace", "export_queue_spans", "ringbuf_size", "max_sessions",
                                       "user_stack_wait_s"))
    d = Limits()
    spans = integer(ctx, m["max_spans_per_trace"], "limits.max_spans_per_trace", COUNT) if "max_spans_per_trace" in m \
        else d.max_spans_per_trace
    return Limits(
        max_spans_per_trace=spans,
        max_calls_per_session=spans,  # calls beyond the span limit would not be exported: do not keep them
        export_queue_spans=integer(ctx, m["export_queue_spans"], "limits.export_queue_spans", COUNT)
        if "export_queue_spans" in m else d.export_queue_spans,
        ringbuf_size=size(ctx, m["ringbuf_size"], "limits.ringbuf_size", RINGBUF_BYTES)
        if "ringbuf_size" in m else d.ringbuf_size,
        max_sessions=integer(ctx, m["max_sessions"], "limits.max_sessions", MAP_ENTRIES)
        if "max_sessions" in m else d.max_sessions,
        user_stack_wait_s=number(ctx, m["user_stack_wait_s"], "limits.user_stack_wait_s", 0, 60)
        if "user_stack_wait_s" in m else d.user_stack_wait_s)


def _logging(ctx: Nodes, node: yaml.Node) -> LoggingConfig:
    m = mapping(ctx, node, "logging", ("format", "level"))
    return LoggingConfig(
        format=choice(ctx, m["format"], "logging.format", LOG_FORMATS) if "format" in m else "text",
        level=choice(ctx, m["level"], "logging.level", LOG_LEVELS) if "level" in m else None)


_TOP_KEYS = ("probe_sets", "exporter", "metrics", "limits", "logging", "vmlinux", "kubernetes")


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
    m = mapping(ctx, root, "", _TOP_KEYS)
    if "probe_sets" not in m:
        raise ctx.fail(root, "probe_sets", "missing: the config needs at least one probe set")
    vmlinux = opt_string(ctx, m.get("vmlinux"), "vmlinux")
    if vmlinux not in (None, "auto") and not os.path.isfile(vmlinux):
        raise ctx.fail(m["vmlinux"], "vmlinux", f"{vmlinux}: no such file (give a vmlinux with DWARF, 'auto' to "
                       "search the standard places, or leave it out)")
    probe_sets = _probe_sets(ctx, m["probe_sets"])
    exporter = _exporter(ctx, m["exporter"]) if "exporter" in m else ExporterConfig()
    if exporter.otlp is None and exporter.file is None and exporter.console is None and any(
            ps.mode != "metrics" for ps in probe_sets):
        raise ctx.fail(m["exporter"], "exporter", "no exporter left for the probe sets that make traces: set otlp, "
                       "file or console: true, or give every probe set mode: metrics")
    runtime = RuntimeConfig(
        probe_sets=probe_sets, exporter=exporter,
        metrics=_metrics(ctx, m["metrics"]) if "metrics" in m else MetricsConfig(),
        limits=_limits(ctx, m["limits"]) if "limits" in m else Limits(),
        symbols=SymbolsConfig(vmlinux=vmlinux, cache_dir=AGENT_CACHE_DIR),
        kubernetes=parse_kubernetes(ctx, m["kubernetes"]) if "kubernetes" in m else KubernetesConfig())
    return AgentConfig(runtime, path=filename, logging=_logging(ctx, m["logging"]) if "logging" in m
                       else LoggingConfig(), lines=MappingProxyType(_key_lines(ctx, root)))


def load_config(path: str | Path, name: str = "config file") -> AgentConfig:
    """`name`: what the file is called in messages ('--config file', '--check file')."""
    text = read_text(path, name, MAX_CONFIG_BYTES, ConfigError)
    return parse_config(text, str(path))

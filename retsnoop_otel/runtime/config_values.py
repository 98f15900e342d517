"""Values of the agent file that take more than a type and a range to read: the nested sections `sampling`,
`duration_range` and `otlp` (declared here, key by key, as config_keys has it), process ids, branch records,
injected probes and the metrics endpoint's address.
"""

from __future__ import annotations

from collections.abc import Mapping

from retsnoop_otel.capture.inject import InjectError, InjectSpec, parse_specs, read_spec_file
from retsnoop_otel.capture.sampling import Sampling
from retsnoop_otel.export.otlp_settings import COMPRESSIONS, MAX_TIMEOUT_S, PROTOCOLS, OtlpConfig
from retsnoop_otel.inputs.addresses import parse_listen
from retsnoop_otel.inputs.files import plain
from retsnoop_otel.inputs.numbers import PID, parse_int
from retsnoop_otel.metrics.buckets import DurationRange, RangeError, format_ns, parse_duration_ns
from retsnoop_otel.runtime.config import ProbeSetConfig
from retsnoop_otel.runtime.config_keys import (
    BOOL,
    OPT_STR,
    STRS,
    Flag,
    Key,
    Kind,
    Section,
    choices,
    nested,
    num,
    read_section,
    simple,
)
from retsnoop_otel.runtime.yaml_nodes import Nodes, got, integer, items, kind, string, yaml


def _pids(ctx: Nodes, node: yaml.Node, key: str) -> tuple[int, ...]:
    if isinstance(node, yaml.ScalarNode) and kind(node) == "int":
        return (integer(ctx, node, key, PID),)
    return items(ctx, node, key, lambda n, k: integer(ctx, n, k, PID), "a list of process ids")


PIDS = simple(_pids, f"list of process ids, {PID.lo} to {PID.hi}",
              {"type": ["array", "integer", "null"], "items": {"type": "integer", "minimum": PID.lo,
                                                              "maximum": PID.hi}},
              parse=lambda text: parse_int(text, PID))


def _mode(ctx: Nodes, m: Mapping[str, yaml.Node]) -> str:
    return ctx.value(m["mode"]) if "mode" in m else ProbeSetConfig._field_defaults["mode"]


def _lbr(ctx: Nodes, node: yaml.Node, key: str, m: Mapping[str, yaml.Node]) -> int:
    """`lbr: true` (any_return), or the --lbr specs as a string ('any_return', 'any,cond', '0x20')."""
    from retsnoop_otel.kernel.lbr import LbrError
    from retsnoop_otel.kernel.lbr import parse_specs as lbr_specs
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, key, f"expected true, false or branch types such as 'any_return', got {got(ctx, node)}")
    value = ctx.value(node)
    if value is False or value is None:
        return 0
    if _mode(ctx, m) == "metrics":
        raise ctx.fail(node, key, "branch records travel with reported sessions: use mode stack or calls, "
                       "or drop 'lbr'")
    if value is True:
        return lbr_specs([])
    if not isinstance(value, str):
        raise ctx.fail(node, key, f"expected true, false or branch types such as 'any_return', got {got(ctx, node)}")
    try:
        return lbr_specs([value])
    except LbrError as exc:
        raise ctx.fail(node, key, str(exc).replace("--lbr value", "branch type")) from None


LBR = Kind(_lbr, "bool or branch types", {"type": ["boolean", "string", "null"]})


def _inject(ctx: Nodes, node: yaml.Node, key: str, m: Mapping[str, yaml.Node]) -> tuple[InjectSpec, ...]:
    """-J's specs (retsnoop's forms, @FILE too); they travel with the call records, which mode metrics has not."""
    def read(path: str) -> str:  # a spec file: read once per load of the config, however many sets name it
        if ("specs", path) not in ctx.files:
            ctx.files["specs", path] = read_spec_file(path)
        return ctx.files["specs", path]

    try:
        specs = parse_specs(STRS.read(ctx, node, key, m), read)
    except InjectError as exc:
        raise ctx.fail(node, key, str(exc).replace("-J ", "")) from None
    if specs and _mode(ctx, m) == "metrics":
        raise ctx.fail(node, key, "injected probes are recorded in reported sessions: use mode stack or calls")
    return specs


INJECT = Kind(_inject, "list of probe specs", STRS.schema)


def _listen(ctx: Nodes, node: yaml.Node, key: str) -> tuple[str, int | None]:
    text = string(ctx, node, key)  # its ConfigError (a ValueError) already names the line and key: not wrapped again
    try:
        return parse_listen(text)
    except ValueError as exc:
        raise ctx.fail(node, key, str(exc)) from None


LISTEN = simple(_listen, "[host]:port", {"type": "string"}, parse=parse_listen)


# ---- sampling -------------------------------------------------------------------------------------------------

SAMPLING = Section("sampling", Sampling, (
    Key("errors", num(0, 1), "share of error sessions reported and exported (as tracestate ot=th:...); origin "
        "counts stay exact", field="error_probability",
        check=lambda v: None if v > 0 else "0 would export no error session: give a probability in (0, 1] "
        "(mode: metrics counts without exporting)",
        flag=Flag(("--error-probability",), "error_probability", metavar="P", group="what to capture and show")),
    Key("errors_rate_per_s", num(0), "or at most this many error sessions a second, per error origin",
        field="error_rate_per_s"),
    Key("success_probability", num(0, 1), "share of successful sessions kept (as tracestate ot=th:...)",
        flag=Flag(("-S", "--success-stacks"), "success_stacks", "store_true", "-S: all (retsnoop's: report sessions "
                  "without errors too)", default=False)),
    Key("success_rate_per_s", num(0), "or at most this many successful sessions a second, per entry function"),
))


def _sampling(ctx: Nodes, node: yaml.Node, key: str, _m: Mapping[str, yaml.Node]) -> Sampling:
    values, m = read_section(ctx, node, key, SAMPLING)
    if "success_probability" in m and "success_rate_per_s" in m:
        raise ctx.fail(m["success_rate_per_s"], f"{key}.success_rate_per_s",
                       "give either success_probability or success_rate_per_s, not both")
    if "errors" in m and "errors_rate_per_s" in m:
        raise ctx.fail(m["errors_rate_per_s"], f"{key}.errors_rate_per_s",
                       "give either errors (a probability) or errors_rate_per_s, not both")
    if not values.get("error_rate_per_s", 1):  # 0: no rate limit
        del values["error_rate_per_s"]
    if not values.get("success_rate_per_s", 1):  # 0: no rate limit
        del values["success_rate_per_s"]
    return Sampling(**values)


SAMPLING_KIND = nested(SAMPLING, _sampling)


# ---- duration_range -------------------------------------------------------------------------------------------


def _duration(ctx: Nodes, node: yaml.Node, key: str) -> int:
    text = ctx.value(node) if isinstance(node, yaml.ScalarNode) else None
    try:
        if not isinstance(text, str):
            raise RangeError(f"expected a duration with a unit such as 1us, 250ms or 10s, got {got(ctx, node)}")
        return parse_duration_ns(text)
    except RangeError as exc:
        raise ctx.fail(node, key, str(exc)) from None


DURATION = simple(_duration, "duration (1us, 250ms, 10s)", {"type": "string"})
DURATION_RANGE = Section("duration_range", DurationRange, (
    Key("min", DURATION, "the first bucket bound (rounded down to a power of two ns)", field="min_ns",
        default=lambda: format_ns(DurationRange().min_ns)),
    Key("max", DURATION, "the last bucket bound (rounded up to a power of two ns)", field="max_ns",
        default=lambda: format_ns(DurationRange().max_ns)),
))


def _duration_range(ctx: Nodes, node: yaml.Node, key: str, _m: Mapping[str, yaml.Node]) -> DurationRange:
    """`{min: 1us, max: 10s}`: the histogram bucket range (either end may be left at the kernel's)."""
    ns, m = read_section(ctx, node, key, DURATION_RANGE)
    if not m:
        raise ctx.fail(node, key, "give min, max or both, for example {min: 1us, max: 10s}")
    try:
        return DurationRange(**ns)
    except RangeError as exc:  # "min ..." / "max ...": the line of that end
        end = str(exc).split(" ", 1)[0]
        raise ctx.fail(m.get(end, node), f"{key}.{end}" if end in m else key, str(exc)) from None


DURATION_RANGE_KIND = nested(DURATION_RANGE, _duration_range)


# ---- otlp -----------------------------------------------------------------------------------------------------


def _headers(ctx: Nodes, node: yaml.Node, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, key, f"expected a mapping, got {got(ctx, node)}")
    out = []
    for k, v in node.value:
        name = str(ctx.value(k))
        value = ctx.value(v) if isinstance(v, yaml.ScalarNode) else None
        if not isinstance(value, str):  # YAML reads 0x1F as 31 and 1.50 as 1.5: not what was written
            raise ctx.fail(v, f"{key}.{plain(name, 40)}", f"expected a string (quote a number: '42'), got "
                           f"{kind(v)} (not shown: a header may hold a secret)")
        out.append((name, value))
    return tuple(out)


def otlp_section(name: str, endpoint_flag: Flag | None = None, protocol_flag: Flag | None = None) -> Section:
    """One OTLP destination; what is left out comes from the environment (runtime/settings.py), then the
    specification's defaults."""
    return Section(name, OtlpConfig, (
        Key("endpoint", OPT_STR, "base URL (the signal's path is appended)", flag=endpoint_flag),
        Key("protocol", choices(PROTOCOLS), "unset: the OTEL_EXPORTER_OTLP_*PROTOCOL variables, else http/protobuf "
            "(a collector's port 4318; grpc is its port 4317)", flag=protocol_flag),
        Key("headers", simple(_headers, "mapping", {"type": "object", "additionalProperties": {
            "type": "string"}}), "headers of each export request",
            default=lambda: dict(OtlpConfig().headers)),
        Key("compression", choices(COMPRESSIONS), "none by default"),
        Key("timeout", num(0.001, MAX_TIMEOUT_S, " (s)"), "seconds per export request (10 by default)",
            field="timeout_s"),
        Key("insecure", BOOL, "gRPC only: plaintext to a scheme-less host:port"),
        Key("certificate", OPT_STR, "CA bundle (PEM) that verifies the server"),
        Key("client_key", OPT_STR, "mTLS: the client's key (PEM)"),
        Key("client_certificate", OPT_STR, "mTLS: the client's certificate (PEM)"),
    ))


def otlp_kind(section: Section) -> Kind:
    def read(ctx: Nodes, node: yaml.Node, key: str, _m: Mapping[str, yaml.Node]) -> OtlpConfig | None:
        if kind(node) == "null":
            return None
        # resolved with the environment by the runtime (runtime/settings.py); AgentConfig.where() locates its errors
        return OtlpConfig(**read_section(ctx, node, key, section)[0])
    return nested(section, read, "mapping or null", null=True)

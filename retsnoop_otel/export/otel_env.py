"""Every OpenTelemetry environment variable the tool reads (sdk-environment-variables.md), and how a value it cannot
use is treated: warned about once and ignored.

The specification makes these variables defaults: the tool's own flags and config keys win over them, and an
invalid or unsupported value is warned about and ignored, as if the variable were unset (a per-signal OTLP
variable then falls back to the generic one, then to the default). Deployments set them for every process of a
host or a pod; a value meant for another SDK must not stop a tracer. The tool's own flags and config keys still
refuse a bad value (exit 2). The warnings are collected here, not printed: the runtime hands them to the command
at start (runtime.StartHook.warned) and again at each reload.

Only names and the warning collector live here (and the small readers of variables no other module owns), so
that every module that reads a variable imports its name from one place.
"""

from __future__ import annotations

from collections.abc import Mapping

from retsnoop_otel.inputs.files import shown

# SDK switches, resource and the SDK's own logger
SDK_DISABLED = "OTEL_SDK_DISABLED"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
SERVICE_NAME = "OTEL_SERVICE_NAME"
RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
LOG_LEVEL = "OTEL_LOG_LEVEL"
METRICS_EXEMPLAR_FILTER = "OTEL_METRICS_EXEMPLAR_FILTER"
TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"

# OTLP exporter (protocol/exporter.md): OTEL_EXPORTER_OTLP_<SETTING>, per signal OTEL_EXPORTER_OTLP_<SIGNAL>_<SETTING>
OTLP_SETTINGS = ("ENDPOINT", "PROTOCOL", "HEADERS", "COMPRESSION", "TIMEOUT", "INSECURE", "CERTIFICATE", "CLIENT_KEY",
                 "CLIENT_CERTIFICATE")
OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_PREFIX = OTLP_ENDPOINT.removesuffix("ENDPOINT")  # every OTLP exporter variable's name starts so
OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
METRICS_TEMPORALITY_PREFERENCE = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
METRICS_DEFAULT_HISTOGRAM_AGGREGATION = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"

# batch span processor and periodic metric reader
BSP_SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
BSP_EXPORT_TIMEOUT = "OTEL_BSP_EXPORT_TIMEOUT"
BSP_MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
BSP_MAX_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
METRIC_EXPORT_TIMEOUT = "OTEL_METRIC_EXPORT_TIMEOUT"

# span limits: the span-specific variable first, then the general one
SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
SPAN_ATTRIBUTE_COUNT_LIMIT = "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"
ATTRIBUTE_COUNT_LIMIT = "OTEL_ATTRIBUTE_COUNT_LIMIT"
SPAN_EVENT_COUNT_LIMIT = "OTEL_SPAN_EVENT_COUNT_LIMIT"
EVENT_ATTRIBUTE_COUNT_LIMIT = "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT"

IGNORED = "ignored, as if unset"


def otlp_var(setting: str, signal: str | None = None) -> str:
    """OTEL_EXPORTER_OTLP_TIMEOUT, or with `signal` ("traces") OTEL_EXPORTER_OTLP_TRACES_TIMEOUT."""
    return f"{OTLP_PREFIX}{signal.upper()}_{setting}" if signal else f"{OTLP_PREFIX}{setting}"


def value(environ: Mapping[str, str], var: str) -> str:
    """The variable's value without surrounding blanks; "" when unset (an empty variable counts as unset)."""
    return environ.get(var, "").strip()


class EnvWarnings:
    """The variables whose values are not used, each said once, in the order found: the variable, its value as
    shown() echoes it (or not at all: headers can hold API keys), the problem, and that it is ignored."""

    __slots__ = ("_by_var",)

    def __init__(self) -> None:
        self._by_var: dict[str, str] = {}

    def ignore(self, var: str, problem: str, text: str | None = None) -> None:
        """`var`'s value is not used: `text` is the value to show (None: not shown), `problem` what is wrong and
        how to fix it."""
        self.add(var, f"{var if text is None else f'{var}={shown(text)}'}: {problem}; {IGNORED}")

    def add(self, var: str, message: str) -> None:
        self._by_var.setdefault(var, message)

    def __contains__(self, var: object) -> bool:
        return var in self._by_var

    @property
    def messages(self) -> tuple[str, ...]:
        return tuple(self._by_var.values())


def warnings_or_new(warnings: EnvWarnings | None) -> EnvWarnings:
    """The caller's collector, or one nobody reads (a reader called on its own, as tests do)."""
    return EnvWarnings() if warnings is None else warnings


# OTEL_LOG_LEVEL: the specification's levels, and those of other SDKs, as the agent's log levels
LOG_LEVELS = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warning", "warning": "warning",
              "error": "error", "fatal": "error"}


def log_level(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> str | None:
    """The agent's log level OTEL_LOG_LEVEL asks for (its logging.level wins); None when unset or unknown."""
    text = value(environ, LOG_LEVEL)
    if not text:
        return None
    level = LOG_LEVELS.get(text.lower())
    if level is None:
        warnings_or_new(warnings).ignore(LOG_LEVEL, "not a log level; write debug, info, warn or error (trace and "
                                                    "fatal are read as debug and error)", text)
    return level


EXEMPLAR_FILTERS = ("trace_based", "always_on", "always_off")


def exemplars_on(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> bool:
    """OTEL_METRICS_EXEMPLAR_FILTER: always_off drops the exemplars; trace_based (the default) and always_on keep
    the exported traces' (every exemplar here is a sampled, exported trace)."""
    text = value(environ, METRICS_EXEMPLAR_FILTER)
    if text and text.lower() not in EXEMPLAR_FILTERS:
        warnings_or_new(warnings).ignore(METRICS_EXEMPLAR_FILTER, "not an exemplar filter; write trace_based, "
                                                                  "always_on or always_off", text)
        return True
    return text.lower() != "always_off"


SAMPLING_NOT_USED = ("not used: sessions are exported as the probe set's sampling says (agent: sampling.errors or "
                     "errors_rate_per_s, success_probability or success_rate_per_s; trace: --error-probability, -S "
                     "or -T); "
                     "parentbased_always_on would export every successful kernel call")


def samplers_not_used(environ: Mapping[str, str], warnings: EnvWarnings) -> None:
    """OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, when set: warned about, never used."""
    for var in (TRACES_SAMPLER, TRACES_SAMPLER_ARG):
        text = value(environ, var)
        if text:
            warnings.ignore(var, SAMPLING_NOT_USED if var == TRACES_SAMPLER else f"not used (see {TRACES_SAMPLER})",
                            text)

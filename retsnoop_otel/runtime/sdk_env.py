"""The OpenTelemetry SDK's own switches (sdk-environment-variables.md), applied to a run's config in one place.

`OTEL_SDK_DISABLED=true` turns every OTLP export off (traces, the OTLP-JSON file and console lines, the metrics
push) whatever the config says: it is the switch deployments flip without editing configs. `OTEL_TRACES_EXPORTER`
names the trace exporters: `otlp` (the default, which adds nothing: which endpoint to send to is the config's, or
the `OTEL_EXPORTER_OTLP_*` variables', to say, and `trace` exports only when one is given), `console` (each export
request as one OTLP/JSON line on stdout, the Collector's file format) and `none`. A list such as `otlp,console`
selects both; one without `otlp` turns the config's OTLP export off (`none` the OTLP-JSON file too).
`OTEL_METRICS_EXPORTER=none` turns the metrics push off (`otlp` and `prometheus` change nothing: the /metrics
endpoint is configured on its own and stays). As the specification says, a value that is none of these is warned
about and ignored: an exporter this tool has not (zipkin, jaeger) is left out of the list, and a list left with
nothing counts as unset; OTEL_SDK_DISABLED other than true or false counts as false.
"""

from collections.abc import Mapping
from typing import NamedTuple

from retsnoop_otel.export.otel_env import (
    METRICS_EXPORTER,
    SDK_DISABLED,
    TRACES_EXPORTER,
    EnvWarnings,
    value,
    warnings_or_new,
)
from retsnoop_otel.inputs.files import shown
from retsnoop_otel.runtime.config import RuntimeConfig

TRACE_EXPORTERS = ("otlp", "console", "none")
METRIC_EXPORTERS = ("otlp", "prometheus", "none")


class SdkSwitches(NamedTuple):
    traces: bool = True  # the config's OTLP trace export allowed
    metrics_push: bool = True  # the OTLP metrics push allowed
    why: str = ""  # the variables that turned something off, for the log
    file: bool = True  # the config's OTLP-JSON file allowed
    console: bool = False  # the spans as OTLP/JSON lines on stdout too


def exporters(environ: Mapping[str, str], var: str, known: tuple[str, ...],
              warnings: EnvWarnings | None = None) -> set[str]:
    """The exporters `var` names that this tool has ({"otlp"} when it names none); the others are warned about."""
    text = value(environ, var)
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    kept = [n for n in names if n in known]
    unknown = [n for n in names if n not in known]
    has = f"this tool has ({', '.join(known)})"
    if "none" in kept and len(kept) > 1:
        warnings_or_new(warnings).ignore(var, "'none' together with other exporters; give none alone", text)
        return {"otlp"}
    if unknown:
        what = ", ".join(shown(n) for n in unknown) + (" is not an exporter" if len(unknown) == 1
                                                       else " are not exporters")
        if kept:
            warnings_or_new(warnings).add(var, f"{var}={shown(text)}: {what} {has}; left out, {','.join(kept)} used")
        else:
            warnings_or_new(warnings).ignore(var, f"{what} {has}", text)
    return set(kept) or {"otlp"}


def read_switches(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> SdkSwitches:
    """The switches the environment sets; a value that is not one of them goes to `warnings` and is ignored."""
    disabled = value(environ, SDK_DISABLED).lower()
    if disabled not in ("", "true", "false"):
        warnings_or_new(warnings).ignore(SDK_DISABLED, "not a boolean; write true or false",
                                         value(environ, SDK_DISABLED))
    traces = exporters(environ, TRACES_EXPORTER, TRACE_EXPORTERS, warnings)
    metrics = exporters(environ, METRICS_EXPORTER, METRIC_EXPORTERS, warnings)
    if disabled == "true":
        return SdkSwitches(False, False, f"{SDK_DISABLED}=true", file=False)
    why = [f"{TRACES_EXPORTER}={','.join(sorted(traces))}"] if "otlp" not in traces else []
    why += [f"{METRICS_EXPORTER}=none"] if "none" in metrics else []
    return SdkSwitches("otlp" in traces, "none" not in metrics, ", ".join(why), file="none" not in traces,
                       console="console" in traces)


def apply_switches(cfg: RuntimeConfig, switches: SdkSwitches) -> RuntimeConfig:
    """The config with the exports the switches turn off removed, and the console lines they add."""
    exporter, metrics = cfg.exporter, cfg.metrics
    if not switches.traces:
        exporter = exporter._replace(otlp=None)
    if not switches.file:
        exporter = exporter._replace(file=None)
    if switches.console:
        exporter = exporter._replace(otlp_console=True)
    if not switches.metrics_push:
        metrics = metrics._replace(otlp=None)
    return cfg._replace(exporter=exporter, metrics=metrics)

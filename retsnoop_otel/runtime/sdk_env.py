"""The OpenTelemetry SDK's own switches (sdk-environment-variables.md), applied to a run's config in one place.

`OTEL_SDK_DISABLED=true` turns every OTLP export off (traces, the OTLP-JSON file, the metrics push) whatever the
config says: it is the switch deployments flip without editing configs. `OTEL_TRACES_EXPORTER=none` turns the
trace export off, `OTEL_METRICS_EXPORTER=none` the metrics push (the /metrics endpoint is configured on its own
and stays). `otlp` is the default and adds nothing: which endpoint to send to is the config's (or the
`OTEL_EXPORTER_OTLP_*` variables') to say, and `trace` exports only when one is given. The specification asks to
warn about an unknown value and go on; here it is refused (exit 2), as every other input is: a typo in a switch
should not leave telemetry flowing, or missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from retsnoop_otel.inputs.files import shown
from retsnoop_otel.runtime.config import RuntimeConfig
from retsnoop_otel.runtime.errors import InputError

_TRACES = ("otlp", "none")
_METRICS = ("otlp", "prometheus", "none")


class SdkSwitches(NamedTuple):
    traces: bool = True  # OTLP trace export (and the OTLP-JSON file) allowed
    metrics_push: bool = True  # the OTLP metrics push allowed
    why: str = ""  # the variable that turned something off, for the log


def _exporters(environ: Mapping[str, str], var: str, known: tuple[str, ...]) -> set[str]:
    text = environ.get(var, "").strip()
    names = {n.strip().lower() for n in text.split(",") if n.strip()} if text else {"otlp"}
    unknown = sorted(names - set(known))
    if unknown:
        raise InputError(f"{var}={shown(text)}: {shown(unknown[0])} is not an exporter this tool has; use "
                         f"{', '.join(known)} (console output: the trace command's own, or exporter.file)")
    if "none" in names and len(names) > 1:
        raise InputError(f"{var}={shown(text)}: 'none' together with other exporters; give none alone")
    return names


def read_switches(environ: Mapping[str, str]) -> SdkSwitches:
    """The switches the environment sets; raises InputError for a value that is not one of them."""
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip()
    if disabled.lower() not in ("", "true", "false"):
        raise InputError(f"OTEL_SDK_DISABLED={shown(disabled)}: not a boolean; write true or false")
    traces = _exporters(environ, "OTEL_TRACES_EXPORTER", _TRACES)
    metrics = _exporters(environ, "OTEL_METRICS_EXPORTER", _METRICS)
    if disabled.lower() == "true":
        return SdkSwitches(False, False, "OTEL_SDK_DISABLED=true")
    return SdkSwitches("none" not in traces, "none" not in metrics,
                       ", ".join(v for v, names in (("OTEL_TRACES_EXPORTER=none", traces),
                                                    ("OTEL_METRICS_EXPORTER=none", metrics)) if "none" in names))


def apply_switches(cfg: RuntimeConfig, switches: SdkSwitches) -> RuntimeConfig:
    """The config with the exports the switches turn off removed."""
    exporter, metrics = cfg.exporter, cfg.metrics
    if not switches.traces:
        exporter = exporter._replace(otlp=None, file=None)
    if not switches.metrics_push:
        metrics = metrics._replace(otlp=None)
    return cfg._replace(exporter=exporter, metrics=metrics)

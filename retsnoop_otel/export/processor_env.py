"""The SDK variables of the batch span processor (OTEL_BSP_*) and the periodic metric reader (OTEL_METRIC_EXPORT_*,
OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE and _DEFAULT_HISTOGRAM_AGGREGATION).

Deployments set them for every OTel-instrumented process on a host; this tool reads them the way the SDKs do
(milliseconds, integers), with two differences said where they apply: a config key given explicitly wins over
the variable (the agent's `limits.export_queue_spans`, `metrics.otlp_interval`), and with no schedule delay set
a session's spans leave as soon as it ends, not after the SDKs' 5 s (failures are rare and wanted at once; a
burst still goes out in batches, gathered while the previous request is in flight). A value that is not a
number of the right kind is, as the specification says, warned about (otel_env.EnvWarnings) and ignored: the
default applies.
"""

import math
from collections.abc import Mapping
from typing import NamedTuple

from retsnoop_otel.export.otel_env import (
    BSP_EXPORT_TIMEOUT,
    BSP_MAX_EXPORT_BATCH_SIZE,
    BSP_MAX_QUEUE_SIZE,
    BSP_SCHEDULE_DELAY,
    METRIC_EXPORT_INTERVAL,
    METRIC_EXPORT_TIMEOUT,
    METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
    METRICS_TEMPORALITY_PREFERENCE,
    EnvWarnings,
    value,
    warnings_or_new,
)

DEFAULT_QUEUE_SPANS = 65536  # ours; the SDKs' 2048 counts spans of services, not kernel call chains
DEFAULT_BATCH_SPANS = 512  # the SDKs' default too
DEFAULT_METRIC_INTERVAL_S = 60.0


class BatchSettings(NamedTuple):
    schedule_delay_s: float = 0.0  # OTEL_BSP_SCHEDULE_DELAY: how long a batch may wait to fill
    export_timeout_s: float | None = None  # OTEL_BSP_EXPORT_TIMEOUT: bounds an export, retries included
    max_queue_spans: int | None = None  # OTEL_BSP_MAX_QUEUE_SIZE
    max_batch_spans: int = DEFAULT_BATCH_SPANS  # OTEL_BSP_MAX_EXPORT_BATCH_SIZE


TEMPORALITIES = ("cumulative", "delta", "lowmemory")  # export/metrics_temporality.py applies them
HISTOGRAM_AGGREGATIONS = ("explicit_bucket_histogram", "base2_exponential_bucket_histogram")  # metrics_push.py


class ReaderSettings(NamedTuple):
    interval_s: float | None = None  # OTEL_METRIC_EXPORT_INTERVAL
    timeout_s: float | None = None  # OTEL_METRIC_EXPORT_TIMEOUT
    temporality: str = "cumulative"  # OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
    exponential: bool = False  # OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_...


def _number(environ: Mapping[str, str], var: str, what: str, example: int, warnings: EnvWarnings | None,
            zero: bool = False) -> int | None:
    """A whole number >= 1 (>= 0 with `zero`) from `var`; None when unset, empty, or no such number (warned)."""
    text = value(environ, var)
    if not text:
        return None
    if not text.isdigit() or len(text) > 12 or (int(text) == 0 and not zero):
        least = 0 if zero else 1
        warnings_or_new(warnings).ignore(var, f"not {what}; write a whole number of at least {least}, such as "
                                              f"{example}, or unset it for the default", text)
        return None
    return int(text)


def _millis(environ: Mapping[str, str], var: str, example: int, warnings: EnvWarnings | None,
            zero: bool = False) -> float | None:
    n = _number(environ, var, "a time in milliseconds", example, warnings, zero)
    return None if n is None else n / 1000.0


def batch_settings(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> BatchSettings:
    queue = _number(environ, BSP_MAX_QUEUE_SIZE, "a number of spans", 65536, warnings)
    batch = _number(environ, BSP_MAX_EXPORT_BATCH_SIZE, "a number of spans", 512, warnings)
    if batch is not None and queue is not None and batch > queue:
        warnings_or_new(warnings).ignore(BSP_MAX_EXPORT_BATCH_SIZE, f"larger than {BSP_MAX_QUEUE_SIZE}={queue}; a "
                                         "batch is taken from the queue: make it at most the queue's size", str(batch))
        batch = None
    if batch is None:
        batch = DEFAULT_BATCH_SPANS if queue is None else min(DEFAULT_BATCH_SPANS, queue)
    return BatchSettings(_millis(environ, BSP_SCHEDULE_DELAY, 5000, warnings, zero=True) or 0.0,
                         _millis(environ, BSP_EXPORT_TIMEOUT, 30000, warnings), queue, batch)


def _choice(environ: Mapping[str, str], var: str, allowed: tuple[str, ...], what: str,
            warnings: EnvWarnings | None) -> str:
    """The variable's value in lower case, "" when unset or not one of `allowed` (warned)."""
    text = value(environ, var)
    if text and text.lower() not in allowed:
        words = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
        warnings_or_new(warnings).ignore(var, f"not {what}; write {words}", text)
        return ""
    return text.lower()


def reader_settings(environ: Mapping[str, str], warnings: EnvWarnings | None = None) -> ReaderSettings:
    temporality = _choice(environ, METRICS_TEMPORALITY_PREFERENCE, TEMPORALITIES, "a temporality", warnings)
    aggregation = _choice(environ, METRICS_DEFAULT_HISTOGRAM_AGGREGATION, HISTOGRAM_AGGREGATIONS,
                          "a histogram aggregation", warnings)
    return ReaderSettings(_millis(environ, METRIC_EXPORT_INTERVAL, 60000, warnings),
                          _millis(environ, METRIC_EXPORT_TIMEOUT, 30000, warnings), temporality or "cumulative",
                          aggregation == HISTOGRAM_AGGREGATIONS[1])


def bounded(timeout_s: float, bound_s: float | None) -> float:
    """An exporter's own timeout, shortened to the processor's or reader's bound when that is set."""
    return timeout_s if bound_s is None or not math.isfinite(bound_s) else min(timeout_s, bound_s)

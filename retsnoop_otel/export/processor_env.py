"""The SDK variables of the batch span processor (OTEL_BSP_*) and the periodic metric reader (OTEL_METRIC_EXPORT_*,
OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE and _DEFAULT_HISTOGRAM_AGGREGATION).

Deployments set them for every OTel-instrumented process on a host; this tool reads them the way the SDKs do
(milliseconds, integers), with two differences said where they apply: a config key given explicitly wins over
the variable (the agent's `limits.export_queue_spans`, `metrics.otlp_interval`), and with no schedule delay set
a session's spans leave as soon as it ends, not after the SDKs' 5 s (failures are rare and wanted at once; a
burst still goes out in batches, gathered while the previous request is in flight). A value that is not a
number of the right kind is refused (OtlpConfigError), as every other input is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from retsnoop_otel.export.otlp_settings import OtlpConfigError
from retsnoop_otel.inputs.files import shown

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


def _number(environ: Mapping[str, str], var: str, what: str, example: int, zero: bool = False) -> int | None:
    """A whole number >= 1 (>= 0 with `zero`) from `var`; None when unset or empty."""
    text = environ.get(var, "").strip()
    if not text:
        return None
    if not text.isdigit() or len(text) > 12 or (int(text) == 0 and not zero):
        least = 0 if zero else 1
        raise OtlpConfigError(f"{var}={shown(text)}: not {what}; write a whole number of at least {least}, such as "
                              f"{example}, or unset it for the default")
    return int(text)


def _millis(environ: Mapping[str, str], var: str, example: int, zero: bool = False) -> float | None:
    n = _number(environ, var, "a time in milliseconds", example, zero)
    return None if n is None else n / 1000.0


def batch_settings(environ: Mapping[str, str]) -> BatchSettings:
    queue = _number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", "a number of spans", 65536)
    batch = _number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "a number of spans", 512)
    if batch is not None and queue is not None and batch > queue:
        raise OtlpConfigError(f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={batch} is larger than OTEL_BSP_MAX_QUEUE_SIZE={queue}; "
                              "a batch is taken from the queue: make it at most the queue's size")
    return BatchSettings(_millis(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000, zero=True) or 0.0,
                         _millis(environ, "OTEL_BSP_EXPORT_TIMEOUT", 30000), queue,
                         DEFAULT_BATCH_SPANS if batch is None else batch)


def reader_settings(environ: Mapping[str, str]) -> ReaderSettings:
    var = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    temporality = environ.get(var, "").strip()
    if temporality and temporality.lower() not in TEMPORALITIES:
        raise OtlpConfigError(f"{var}={shown(temporality)}: not a temporality; write {', '.join(TEMPORALITIES)}")
    var = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    aggregation = environ.get(var, "").strip()
    if aggregation and aggregation.lower() not in HISTOGRAM_AGGREGATIONS:
        raise OtlpConfigError(f"{var}={shown(aggregation)}: not a histogram aggregation; write "
                              f"{' or '.join(HISTOGRAM_AGGREGATIONS)}")
    return ReaderSettings(_millis(environ, "OTEL_METRIC_EXPORT_INTERVAL", 60000),
                          _millis(environ, "OTEL_METRIC_EXPORT_TIMEOUT", 30000), temporality.lower() or "cumulative",
                          aggregation.lower() == HISTOGRAM_AGGREGATIONS[1])


def bounded(timeout_s: float, bound_s: float | None) -> float:
    """An exporter's own timeout, shortened to the processor's or reader's bound when that is set."""
    return timeout_s if bound_s is None or not math.isfinite(bound_s) else min(timeout_s, bound_s)

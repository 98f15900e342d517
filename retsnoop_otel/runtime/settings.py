"""A run's settings resolved once: the config, with what the environment and the files it names add.

Every part of the run reads its settings from here (the sinks, the metrics push, the /metrics
server, the pod watch), so each OTLP endpoint, each OTEL_* variable and the web config file is
read and checked in one place, before anything is bound, opened or loaded into the kernel; a start
and a reload resolve the same way. Nothing here binds, opens for writing or touches the kernel.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from retsnoop_otel.export.otlp_settings import (
    OtlpConfig,
    OtlpConfigError,
    OtlpSettings,
    attribute_count_limit,
    attribute_value_limit,
    resolve_settings,
)
from retsnoop_otel.export.processor_env import BatchSettings, ReaderSettings, batch_settings, bounded, reader_settings
from retsnoop_otel.export.resource import resource_attributes_problem
from retsnoop_otel.inputs.files import shown
from retsnoop_otel.runtime.config import RuntimeConfig, SymbolsConfig
from retsnoop_otel.runtime.environment import cgroup_target
from retsnoop_otel.runtime.errors import InputError
from retsnoop_otel.runtime.sdk_env import apply_switches, read_switches
from retsnoop_otel.symbols import discovery
from retsnoop_otel.workload.k8s_settings import KubeConfigError, KubeSettings, resolve_kubernetes


class RunSettings(NamedTuple):
    config: RuntimeConfig  # with the exports OTEL_SDK_DISABLED / OTEL_*_EXPORTER=none turn off removed
    vmlinux: str | None  # the DWARF vmlinux found for config.symbols
    traces: OtlpSettings | None  # exporter.otlp resolved; its timeout bounded by OTEL_BSP_EXPORT_TIMEOUT
    metrics: OtlpSettings | None  # metrics.otlp resolved; its timeout bounded by OTEL_METRIC_EXPORT_TIMEOUT
    batch: BatchSettings  # OTEL_BSP_*
    reader: ReaderSettings  # OTEL_METRIC_EXPORT_*, temporality and histogram aggregation
    attr_limits: tuple[int | None, int | None]  # OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT, _COUNT_LIMIT
    web: Any  # metrics.web_config.WebConfig loaded with its certificates; None without a web config
    kube: KubeSettings | None  # the pod watch's settings; None when it is off
    switched_off: str = ""  # the variables that turned an export off, for the log


def otlp_settings(cfg: OtlpConfig, signal: str, names: Mapping[str, str],
                  environ: Mapping[str, str] = os.environ) -> OtlpSettings:
    """The one endpoint check: config, then OTEL_EXPORTER_OTLP_* variables, as the specification orders them."""
    try:
        return resolve_settings(cfg, signal, environ, names)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def attribute_limits(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT and OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT, or the input error they are."""
    try:
        return attribute_value_limit(environ), attribute_count_limit(environ)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def processor_env(environ: Mapping[str, str]) -> tuple[BatchSettings, ReaderSettings]:
    """OTEL_BSP_* and OTEL_METRIC_EXPORT_*, or the input error they are."""
    try:
        return batch_settings(environ), reader_settings(environ)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def check_resource_attributes(environ: Mapping[str, str]) -> None:
    """OTEL_RESOURCE_ATTRIBUTES that cannot be read is an input error (export.resource says why)."""
    attrs = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    problem = resource_attributes_problem(attrs)
    if problem:
        raise InputError(f"OTEL_RESOURCE_ATTRIBUTES={shown(attrs)}: {problem}; write it like key1=value1,key2=value2 "
                         "with each value percent-encoded")


def _check_probe_sets(cfg: RuntimeConfig, root: str) -> None:
    for ps in cfg.probe_sets:
        try:
            for glob in discovery.expand_glob_args([*ps.entry, *ps.allow, *ps.deny]):
                discovery.parse_glob(glob)
        except discovery.DiscoveryError as exc:
            raise InputError(str(exc), ps.name) from None
        if ps.workload_label == "namespace" and not cfg.kubernetes.metadata:
            raise InputError("workload_label: namespace: the namespace comes from the pod metadata watch; turn "
                             "it on with kubernetes.metadata: true, or use workload_label: container", ps.name)
        if ps.cgroup:
            try:
                cgroup_target(ps.cgroup, cfg.names.cgroup, root)
            except InputError as exc:
                raise exc.for_set(ps.name) from None


def _web(cfg: RuntimeConfig) -> Any:
    if cfg.metrics.port is None or not cfg.metrics.web_config_file:
        return None
    from retsnoop_otel.metrics.web_config import WebConfigError
    from retsnoop_otel.metrics.web_tls import load_web_config
    try:
        return load_web_config(cfg.metrics.web_config_file)
    except WebConfigError as exc:
        raise InputError(f"{cfg.names.web_config}: {exc}") from None


def run_settings(cfg: RuntimeConfig, environ: Mapping[str, str], root: str,
                     find_vmlinux: Callable[[SymbolsConfig, str], str | None]) -> RunSettings:
    """Raises InputError (exit 2) for the first input that cannot work, naming it as the user wrote it."""
    switches = read_switches(environ)
    cfg = apply_switches(cfg, switches)
    _check_probe_sets(cfg, root)
    exports_traces = cfg.exporter.otlp is not None or bool(cfg.exporter.file)
    exports = exports_traces or cfg.metrics.otlp is not None
    batch, reader = processor_env(environ if exports else {})
    traces = metrics = None
    if cfg.exporter.otlp is not None:
        traces = otlp_settings(cfg.exporter.otlp, "traces", cfg.names.otlp, environ)
        traces = traces._replace(timeout_s=bounded(traces.timeout_s, batch.export_timeout_s))
    if cfg.metrics.otlp is not None:
        metrics = otlp_settings(cfg.metrics.otlp, "metrics", cfg.names.metrics_otlp, environ)
        metrics = metrics._replace(timeout_s=bounded(metrics.timeout_s, reader.timeout_s))
    limits = attribute_limits(environ) if exports_traces else (None, None)
    if exports:
        check_resource_attributes(environ)
    web = _web(cfg)
    try:
        kube = resolve_kubernetes(cfg.kubernetes, environ, root=root)
    except KubeConfigError as exc:
        raise InputError(str(exc)) from None
    return RunSettings(cfg, find_vmlinux(cfg.symbols, cfg.names.vmlinux), traces, metrics, batch, reader, limits,
                       web, kube, switches.why)

"""A run's settings resolved once: the config, with what the environment and the files it names add.

Every part of the run reads its settings from here (the sinks, the metrics push, the /metrics
server, the pod watch), so each OTLP endpoint, each OTEL_* variable and the web config file is
read and checked in one place, before anything is bound, opened or loaded into the kernel; a start
and a reload resolve the same way. Nothing here binds, opens for writing or touches the kernel.
A config key or flag that cannot work is an InputError (exit 2); an OTEL_* variable that cannot is
one of RunSettings.warnings and counts as unset (export/otel_env.py), which the runtime says at start; a run
that does not export still checks the variables it does not read (check_unused), as docs/reference/environment.md says.
"""

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from retsnoop_otel.command.errors import InputError
from retsnoop_otel.export.otel_env import (
    RESOURCE_ATTRIBUTES,
    EnvWarnings,
    exemplars_on,
    log_level,
    samplers_not_used,
)
from retsnoop_otel.export.otlp_settings import SIGNALS, OtlpConfig, OtlpConfigError, OtlpSettings, resolve_settings
from retsnoop_otel.export.processor_env import BatchSettings, ReaderSettings, batch_settings, bounded, reader_settings
from retsnoop_otel.export.resource import resource_attributes_problem
from retsnoop_otel.export.span_limits import SpanLimits, span_limits
from retsnoop_otel.inputs.files import shown
from retsnoop_otel.inputs.tls_files import TlsReads
from retsnoop_otel.kernel import attach_modes
from retsnoop_otel.kernel.kcache import CACHE_VARIABLE, cache_base, cache_dir_problem
from retsnoop_otel.runtime.config import RuntimeConfig, SymbolsConfig
from retsnoop_otel.runtime.environment import cgroup_target
from retsnoop_otel.runtime.sdk_env import apply_switches, read_switches
from retsnoop_otel.symbols import discovery
from retsnoop_otel.workload.k8s_settings import KubeConfigError, KubeSettings, resolve_kubernetes


class RunSettings(NamedTuple):
    config: RuntimeConfig  # with the exports OTEL_SDK_DISABLED / OTEL_*_EXPORTER turn off removed (or added)
    vmlinux: str | None  # the DWARF vmlinux found for config.symbols
    traces: OtlpSettings | None  # exporter.otlp resolved; its timeout bounded by OTEL_BSP_EXPORT_TIMEOUT
    metrics: OtlpSettings | None  # metrics.otlp resolved; its timeout bounded by OTEL_METRIC_EXPORT_TIMEOUT
    batch: BatchSettings  # OTEL_BSP_*
    reader: ReaderSettings  # OTEL_METRIC_EXPORT_*, temporality and histogram aggregation
    span_limits: SpanLimits  # OTEL_(SPAN_)ATTRIBUTE_*_LIMIT, OTEL_SPAN_EVENT_COUNT_LIMIT, OTEL_EVENT_ATTRIBUTE_...
    web: Any  # metrics.web_config.WebConfig loaded with its certificates; None without a web config
    kube: KubeSettings | None  # the pod watch's settings; None when it is off
    switched_off: str = ""  # the variables that turned an export off, for the log
    warnings: tuple[str, ...] = ()  # the OTEL_* values ignored, one line per variable (otel_env.EnvWarnings)
    exemplars: bool = True  # OTEL_METRICS_EXEMPLAR_FILTER is not always_off


def otlp_settings(cfg: OtlpConfig, signal: str, names: Mapping[str, str], environ: Mapping[str, str],
                  warnings: EnvWarnings | None = None, tls_reads: TlsReads | None = None) -> OtlpSettings:
    """The one endpoint check: config, then OTEL_EXPORTER_OTLP_* variables, as the specification orders them."""
    try:
        return resolve_settings(cfg, signal, environ, names, warnings, tls_reads)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def check_resource_attributes(environ: Mapping[str, str], warnings: EnvWarnings) -> None:
    """OTEL_RESOURCE_ATTRIBUTES that cannot be read is discarded (export.resource), with a warning."""
    attrs = environ.get(RESOURCE_ATTRIBUTES, "")
    problem = resource_attributes_problem(attrs)
    if problem:
        warnings.ignore(RESOURCE_ATTRIBUTES, f"{problem}; write it like key1=value1,key2=value2 with each value "
                        "percent-encoded")  # the value not shown: its values may hold secrets


def check_unused(environ: Mapping[str, str], warnings: EnvWarnings, used: set[str], tls_reads: TlsReads) -> None:
    """The OTEL_* variables a run does not read because it does not export (a text-only trace, an agent without
    OTLP): checked all the same, so that a value that cannot work is warned about before the run that would use it,
    not found then. `used`: what this run read already ("batch", "reader", "limits", "resource", and the signals it
    exports). Only the warnings are kept; no export module is imported (export/ readers use the standard library)."""
    if "batch" not in used:
        batch_settings(environ, warnings)
    if "reader" not in used:
        reader_settings(environ, warnings)
    if "limits" not in used:
        span_limits(environ, warnings)
        exemplars_on(environ, warnings)
    if "resource" not in used:
        check_resource_attributes(environ, warnings)
    for signal in SIGNALS:
        if signal not in used:  # no config values: only the variables' own problems, which go to the warnings
            resolve_settings(OtlpConfig(), signal, environ, None, warnings, tls_reads)


def _check_probe_sets(cfg: RuntimeConfig, root: str) -> None:
    for ps in cfg.probe_sets:
        try:
            for glob in (*ps.entry, *ps.allow, *ps.deny):  # '@file' globs: expanded by the input layer
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
        mode = attach_modes.BY_NAME.get(ps.attach_mode)
        if mode and not mode.sessions and (conflict := _counts_only_conflict(ps, mode, cfg.names.attach_mode)):
            raise InputError(conflict, ps.name)


# what needs the sessions a counting mode (--origins-only) does not keep: (whether the set asks for it, its config
# key, its trace flag)
_SESSION_SETTINGS: tuple[tuple[Callable[[Any], bool], str, str], ...] = (
    (lambda ps: ps.mode == "calls", "mode: calls", "-T"),
    (lambda ps: ps.capture_args, "capture_args", "-A"),
    (lambda ps: bool(ps.inject), "inject", "-J"),
    (lambda ps: bool(ps.lbr_branch_types), "lbr", "--lbr"),
    (lambda ps: ps.user_stacks, "user_stacks", "-U"),
    (lambda ps: ps.sampling.captures_success, "sampling", "-S"),
    (lambda ps: ps.workload_label is not None, "workload_label", "--workload-label"),
    (lambda ps: any(g.startswith("u:") for g in (*ps.entry, *ps.allow)), "u:BINARY:GLOB functions",
     "u:BINARY:GLOB functions"),
)


def _counts_only_conflict(ps: Any, kmode: Any, attach_name: str) -> str | None:
    """The first setting of the set that needs sessions, which counting origins from the returns does not keep."""
    by_flag = attach_name.startswith("-")  # trace names its settings by flag
    mode = kmode.flags[0] if by_flag else f"attach_mode: {kmode.name}"
    if not ps.syscalls:  # one syscall per chain (bpf/origins.bpf.h): entry functions that never nest
        return (f"{mode} counts error origins per syscall, over the syscall preset's functions: add "
                f"{'--syscalls' if by_flag else 'syscalls: true'} (and filter with -n, -p or --cgroup)")
    if ps.entry:
        what = "-e" if by_flag else "entry"
        return (f"{mode} takes its entry functions from the syscall preset (every syscall), which never call each "
                f"other: drop {what} (add functions to look into with {'-a' if by_flag else 'allow'})")
    for asks, key, flag in _SESSION_SETTINGS:
        if asks(ps):
            what = flag if by_flag else key
            return (f"{mode} counts error origins from the functions' returns and keeps no sessions, so {what} has "
                    f"nothing to record: drop {what}, or use another attach mode")
    return None


def _web(cfg: RuntimeConfig, tls_reads: TlsReads) -> Any:
    if cfg.metrics.port is None or not cfg.metrics.web_config_file:
        return None
    from retsnoop_otel.metrics.web_config import WebConfigError
    from retsnoop_otel.metrics.web_tls import load_web_config
    try:
        return load_web_config(cfg.metrics.web_config_file, tls_reads)
    except WebConfigError as exc:
        raise InputError(f"{cfg.names.web_config}: {exc}") from None


def run_settings(cfg: RuntimeConfig, environ: Mapping[str, str], root: str,
                 find_vmlinux: Callable[[SymbolsConfig, str], str | None]) -> RunSettings:
    """Raises InputError (exit 2) for the first input that cannot work, naming it as the user wrote it; the
    OTEL_* values that cannot work are in the result's warnings, each variable once, and count as unset."""
    warnings = EnvWarnings()
    switches = read_switches(environ, warnings)
    cfg = apply_switches(cfg, switches)
    cache_dir = environ.get(CACHE_VARIABLE, "")
    problem = cache_dir_problem(cache_dir) if cache_dir else None
    if problem:  # this tool's own variable (not an OTEL_* one): refused, as a flag would be
        raise InputError(f"{CACHE_VARIABLE}={shown(cache_dir)}: {problem} (it names the cache's directory; unset "
                         "it for the default)")
    cfg = cfg._replace(symbols=cfg.symbols._replace(cache_dir=str(cache_base(cfg.symbols.cache_dir, environ))))
    log_level(environ, warnings)  # the agent's default log level (agent/main.py): warned about here, with the rest
    _check_probe_sets(cfg, root)
    exports_traces = cfg.exporter.spans
    exports = exports_traces or cfg.metrics.otlp is not None
    batch, reader = (batch_settings(environ, warnings), reader_settings(environ, warnings)) if exports \
        else (BatchSettings(), ReaderSettings())
    traces = metrics = None
    tls_reads = TlsReads()  # a certificate that both exporters (or one and the web config) name is read once
    if cfg.exporter.otlp is not None:
        traces = otlp_settings(cfg.exporter.otlp, "traces", cfg.names.otlp, environ, warnings, tls_reads)
        traces = traces._replace(timeout_s=bounded(traces.timeout_s, batch.export_timeout_s))
        if cfg.exporter.otlp_needs_endpoint and traces.endpoint_from == "default":  # its variables were ignored
            traces, cfg = None, cfg._replace(exporter=cfg.exporter._replace(otlp=None))
    if cfg.metrics.otlp is not None:
        metrics = otlp_settings(cfg.metrics.otlp, "metrics", cfg.names.metrics_otlp, environ, warnings, tls_reads)
        metrics = metrics._replace(timeout_s=bounded(metrics.timeout_s, reader.timeout_s))
    limits = span_limits(environ, warnings) if exports_traces else SpanLimits()
    exemplars = exemplars_on(environ, warnings) if exports_traces else True
    if exports_traces:
        samplers_not_used(environ, warnings)
    if exports:
        check_resource_attributes(environ, warnings)
    used = {*(("batch", "reader", "resource") if exports else ()), *(("limits",) if exports_traces else ()),
            *(("traces",) if traces is not None else ()), *(("metrics",) if metrics is not None else ())}
    check_unused(environ, warnings, used, tls_reads)
    web = _web(cfg, tls_reads)
    try:
        kube = resolve_kubernetes(cfg.kubernetes, environ, root=root)
    except KubeConfigError as exc:
        raise InputError(str(exc)) from None
    return RunSettings(cfg, find_vmlinux(cfg.symbols, cfg.names.vmlinux), traces, metrics, batch, reader, limits,
                       web, kube, switches.why, warnings.messages, exemplars)

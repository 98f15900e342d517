"""The OTLP unit of every metric family, for the OTLP push (export/metrics_push.py).

Prometheus names carry the unit (`_seconds`) and the type (`_total`); OTLP carries them as fields,
and the Collector's Prometheus translation (collector-contrib pkg/translator/prometheus, the same
rules in prometheus/otlptranslator) puts them back: a UCUM unit it knows becomes a suffix (s ->
`_seconds`, By -> `_bytes`) unless the name already has it, a curly-brace annotation (`{call}`) is
dropped, a monotonic sum gains `_total`, and a gauge of unit "1" gains `_ratio`. So counts get the
curly-brace unit of what they count, and no family uses "1": the translated names are exactly the
ones /metrics exposes and the dashboards query (tests/unit/test_export_conventions.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

OTLP_UNITS: Mapping[str, str] = MappingProxyType({
    # kernel_families: per probe set, read from the BPF maps
    "retsnoop_function_calls": "{call}",
    "retsnoop_function_errors": "{error}",  # failing returns
    "retsnoop_function_duration_seconds": "s",
    "retsnoop_sessions": "{session}",
    "retsnoop_session_duration_seconds": "s",
    "retsnoop_bpf_program_runs": "{run}",
    "retsnoop_bpf_program_run_seconds": "s",
    "retsnoop_sessions_dropped": "{session}",
    "retsnoop_sessions_incomplete": "{session}",
    "retsnoop_records_lost": "{record}",
    "retsnoop_sessions_started": "{session}",
    "retsnoop_sessions_reported": "{session}",
    "retsnoop_workload_counts_dropped": "{call}",  # calls, and sessions (entry calls)
    "retsnoop_error_origins": "{session}",  # failing sessions
    "retsnoop_error_origins_dropped": "{session}",
    "retsnoop_attached_functions": "{function}",
    "retsnoop_sessions_not_exported": "{session}",
    "retsnoop_sessions_evicted": "{session}",
    # runtime_families: the run as a whole
    "retsnoop_spans_exported": "{span}",
    "retsnoop_spans_dropped": "{span}",
    "retsnoop_export_errors": "{request}",  # failed export requests
    "retsnoop_traces": "{trace}",
    "retsnoop_session_errors": "{session}",
    "retsnoop_config_reloads": "{reload}",
    "retsnoop_app_context_sessions": "{session}",
    "retsnoop_app_context_processes_checked": "{process}",
    "retsnoop_app_context_processes_publishing": "{process}",
    "retsnoop_app_context_check_errors": "{process}",
    "retsnoop_app_context_exec_watches": "{process}",
    "retsnoop_user_stacks_unsymbolized": "{session}",
    "retsnoop_k8s_metadata_current": "",  # a switch (0/1)
    "retsnoop_k8s_watch_errors": "{error}",
    "retsnoop_k8s_pod_lists": "{request}",
    "retsnoop_k8s_pods": "{pod}",
    "retsnoop_agent_up": "{agent}",  # summed over a fleet: the agents running
    "retsnoop_build_info": "{agent}",  # summed per version: the agents running it
    "retsnoop_bpf_stats_enabled": "",  # a switch (0/1), neither a count nor a ratio
    # prometheus_client's ProcessCollector: the agent process itself
    "process_cpu_seconds": "s",
    "process_virtual_memory_bytes": "By",
    "process_resident_memory_bytes": "By",
    "process_start_time_seconds": "s",
    "process_open_fds": "{file_descriptor}",
    "process_max_fds": "{file_descriptor}",
})

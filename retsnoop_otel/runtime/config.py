"""What the capture runtime runs: probe sets, outputs, metrics, limits and symbols, as plain data.

Immutable values as NamedTuples, not frozen data classes: Python 3.11 compiles a frozen data class's
methods as its module loads, which made these classes a large part of every start's imports (and its
module pulls inspect, ast, dis and tokenize).

Both commands produce this: `agent` from its YAML file (agent/config_file.py), `trace` from its
flags (trace/options.py, one ad-hoc probe set). Nothing here reads files or the environment.
"""

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.capture.inject import InjectSpec
from retsnoop_otel.capture.records import ArgSizes
from retsnoop_otel.capture.sampling import Sampling
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.kernel import attach_modes
from retsnoop_otel.metrics.buckets import DurationRange
from retsnoop_otel.render.formats import ArgsFormat, StackFormat
from retsnoop_otel.workload.k8s_settings import KubernetesConfig

PROBE_MODES = ("stack", "calls", "metrics")
WORKLOAD_LABELS = ("namespace", "container")  # a probe set's metrics labelled by Kubernetes namespace or container
ATTACH_MODES = ("auto", *attach_modes.ASKED)
USER_ATTACH_MODES = ("auto", *attach_modes.USER_NAMES)


class ProbeSetConfig(NamedTuple):
    """One named set of traced functions and what to keep of their sessions.

    mode: `stack` reports the error chain and kernel stack; `calls` also every traced call;
    `metrics` reports nothing (counted in the kernel only).
    """

    name: str
    entry: tuple[str, ...] = ()  # globs as values: each '@file' was replaced by its lines where the input was parsed
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    mode: str = "stack"
    attach_mode: str = "auto"
    user_attach_mode: str = "auto"  # user-space functions (u:BINARY:GLOB): kernel/uprobes.py USER_MODES
    pids: tuple[int, ...] = ()
    no_pids: tuple[int, ...] = ()
    comms: tuple[str, ...] = ()
    no_comms: tuple[str, ...] = ()
    cgroup: str | None = None
    min_duration_ns: int = 0
    errors: ErrorFilter = ErrorFilter()
    sampling: Sampling = Sampling()
    lbr_branch_types: int = 0  # perf branch types snapshotted at the deepest failing return; 0 = no LBR
    capture_args: bool = False  # BTF-typed arguments with each call (kernel memory: off unless asked)
    app_context: bool = True  # join the application's trace when its thread publishes OTel thread context
    user_stacks: bool = False  # the user-space stack of the thread that entered the entry function
    arg_sizes: ArgSizes = ArgSizes()  # how much of each argument -A copies
    duration_range: DurationRange | None = None  # histogram buckets; None: metrics.duration_range
    workload_label: str | None = None  # calls, errors and sessions also counted per namespace or container
    inject: tuple[InjectSpec, ...] = ()  # -J: probes recorded inside sessions (kprobe, kretprobe, rawtp, tp)
    syscalls: bool = False  # the syscall preset (symbols/syscall_preset.py): entry and allow add to its functions
    syscalls_budget: int = 1000  # the preset's allow functions at most (syscall_preset.DEFAULT_BUDGET)

    @property
    def records_calls(self) -> bool:
        """Arguments and injected probes travel with the per-call records, so either records calls too."""
        return self.mode == "calls" or self.capture_args or bool(self.inject)


class ConsoleConfig(NamedTuple):
    """Sessions as text on stdout, in retsnoop's layouts."""

    format: str = "text"  # text | json (one object per session)
    view: str = "auto"  # stack | calls (the -T table) | auto: calls for probe sets in mode calls
    call_stack: bool = False  # the stack under the calls table too (-E)
    lbr_max_count: int = 0  # 0: every relevant LBR record
    prefix: bool = False  # '[probe set] ' before each session, when several sets share the console
    stacks: StackFormat = StackFormat()
    args: ArgsFormat = ArgsFormat()


class ExporterConfig(NamedTuple):
    otlp: OtlpConfig | None = OtlpConfig()
    file: str | None = None  # OTLP-JSON lines, one export request per line
    console: ConsoleConfig | None = None
    trace_json: str | None = None  # Chrome trace events of call sessions (Perfetto)
    export_addresses: bool = False  # raw kernel addresses in exported data (they reveal KASLR)
    service_name_from: str = "workload"  # export/service_name.py: the session's service, or "agent": ours
    otlp_console: bool = False  # OTEL_TRACES_EXPORTER=console: each export request as an OTLP/JSON line on stdout
    otlp_needs_endpoint: bool = False  # trace: OTLP only to an endpoint given (flag or variable), never the default

    @property
    def spans(self) -> bool:
        """Whether sessions are encoded as OTLP spans: for an OTLP exporter, the OTLP-JSON file or the console."""
        return self.otlp is not None or self.file is not None or self.otlp_console


class MetricsConfig(NamedTuple):
    host: str = "0.0.0.0"
    port: int | None = 9464  # None: no /metrics and /healthz endpoint
    stall_after_s: float = 30.0  # /healthz answers 503 when the capture loop has not polled for this long
    otlp: OtlpConfig | None = None  # also push the metrics over OTLP (for users without Prometheus)
    otlp_interval_s: float | None = None  # None: OTEL_METRIC_EXPORT_INTERVAL, else 60 s
    max_error_types: int = 0  # per function; 0 = every error type gets its own series
    functions: tuple[str, ...] = ()  # globs of functions with their own series; () = all
    duration_range: DurationRange | None = None  # histogram buckets of probe sets without one; None: all slots
    max_workloads: int = 100  # workload label values with series of their own, per probe set; the rest: "other"
    web_config_file: str | None = None  # exporter-toolkit web config: TLS and basic auth for /metrics and /healthz

    @property
    def listen(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def read(self) -> bool:
        """Whether anything reads the kernel's per-function counts (a /metrics endpoint or an OTLP push):
        without a reader they are not kept, which saves a map update per traced call."""
        return self.port is not None or self.otlp is not None


class Limits(NamedTuple):
    max_spans_per_trace: int = 4096  # exported spans per session
    max_calls_per_session: int = 4096  # calls kept per session in user space (the rest are counted)
    export_queue_spans: int | None = None  # None: OTEL_BSP_MAX_QUEUE_SIZE, else 65536
    ringbuf_size: int = 8 << 20
    max_sessions: int = 4096  # threads with a kernel session entry (LRU: the longest idle make room); open sessions
    user_stack_wait_s: float = 1.0  # a session's export waits this long for its user stack's symbols (appctx/stacks)


class SymbolsConfig(NamedTuple):
    vmlinux: str | None = None  # None: kallsyms names only; "auto": the standard places; else a path
    source_lines: bool = True  # file:line from DWARF in stacks (when a vmlinux is found)
    inlines: bool = True  # inlined frames too
    cache_dir: str | None = None  # kernel facts cache (kernel/kcache.py); None: the user's XDG cache, resolved
    # with RETSNOOP_OTEL_CACHE from the run's environment by runtime/settings.py


def _names(prefix: str) -> Mapping[str, str]:
    fields = ("endpoint", "protocol", "headers", "compression", "timeout_s", "insecure", "certificate",
              "client_key", "client_certificate")
    return MappingProxyType({f: prefix + ("timeout" if f == "timeout_s" else f) for f in fields})


class InputNames(NamedTuple):
    """How the user wrote each setting, so that errors name it: YAML keys for agent, flags for trace."""

    otlp: Mapping[str, str] = _names("exporter.otlp.")
    metrics_otlp: Mapping[str, str] = _names("metrics.otlp.")
    listen: str = "metrics.listen"
    listen_host: str = "metrics.listen"  # what names the address alone (trace: --metrics-addr)
    web_config: str = "metrics.web_config_file"
    trace_json: str = "exporter.trace_json"
    file: str = "exporter.file"
    vmlinux: str = "vmlinux"
    cgroup: str = "filters.cgroup"
    lbr: str = "lbr"
    attach_mode: str = "attach_mode"


class RuntimeConfig(NamedTuple):  # agent/config_file.py: AgentConfig holds one, with what only the agent has
    probe_sets: tuple[ProbeSetConfig, ...]
    exporter: ExporterConfig = ExporterConfig()
    metrics: MetricsConfig = MetricsConfig()
    limits: Limits = Limits()
    symbols: SymbolsConfig = SymbolsConfig()
    names: InputNames = InputNames()
    kubernetes: KubernetesConfig = KubernetesConfig()  # the pod metadata watch (off)


AGENT_NAMES = InputNames()  # the YAML keys: the default way settings are named

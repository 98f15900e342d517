"""The agent file's sections, each key declared once (a Key of its Section, runtime/config_keys.py): its reader,
range or choices, doc line and the `trace` flag that sets the same value (a Flag); its default is its target's
field default (runtime/config.py). agent/config_file.py reads the file by these declarations, trace/flags.py makes
its flags from them (runtime/config_flags.py), and the reference table of docs/reference/config.md and
config/agent.schema.json are made from them. A new key: its Key here, the field it sets, its consumer and its
test (then `python -m tests.gen_docs_reference`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.export.service_name import SERVICE_NAME_FROM
from retsnoop_otel.inputs.files import shown
from retsnoop_otel.inputs.numbers import COUNT, MAP_ENTRIES, RINGBUF_BYTES, parse_float
from retsnoop_otel.kernel import attach_modes
from retsnoop_otel.runtime.config import (
    ATTACH_MODES,
    PROBE_MODES,
    USER_ATTACH_MODES,
    WORKLOAD_LABELS,
    ConsoleConfig,
    ExporterConfig,
    Limits,
    MetricsConfig,
    ProbeSetConfig,
)
from retsnoop_otel.runtime.config_keys import (
    BOOL,
    OPT_STR,
    STR,
    STRS,
    Flag,
    Key,
    Kind,
    Section,
    choices,
    integer_in,
    into,
    nested,
    num,
    read_section,
    size_in,
)
from retsnoop_otel.runtime.config_kubernetes import KUBERNETES, parse_kubernetes
from retsnoop_otel.runtime.config_values import (
    DURATION_RANGE_KIND,
    INJECT,
    LBR,
    LISTEN,
    PIDS,
    SAMPLING_KIND,
    otlp_kind,
    otlp_section,
)
from retsnoop_otel.runtime.yaml_nodes import Nodes, got, items, kind, scalar, yaml
from retsnoop_otel.symbols.discovery import DiscoveryError, expand_glob_args, parse_glob
from retsnoop_otel.symbols.syscall_preset import BUDGET as SYSCALLS_BUDGET

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # fullmatch: '$' would let a trailing newline through
_NAMES = "repeatable; @FILE: its lines"
_LBR_TYPES = ("-B alone: any_return; or any, any_call, any_return, cond, call, ind_call, ind_jump, call_stack, "
              "abort_tx, in_tx, no_tx, or a number; needs a CPU exposing LBR")
_DAY_S = 86400.0  # the longest stall or push interval that means anything (1e30 was taken)
_MAX_MS = float((1 << 63) // 1_000_000)  # milliseconds whose nanoseconds fit the kernel's 64-bit durations


def _positive_ms(text: str) -> float:
    """-L as retsnoop reads it: above 0 (the file's 0 is no filter, the key's default)."""
    return parse_float(text, 0, _MAX_MS, "milliseconds")


class LoggingConfig(NamedTuple):
    format: str = "text"
    level: str | None = None  # None: not in the file; OTEL_LOG_LEVEL, else info (agent/main.py)



# ---- sections ------------------------------------------------------------------------------------


def _globs(ctx: Nodes, node: yaml.Node, key: str) -> tuple[str, ...]:
    """The globs in order, each '@file' replaced by its lines: a glob file is read and checked here, once per load
    of the config however many keys name it, and nothing after this reads it again (the runtime gets the globs as
    values; a reload loads the config, and so its glob files, anew)."""
    def one(n: yaml.Node, k: str) -> tuple[str, ...]:
        text = scalar(ctx, n, k, (str,), "a glob string")
        if ("globs", text) in ctx.files:
            return ctx.files["globs", text]
        try:
            globs = tuple(expand_glob_args([text]))  # '@file' globs: the file must exist and parse too
            for g in globs:
                parse_glob(g)
        except DiscoveryError as exc:
            raise ctx.fail(n, k, f"{exc}") from None
        if text.startswith("@"):
            ctx.files["globs", text] = globs
        return globs

    if isinstance(node, yaml.ScalarNode) and kind(node) not in ("string", "null"):
        raise ctx.fail(node, key, f"expected a list of globs, got {got(ctx, node)}")
    parts = items(ctx, node, key, one, "a list of globs")
    return parts[0] if len(parts) == 1 else tuple(g for globs in parts for g in globs)


# ---- the keys: each declared once (config_keys), its default the field default of its target ---------------


def _valid_name(name: str) -> str | None:
    return None if _NAME.fullmatch(name) else (f"{shown(name)} is not a valid name: use 1-64 letters, digits, "
                                               "'_', '-' or '.'")


def _no_empty(what: str, example: str) -> Callable[[Any], str | None]:
    """A key's check that refuses an empty string (a one-item list of one too, as a repeated flag's item is
    checked): empty, it would match nothing or silently mean the default."""
    def check(value: Any) -> str | None:
        values = value if isinstance(value, (tuple, list)) else (value,)
        return f"an empty {what}: give {example}" if any(isinstance(v, str) and not v.strip() for v in values) \
            else None
    return check


def _errors_check(values: Any) -> str | None:
    """-x/-X and allow_errors/deny_errors: no empty name, nor an empty part of a comma-separated list."""
    if any(not part.strip() for v in values for part in v.split(",")):
        return "an empty error name: use errno names such as EINVAL, -ENOMEM, NULL or any"
    return None


def _vmlinux_check(path: str | None) -> str | None:
    if path in (None, "auto"):
        return None
    if not path.strip():
        return ("an empty path: give a vmlinux with DWARF, 'auto' to search the standard places, or leave it "
                "out")
    if os.path.isfile(path):
        return None
    return (f"{shown(path, quote=False)}: no such file (give a vmlinux with DWARF, 'auto' to search the standard "
            "places, or leave it out)")


def _vmlinux_text(text: str) -> str:
    """-k's text: checked for what it is (not empty) here, for where it points by the runtime (naming -k)."""
    if not text.strip():
        raise ValueError(_vmlinux_check(text))
    return text


GLOBS = Kind(lambda ctx, node, key, _m: _globs(ctx, node, key), "list of globs (@FILE too)", STRS.schema)

FILTERS = Section("filters", ProbeSetConfig, (
    Key("pids", PIDS, "only these processes", flag=Flag(("-p", "--pid"), "pid", "append", "repeatable", "PID")),
    Key("no_pids", PIDS, "never these processes",
        flag=Flag(("-P", "--no-pid"), "no_pid", "append", "repeatable", "PID")),
    Key("comms", STRS, "only threads of these names", flag=Flag(("-n", "--comm"), "comm", "append", _NAMES, "COMM"),
        check=_no_empty("thread name", "a process or thread name such as bash")),
    Key("no_comms", STRS, "never threads of these names",
        flag=Flag(("-N", "--no-comm"), "no_comm", "append", _NAMES, "COMM"),
        check=_no_empty("thread name", "a process or thread name such as sshd")),
    Key("cgroup", OPT_STR, "only tasks in this cgroup (v2 path) and below",
        flag=Flag(("--cgroup",), "cgroup", metavar="PATH"),
        check=_no_empty("path", "a cgroup v2 path such as /sys/fs/cgroup/system.slice/foo.service, or leave it "
                        "out")),
    Key("min_duration_ms", num(0, _MAX_MS, " (ms)"),
        "report only sessions whose entry function ran at least this many ms",
        field="min_duration_ns", flag=Flag(("-L", "--longer"), "longer", metavar="MS", parse=_positive_ms),
        convert=lambda ms: int(ms * 1_000_000)),
    Key("allow_errors", STRS, "report only sessions failing with these errors (errno names, NULL, any)",
        flag=Flag(("-x", "--allow-errors"), "allow_errors", "append", "repeatable", "ERR"), check=_errors_check),
    Key("deny_errors", STRS, "never report sessions failing with these (wins over allow_errors)",
        flag=Flag(("-X", "--deny-errors"), "deny_errors", "append", "repeatable", "ERR"), check=_errors_check),
))


def _filters(ctx: Nodes, node: yaml.Node, key: str, _m: Mapping[str, yaml.Node]) -> dict[str, Any]:
    values, f = read_section(ctx, node, key, FILTERS)
    try:
        values["errors"] = ErrorFilter.parse(values.pop("allow_errors", ()), values.pop("deny_errors", ()))
    except ValueError as exc:  # "-x/--allow-errors: ..." or "-X/--deny-errors: ...": the key of the list that failed
        which = "deny_errors" if str(exc).startswith("-X/") else "allow_errors"
        msg = str(exc).split(": ", 1)[-1].replace(" (expected a name such as EINVAL or -ENOMEM)", "")
        raise ctx.fail(f[which], f"{key}.{which}", f"{msg} (use errno names such as EINVAL, -ENOMEM, NULL or any)"
                       ) from None
    return values


ENTRY_MISSING = "missing 'entry': a list of entry function globs (for example ['*sys_bpf']), or syscalls: true"
PROBE_SET = Section("probe_sets[]", ProbeSetConfig, (
    Key("name", STR, "unique name, the probe_set label of its metrics", check=_valid_name,
        flag=Flag(("--probe-set",), "probe_set", note="trace: 'default' unless given", metavar="NAME",
                  default="default"),
        required="missing 'name' (each probe set needs a unique name, used as the probe_set metric label)"),
    Key("entry", GLOBS, "entry function globs ('func', 'func [module]', ':path/*.c', @FILE, or a user-space function "
        "'u:BINARY:GLOB[=RULE]', RULE errno|neg|zero|null|ptr|none): a session starts at each call; needed unless "
        "syscalls is true",
        flag=Flag(("-e", "--entry"), "entry", "append", "repeatable", "GLOB"),
        check=lambda globs: None if globs else "needs at least one entry function glob"),
    Key("allow", GLOBS, "other functions recorded inside sessions",
        flag=Flag(("-a", "--allow"), "allow", "append", "repeatable", "GLOB")),
    Key("deny", GLOBS, "functions never traced (wins over entry and allow)",
        flag=Flag(("-d", "--deny"), "deny", "append", "repeatable", "GLOB")),
    Key("mode", choices(PROBE_MODES), "stack: the error chain; calls: every traced call; metrics: counts only",
        flag=Flag(("-T", "--trace"), "calls", "store_true", "-T: calls, printed as a call trace", default=False)),
    Key("attach_mode", choices(ATTACH_MODES), "how kernel functions attach (auto: the best the kernel has)",
        flag=tuple(Flag(m.flags, "attach_mode", "store_const", m.help, const=m.name)
                   for m in attach_modes.MODES if m.flags)),
    Key("user_attach_mode", choices(USER_ATTACH_MODES), "how user-space functions (u:BINARY:GLOB) attach: "
        "uprobe_session (Linux 6.13+), uprobe_multi (6.6+), uprobe (single uprobes) or auto, the first the kernel has",
        flag=Flag(("--user-attach",), "user_attach", metavar="MODE")),
    Key("filters", nested(FILTERS, _filters), "which sessions are reported", field="*"),
    Key("sampling", SAMPLING_KIND, "successful sessions kept besides the failing ones (none by default)"),
    Key("lbr", LBR, "CPUs with LBR: branch records at the deepest failing return (true: any_return)",
        field="lbr_branch_types", flag=Flag(("-B", "--lbr"), "lbr", "append", _LBR_TYPES, "SPEC", nargs="?",
                                            const="any_return", default=None),
        default=lambda: ProbeSetConfig._field_defaults["lbr_branch_types"] != 0),
    Key("capture_args", BOOL, "argument values (BTF-typed) with each call; kernel memory can hold secrets",
        flag=Flag(("-A", "--capture-args"), "capture_args", "store_true")),
    Key("app_context", BOOL, "join the application's trace when its thread publishes OTel thread context",
        flag=Flag(("--no-app-context",), "app_context", "store_false", "--no-app-context: off")),
    Key("user_stacks", BOOL, "the user-space stack of the thread that entered the entry function",
        flag=Flag(("-U", "--user-stacks"), "user_stacks", "store_true", "frame-pointer unwinding")),
    Key("duration_range", DURATION_RANGE_KIND, "histogram buckets of this set (unset: metrics.duration_range)"),
    Key("workload_label", choices(WORKLOAD_LABELS), "calls, errors and sessions also per namespace or container"),
    Key("syscalls", BOOL, "every syscall entry function of the kernel's architecture as an entry, and an allow set of "
        "functions that can return an errno, chosen for error origins (entry and allow add to them)",
        flag=Flag(("--syscalls",), "syscalls", "store_true", "no -e needed")),
    Key("syscalls_budget", integer_in(SYSCALLS_BUDGET), "with syscalls: at most this many allow functions chosen",
        flag=Flag(("--syscalls-budget",), "syscalls_budget", metavar="N", default=None)),
    Key("inject", INJECT, "probes recorded inside sessions, as span events: kprobe:FUNC[+OFF], kretprobe:FUNC, "
        "rawtp:NAME, tp:CATEGORY:NAME or @FILE (one per line)",
        flag=Flag(("-J", "--inject-probe"), "inject_probe", "append", "repeatable", "SPEC")),
))


def _probe_set(ctx: Nodes, node: yaml.Node, key: str, name: str | None) -> ProbeSetConfig:
    if name is not None:  # probe_sets as a mapping: the name is the key
        bad = _valid_name(name)
        if bad:
            raise ctx.fail(node, f"{key}.name", bad)
    values, _ = read_section(ctx, node, key, PROBE_SET, None if name is None else PROBE_SET.names[1:])
    if "entry" not in values and not values.get("syscalls"):
        raise ctx.fail(node, key, ENTRY_MISSING)
    if "syscalls_budget" in values and not values.get("syscalls"):
        raise ctx.fail(node, f"{key}.syscalls_budget", "is the syscall preset's budget: set syscalls: true too")
    return ProbeSetConfig(**({"name": name} if name is not None else {}), **values)


def _probe_sets(ctx: Nodes, node: yaml.Node, _key: str, _m: Mapping[str, yaml.Node]) -> tuple[ProbeSetConfig, ...]:
    if isinstance(node, yaml.SequenceNode):
        sets = [_probe_set(ctx, n, f"probe_sets[{i}]", None) for i, n in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        sets = []
        for knode, vnode in node.value:
            name = ctx.value(knode)
            if not isinstance(name, str):
                raise ctx.fail(knode, "probe_sets", f"probe set names must be strings, got {got(ctx, knode)}")
            sets.append(_probe_set(ctx, vnode, f"probe_sets.{name}", name))
    else:
        raise ctx.fail(node, "probe_sets", f"expected a list (or mapping) of probe sets, got {got(ctx, node)}")
    if not sets:
        raise ctx.fail(node, "probe_sets", "needs at least one probe set")
    seen: set[str] = set()
    for i, ps in enumerate(sets):
        if ps.name in seen:
            item = node.value[i] if isinstance(node, yaml.SequenceNode) else node.value[i][0]
            raise ctx.fail(item, "probe_sets", f"probe set name '{ps.name}' is used twice; names must be unique")
        seen.add(ps.name)
    return tuple(sets)


EXPORTER = Section("exporter", ExporterConfig, (
    Key("otlp", otlp_kind(otlp_section("exporter.otlp", Flag(
        ("--otlp-endpoint",), "otlp_endpoint", note="trace: sessions exported there as OTLP traces, such as "
        "http://collector:4318 (default: OTEL_EXPORTER_OTLP_* variables)", metavar="URL"),
        Flag(("--otlp-protocol",), "otlp_protocol"))),
        "OTLP export (null: none; left out: none when file or console is given)"),
    Key("file", OPT_STR, "OTLP JSON lines to this file, one export request per line",
        check=lambda path: None if path is None or os.path.isdir(os.path.dirname(os.path.abspath(path)))
        else f"the directory of {path} does not exist"),
    Key("console", BOOL, "retsnoop's text output on stdout, as `trace` prints it",
        convert=lambda on: ConsoleConfig(prefix=True) if on else None,
        default=lambda: ExporterConfig().console is not None),
    Key("export_addresses", BOOL, "raw kernel addresses in exported data (they reveal the KASLR offset)",
        flag=Flag(("--export-addresses",), "export_addresses", "store_true")),
    Key("service_name_from", choices(SERVICE_NAME_FROM), "service.name of a session's spans: its workload's, or "
        "the agent's", flag=Flag(("--service-name-from",), "service_name_from")),
))


def _exporter(ctx: Nodes, node: yaml.Node, key: str, _m: Mapping[str, yaml.Node]) -> ExporterConfig:
    values, m = read_section(ctx, node, key, EXPORTER)
    if "otlp" not in m and ("file" in m or "console" in m):
        values["otlp"] = None  # another exporter given: no OTLP unless asked for
    return ExporterConfig(**values)


METRICS = Section("metrics", MetricsConfig, (
    Key("listen", LISTEN, "address of /metrics and /healthz", field=("host", "port"),
        default=lambda: MetricsConfig().listen, flag=Flag(("--web.listen-address",), "web_listen_address",
        note="trace: /metrics there (exporter-toolkit's flag; :9464 is every address)", metavar="[HOST]:PORT",
        default=None)),
    Key("stall_after_s", num(1, _DAY_S, " (s)"), "/healthz answers 503 when capture has not polled for this long"),
    Key("otlp", otlp_kind(otlp_section("metrics.otlp")), "also push the metrics over OTLP"),
    Key("otlp_interval", num(1, _DAY_S, " (s)"), "seconds between pushes (unset: OTEL_METRIC_EXPORT_INTERVAL, else 60)",
        field="otlp_interval_s"),
    Key("max_error_types", integer_in(COUNT), "errno labels per function (0: every error type its own)"),
    Key("functions", GLOBS, "functions with series of their own (default: every traced function)"),
    Key("duration_range", DURATION_RANGE_KIND, "histogram buckets of probe sets without their own (unset: all)"),
    Key("max_workloads", integer_in(COUNT), "workload label values with series of their own, per probe set"),
    Key("web_config_file", OPT_STR, "TLS and basic auth for /metrics and /healthz (exporter-toolkit format)",
        flag=Flag(("--web.config.file",), "web_config_file", metavar="FILE"),
        convert=lambda path: path or None),  # read by the runtime, at start
))

LIMITS = Section("limits", Limits, (
    Key("max_spans_per_trace", integer_in(COUNT), "exported spans per session (deeper calls are counted)",
        # calls beyond the span limit would not be exported: do not keep them
        field=("max_spans_per_trace", "max_calls_per_session"), convert=lambda n: (n, n)),
    Key("export_queue_spans", integer_in(COUNT), "spans waiting for export (unset: OTEL_BSP_MAX_QUEUE_SIZE, "
        "else 65536)"),
    Key("ringbuf_size", size_in(RINGBUF_BYTES), "ring buffer per probe set",
        flag=Flag(("-C", "bpf.ringbuf-size"), "bpf.ringbuf-size")),
    Key("max_sessions", integer_in(MAP_ENTRIES), "threads with a kernel session entry, per probe set",
        flag=Flag(("-C", "bpf.sessions-size"), "bpf.sessions-size")),
    Key("user_stack_wait_s", num(0, 60, " (s)"), "how long a session waits for its user stack's symbols"),
))

LOGGING = Section("logging", LoggingConfig, (
    Key("format", choices(LOG_FORMATS), "the log's lines"),
    Key("level", choices(LOG_LEVELS), "unset: OTEL_LOG_LEVEL, else info"),
))

TOP = Section("", None, (
    Key("probe_sets", Kind(_probe_sets, "list or mapping of probe sets", {"type": ["array", "object"]}, PROBE_SET),
        "what is traced: named sets of functions", required="missing: the config needs at least one probe set"),
    Key("exporter", nested(EXPORTER, _exporter), "where sessions go"),
    Key("metrics", into(METRICS), "the Prometheus endpoint and the OTLP metrics push"),
    Key("limits", into(LIMITS), "memory and export bounds"),
    Key("logging", into(LOGGING), "the agent's own log"),
    Key("vmlinux", OPT_STR, "DWARF for source globs and file:line frames (auto: the standard places)",
        flag=Flag(("-k", "--kernel"), "kernel", metavar="VMLINUX", checked=False, parse=_vmlinux_text),
        check=_vmlinux_check),
    Key("kubernetes", nested(KUBERNETES, lambda ctx, node, _key, _m: parse_kubernetes(ctx, node)),
        "pod names from the API server (a DaemonSet's metadata watch)"),
))



"""`retsnoop-otel trace` flags, retsnoop's, and their translation into one ad-hoc probe set.

The flags become the same RuntimeConfig the agent reads from its file: one probe set, console
output in retsnoop's layouts, optional OTLP export and /metrics. Bad flags end here with one line
and exit code 2, before anything else runs.
"""

import argparse
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.capture.inject import InjectError, InjectSpec, parse_specs
from retsnoop_otel.capture.records import MAX_ARG_DATA, MAX_FUNC_ARGS, ArgSizes
from retsnoop_otel.capture.sampling import Sampling
from retsnoop_otel.capture.sessions import DEFAULT_MAX_CALLS
from retsnoop_otel.command.errors import EXIT_INPUT, exit_code_epilog
from retsnoop_otel.command.flag_parser import FlagGroup, FlagParser
from retsnoop_otel.command.help_format import HelpFormatter
from retsnoop_otel.export.otel_env import OTLP_ENDPOINT, OTLP_TRACES_ENDPOINT, TRACES_EXPORTER
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.inputs.addresses import MAX_HOST_CHARS
from retsnoop_otel.inputs.files import MAX_GLOB_FILE_BYTES, expand_at_files, shown
from retsnoop_otel.inputs.numbers import (
    COUNT,
    U32_MAX,
    IntRange,
    NumberError,
    parse_float,
    parse_int,
)
from retsnoop_otel.render.formats import ArgsFormat, StackFormat
from retsnoop_otel.runtime.config import (
    ConsoleConfig,
    ExporterConfig,
    InputNames,
    Limits,
    MetricsConfig,
    ProbeSetConfig,
    RuntimeConfig,
    SymbolsConfig,
)
from retsnoop_otel.runtime.config_flags import (
    KeyType,
    add_key_flags,
    add_other_key_flags,
    c_help,
    c_keys,
    field_values,
)
from retsnoop_otel.runtime.config_keys import Section
from retsnoop_otel.runtime.config_sections import EXPORTER, FILTERS, LIMITS, METRICS, PROBE_SET, TOP
from retsnoop_otel.runtime.config_values import SAMPLING
from retsnoop_otel.runtime.runtime import POLL_MS
from retsnoop_otel.runtime.sdk_env import TRACE_EXPORTERS, exporters
from retsnoop_otel.symbols.discovery import DiscoveryError, expand_glob_args
from retsnoop_otel.trace.cases import CASES, with_cases

OTLP = EXPORTER.key("otlp").kind.section  # exporter.otlp's keys
assert OTLP is not None
KEY_SECTIONS = (TOP, PROBE_SET, FILTERS, SAMPLING, EXPORTER, OTLP, METRICS)  # the sections with trace flags
TRACE_NAMES = InputNames(
    otlp=MappingProxyType({"endpoint": "--otlp-endpoint", "protocol": "--otlp-protocol"}),
    listen="--metrics-port", listen_host="--metrics-addr", trace_json="--trace-json", vmlinux="-k", cgroup="--cgroup",
    lbr="--lbr", attach_mode="-F/-K/-M/--kprobe-session", web_config="--web.config.file")
# -C keys that are config keys too (limits.ringbuf_size, limits.max_sessions): read, ranged and described by the
# key's declaration; the others are retsnoop's alone
C_FROM_KEYS = c_keys(LIMITS)
C_RANGES = {"calls.max-per-session": COUNT,
            "fmt.lbr-max-count": IntRange(0, U32_MAX, "a count"),
            # retsnoop's ranges; above MAX_ARG_DATA the capture is capped (describe_args)
            "args.max-total-args-size": IntRange(1, 65536, "bytes"),
            "args.max-sized-arg-size": IntRange(1, 16384, "bytes"),
            "args.max-str-arg-size": IntRange(1, 16384, "bytes"),
            "args.fmt-max-arg-width": IntRange(0, 250, "characters, 0: no limit")}
SYMB_MODES = {"none": 0, "n": 0, "linenum": 1, "l": 1, "inlines": 2, "i": 2}  # retsnoop's names and letters
C_BOOLS = ("stacks.unfiltered", "stacks.emit-addrs", "stacks.dec-offs", "args.capture-raw-ptrs")
BOOL_WORDS = {"true": True, "y": True, "1": True, "false": False, "n": False, "0": False}  # retsnoop's
FMT_MODES = {"compact": "compact", "c": "compact", "multiline": "multiline", "m": "multiline",
             "verbose": "verbose", "v": "verbose"}
C_ENUMS = {"stacks.symb-mode": SYMB_MODES, "args.fmt-mode": FMT_MODES}
C_ENUM_WORDS = {"stacks.symb-mode": "none, linenum or inlines", "args.fmt-mode": "compact, multiline or verbose"}
C_KEYS = (*C_FROM_KEYS, *C_RANGES, *C_BOOLS, *C_ENUMS)
# the keys that set a config record's fields (the record's defaults are retsnoop's)
C_ARG_SIZES = {"args.max-total-args-size": "total", "args.max-sized-arg-size": "sized",
               "args.max-str-arg-size": "string"}
C_STACKS = {"stacks.unfiltered": "unfiltered", "stacks.emit-addrs": "emit_addrs", "stacks.dec-offs": "dec_offs"}
C_ARGS_FORMAT = {"args.fmt-mode": "mode", "args.fmt-max-arg-width": "max_width", "args.capture-raw-ptrs": "raw_ptrs"}
_CAPPED = f"captured up to {MAX_ARG_DATA} bytes per argument here: larger values are accepted and capped"
C_HELP = {
    **{name: c_help(*declared) for name, declared in C_FROM_KEYS.items()},
    "calls.max-per-session": f"calls kept per session for -T (default {DEFAULT_MAX_CALLS}; the rest are counted)",
    "fmt.lbr-max-count": "show at most N LBR records (as --lbr-max-count)",
    "stacks.symb-mode": "none, linenum or inlines (as -sn, -s, -ss)",
    "stacks.unfiltered": "true/false: keep the tracer's own stack frames and every LBR record (default false)",
    "stacks.emit-addrs": "true/false: each stack and LBR frame's address first, '~' marking the tracer's own",
    "stacks.dec-offs": "true/false: symbol offsets in decimal, not hex",
    "args.max-total-args-size": "-A bytes per call over all arguments, 1..65536 (default 3072; captured up to "
                                f"{MAX_ARG_DATA * MAX_FUNC_ARGS} bytes per call here: larger values are accepted "
                                "and capped)",
    "args.max-sized-arg-size": f"-A bytes behind a pointer to a struct, 1..16384 (default 256; {_CAPPED})",
    "args.max-str-arg-size": f"-A bytes of a string argument, 1..16384 (default 256; {_CAPPED})",
    "args.capture-raw-ptrs": "true/false: a pointer argument's own value, (0x...), before what it points to",
    "args.fmt-mode": "compact (the calls table's CONTEXT column), multiline (a line per argument) or verbose "
                     "(structs over several lines, no width limit)",
    "args.fmt-max-arg-width": "characters of one argument's value before it is cut with '…', 0..250 "
                              "(default 120; 0: no limit; compact and multiline)",
}


class _ConfigHelp(argparse.Action):
    """--config-help: every -C key and what it sets, then exit, as retsnoop's does."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="list the -C keys and exit")

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        width = max(map(len, C_HELP))
        lines = [f"  -C {k:<{width}}  {text}" for k, text in C_HELP.items()]
        print("Extra configuration (-C KEY=VALUE):\n" + "\n".join(lines))
        parser.exit(0)


S_LEVELS = {None: 1, "none": 0, "n": 0, "inlines": 2, "s": 2}  # retsnoop's -s, -sn/-s none, -ss/-s inlines


class _Symbolize(argparse.Action):
    """-s [LEVEL] as retsnoop reads it: -s alone is source lines, -ss (the letter as its value) or -s inlines
    adds inlined functions, -sn or -s none turns DWARF off; the last one given wins."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if values not in S_LEVELS:
            parser.error(f"-s: {shown(values)} is not a symbolization level; write -s, -ss (-s inlines) or "
                         "-sn (-s none)")
        setattr(namespace, self.dest, S_LEVELS[values])


def _int_flag(rng: IntRange):  # type: ignore[no-untyped-def]
    def read(text: str) -> int:
        try:
            return parse_int(text, rng)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    read.__name__ = "integer"
    return read


_port = _int_flag(IntRange(1, 65535, "a TCP port"))
MIN_INTERVAL_S = POLL_MS / 1000  # the capture loop's poll: an interval is printed between two polls
MAX_INTERVAL_S = 86400.0  # a day; the table at stop covers longer runs


def _seconds(text: str) -> float:
    try:
        return parse_float(text, MIN_INTERVAL_S, MAX_INTERVAL_S, "seconds", closed=True)
    except NumberError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_seconds.__name__ = "seconds"


def _listen_host(text: str) -> str:
    """--metrics-addr: a host name or an IP address (an IPv6 one with or without its brackets); what the name
    resolves to is the bind's to say. Refused here: what can never be one."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]") and ":" in host:
        host = host[1:-1]
    if not host or any(c in "[]/@" or c.isspace() or not c.isprintable() for c in host) \
            or len(host) > MAX_HOST_CHARS:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a host name or IP address (for example 127.0.0.1, "
                                         "::1 or [::1], at most 253 characters)")
    return host


_listen_host.__name__ = "address"


def _from_keys(group: FlagGroup, section: Section, *names: str) -> None:
    """The flags of these config keys, made from their declarations (runtime/config_flags.py)."""
    for name in names:
        add_key_flags(group, section, name)


def build_parser(prog: str = "retsnoop-otel trace") -> FlagParser:
    p = FlagParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Trace kernel functions the way retsnoop does: sessions start at entry functions "
                    "(-e) and record the allowed functions (-a) they call; failing sessions print the "
                    "deepest error call chain. Optionally export sessions as OpenTelemetry traces and "
                    "serve Prometheus metrics.", epilog=exit_code_epilog())
    sel = p.flag_group("function selection")
    sel.add_argument("-c", "--case", action="append", default=[], choices=tuple(CASES), metavar="CASE",
                     help=f"retsnoop's preset globs of a subsystem, added to -e/-a/-d ({', '.join(CASES)})")
    _from_keys(sel, PROBE_SET, "entry", "allow", "deny", "syscalls", "syscalls_budget", "attach_mode",
               "user_attach_mode")
    out = p.flag_group("what to capture and show")
    _from_keys(out, SAMPLING, "success_probability", "errors")
    _from_keys(out, PROBE_SET, "mode")
    out.add_argument("-E", "--call-stack", action="store_true",
                     help="print the call stack under -T's call trace (needs -T)")
    out.add_argument("--json", action="store_true", help="print one JSON object per session")
    out.add_argument("--origins-interval", type=_seconds, default=None, metavar="SECONDS",
                     help=f"also print the table of error origins every SECONDS ({MIN_INTERVAL_S:g} to "
                          f"{MAX_INTERVAL_S:g}): that interval's failing sessions, counted in the kernel (--json: "
                          "one object each); the whole run's table at stop as always")
    _from_keys(out, PROBE_SET, "capture_args", "user_stacks", "app_context", "inject")
    out.add_argument("--trace-json", metavar="FILE", help="write -T sessions as Chrome trace-event JSON (Perfetto)")
    _from_keys(out, PROBE_SET, "lbr")
    out.add_argument("--lbr-max-count", type=_int_flag(IntRange(0, U32_MAX, "a count")), default=None, metavar="N",
                     help="show at most N LBR records")
    _from_keys(out, TOP, "vmlinux")
    out.add_argument("-s", "--symbolize", action=_Symbolize, nargs="?", default=None, metavar="LEVEL",
                     help="-s: source lines; -ss or -s inlines: also inlined functions (default when DWARF is "
                          "found); -sn or -s none: no DWARF symbolization")
    flt = p.flag_group("filters")
    _from_keys(flt, FILTERS, "allow_errors", "deny_errors", "pids", "no_pids", "comms", "no_comms", "min_duration_ms",
               "cgroup")
    exp = p.flag_group("export")
    _from_keys(exp, OTLP, "endpoint", "protocol")
    _from_keys(exp, EXPORTER, "export_addresses", "service_name_from")
    _from_keys(exp, METRICS, "listen")
    exp.add_argument("--metrics-port", type=_port, metavar="PORT", help="serve Prometheus metrics on PORT")
    exp.add_argument("--metrics-addr", type=_listen_host, default=None, metavar="ADDR",
                     help="metrics listen address (with --metrics-port; default 0.0.0.0)")
    _from_keys(exp, METRICS, "web_config_file")
    _from_keys(exp, PROBE_SET, "name")
    add_other_key_flags(p, KEY_SECTIONS)
    misc = p.flag_group("misc")
    misc.add_argument("--dry-run", action="store_true", help="discover functions, attach nothing")
    misc.add_argument("-C", "--config", action="append", default=[], metavar="KEY=VALUE",
                      help="extra configuration, as retsnoop's (--config-help lists the keys)")
    misc.add_argument("--config-help", action=_ConfigHelp)
    misc.add_argument("-v", "--verbose", action="count", default=0, help="-v, -vv, -vvv: more details")
    misc.add_argument("-V", "--version", action="store_true", help="print version (-Vv: and kernel features)")
    return p


class TraceRequest(NamedTuple):
    """What one `trace` command line asks for: the runtime's config and how to present the run."""

    config: RuntimeConfig
    dry_run: bool = False
    verbose: int = 0
    version: bool = False
    origins_interval: float | None = None  # --origins-interval: seconds between two tables of error origins


def _c_values(parser: argparse.ArgumentParser, items: Sequence[str]) -> dict[str, int | bool | str]:
    out: dict[str, int | bool | str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, word = key.strip(), value.strip()
        if not sep:
            parser.error(f"-C expects KEY=VALUE, got {shown(item)}")
        if key not in C_KEYS:
            parser.error(f"unknown -C key {shown(key)} (known: {', '.join(C_KEYS)})")
        if key in C_BOOLS:
            if word.lower() not in BOOL_WORDS:
                parser.error(f"-C {key}: {shown(value)} is not true/y/1 or false/n/0")
            out[key] = BOOL_WORDS[word.lower()]
            continue
        if key in C_ENUMS:
            names = C_ENUMS[key]
            if word.lower() not in names:
                parser.error(f"-C {key}: {shown(value)} is not a mode; write {C_ENUM_WORDS[key]}")
            out[key] = names[word.lower()]
            continue
        try:
            if key in C_FROM_KEYS:
                _section, declared, flag = C_FROM_KEYS[key]
                out[key] = KeyType(declared, flag)(value)
                continue
            out[key] = parse_int(value, C_RANGES[key], prefixes=True)
        except (NumberError, argparse.ArgumentTypeError) as exc:
            parser.error(f"-C {key}: {exc}")
    return out


def capped_arg_sizes(sizes: ArgSizes) -> list[str]:
    """-v: what the capture copies of the args.max-*-size values asked above what it can copy."""
    most = {"total": MAX_ARG_DATA * MAX_FUNC_ARGS, "sized": MAX_ARG_DATA, "string": MAX_ARG_DATA}
    return [f"-C {key}={getattr(sizes, field)}: captured up to {most[field]} bytes"
            + (" per call" if field == "total" else " per argument") + " (what retsnoop-otel's capture copies)"
            for key, field in C_ARG_SIZES.items() if getattr(sizes, field) > most[field]]


def _fields(c: Mapping[str, object], keys: Mapping[str, str]) -> dict[str, object]:
    """The record fields the -C values in `c` set, by `keys` (-C key -> field)."""
    return {field: c[key] for key, field in keys.items() if key in c}


def _names(parser: argparse.ArgumentParser, flag: str, values: Sequence[str],
           read: dict[str, list[str]]) -> tuple[str, ...]:
    """-n/-N values in order, each '@file' replaced by its lines (blank lines and '#' comments skipped), as
    retsnoop reads them."""
    try:
        return tuple(expand_at_files(values, f"{flag} @FILE", MAX_GLOB_FILE_BYTES, ValueError, read))
    except ValueError as exc:
        parser.error(f"{flag} {exc}")


def _globs(parser: argparse.ArgumentParser, values: Sequence[str], read: dict[str, list[str]]) -> tuple[str, ...]:
    """-e/-a/-d values in order, each '@file' replaced by its globs: read here, once, and by nothing after (the
    runtime gets the globs as values). A glob file that cannot be read ends the run as the runtime's refusals do
    (one `retsnoop-otel:` line, trace/main.py; exit 2); the globs themselves are checked with the run's settings."""
    try:
        return tuple(expand_glob_args(values, read))
    except DiscoveryError as exc:
        parser.exit(EXIT_INPUT.code, f"retsnoop-otel: {exc}\n")


def _inject_specs(parser: argparse.ArgumentParser, values: Sequence[str]) -> tuple[InjectSpec, ...]:
    try:
        return parse_specs(values)
    except InjectError as exc:
        parser.error(str(exc))


def otlp_requested(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """Whether sessions become spans: an OTLP endpoint given (flag or variable; an endpoint variable that turns
    out unusable is ignored by the run's settings, and no export is left), or OTEL_TRACES_EXPORTER naming console
    (which exporters are used, and the warnings for what it names wrongly, are runtime/sdk_env.py's)."""
    return bool(args.otlp_endpoint or environ.get(OTLP_ENDPOINT, "").strip()
                or environ.get(OTLP_TRACES_ENDPOINT, "").strip()) \
        or (bool(environ.get(TRACES_EXPORTER)) and "console" in exporters(environ, TRACES_EXPORTER, TRACE_EXPORTERS))


def parse(argv: Sequence[str], environ: Mapping[str, str],
          parser: argparse.ArgumentParser | None = None) -> TraceRequest:
    """The request of a command line; bad flags exit(2) with one line on stderr. `environ`: the run's (RuntimeDeps),
    for the OTEL_* variables that ask for an export."""
    parser = parser or build_parser()
    args = parser.parse_args(list(argv))
    if args.version:
        return TraceRequest(RuntimeConfig(probe_sets=()), verbose=args.verbose, version=True)
    entry, allow, deny = with_cases(args.case, args.entry, args.allow, args.deny)
    if not entry and not args.syscalls:
        parser.error("at least one entry glob is needed: -e GLOB (for example -e '*sys_bpf'), -c CASE or --syscalls")
    if args.syscalls_budget is not None and not args.syscalls:
        parser.error("--syscalls-budget is the budget of --syscalls: give --syscalls too")
    # -E adds the stack under -T's call trace (without -T the stack is all that is printed: -E alone would change
    # nothing); --trace-json writes -T's call traces. Neither is taken to mean -T, which changes what is printed.
    for given, flag in ((args.call_stack, "-E/--call-stack"), (args.trace_json is not None, "--trace-json")):
        if given and not args.calls:
            parser.error(f"{flag} needs -T (the call trace): give -T too, or drop {flag.split('/')[0]}")
    if args.success_stacks and args.allow_errors:
        parser.error("-S (success sessions) conflicts with -x (only sessions with given errors)")
    try:
        errors = ErrorFilter.parse(args.allow_errors, args.deny_errors)
    except ValueError as exc:
        parser.error(str(exc))
    c = _c_values(parser, args.config)
    inject = _inject_specs(parser, args.inject_probe)
    lbr_flags = 0
    if args.lbr is not None:
        from retsnoop_otel.kernel.lbr import LbrError, parse_specs
        try:
            lbr_flags = parse_specs(args.lbr)
        except LbrError as exc:
            parser.error(str(exc))
    lbr_max = c.get("fmt.lbr-max-count", args.lbr_max_count)
    if lbr_max is not None and (args.lbr is None or lbr_max <= 0):
        parser.error("--lbr-max-count needs --lbr and a positive count (so does -C fmt.lbr-max-count)")
    host, port = args.metrics_addr or "0.0.0.0", args.metrics_port
    if args.web_listen_address is not None:
        if args.metrics_port is not None or args.metrics_addr is not None:
            parser.error("--web.listen-address names the metrics address and port: give it or --metrics-port/"
                         "--metrics-addr, not both")
        host, port = args.web_listen_address  # read as metrics.listen is
    elif args.metrics_addr is not None and args.metrics_port is None:
        parser.error("--metrics-addr needs --metrics-port (or give --web.listen-address HOST:PORT)")
    if args.web_config_file and port is None:
        parser.error("--web.config.file secures the metrics port: give --web.listen-address (or --metrics-port) too")
    otlp = otlp_requested(args, environ)
    success = args.success_stacks or (args.calls and not args.allow_errors)
    read: dict[str, list[str]] = {}  # every '@file' of the command line (-n/-N/-e/-a/-d) read once
    comms, no_comms = _names(parser, "-n", args.comm, read), _names(parser, "-N", args.no_comm, read)
    entry, allow, deny = (_globs(parser, globs, read) for globs in (entry, allow, deny))
    read_here = dict(entry=entry, allow=allow, deny=deny, comms=comms, no_comms=no_comms, errors=errors,
                     mode="calls" if args.calls or otlp or args.trace_json else "stack", lbr_branch_types=lbr_flags,
                     inject=inject, sampling=Sampling(success_probability=1.0 if success else 0.0,
                                                      error_probability=args.error_probability),
                     arg_sizes=ArgSizes(**_fields(c, C_ARG_SIZES)))
    # the keys' flags as given (--probe-set, the attach modes, -p/-P, --cgroup, -L, -A, -U...), then what is read here
    probe_set = ProbeSetConfig(**{**field_values(args, PROBE_SET, FILTERS), **read_here})
    level = c.get("stacks.symb-mode", args.symbolize)
    config = RuntimeConfig(
        probe_sets=(probe_set,),
        exporter=ExporterConfig(
            **field_values(args, EXPORTER),
            otlp=OtlpConfig(endpoint=args.otlp_endpoint, protocol=args.otlp_protocol) if otlp else None,
            otlp_needs_endpoint=True,
            console=ConsoleConfig(format="json" if args.json else "text", view="calls" if args.calls else "stack",
                                  call_stack=args.call_stack, lbr_max_count=lbr_max or 0,
                                  stacks=StackFormat(**_fields(c, C_STACKS)),
                                  args=ArgsFormat(**_fields(c, C_ARGS_FORMAT))),
            trace_json=args.trace_json),
        metrics=MetricsConfig(**field_values(args, METRICS), host=host, port=port),
        limits=Limits(max_calls_per_session=c.get("calls.max-per-session", DEFAULT_MAX_CALLS),
                      ringbuf_size=c.get("bpf.ringbuf-size", Limits().ringbuf_size),
                      max_sessions=c.get("bpf.sessions-size", Limits().max_sessions)),
        symbols=SymbolsConfig(vmlinux=args.kernel or ("auto" if level != 0 else None), source_lines=level != 0,
                              inlines=level is None or level >= 2),
        names=TRACE_NAMES._replace(listen_host="--web.listen-address", listen="--web.listen-address")
        if args.web_listen_address is not None else TRACE_NAMES)
    return TraceRequest(config, dry_run=args.dry_run, verbose=args.verbose, origins_interval=args.origins_interval)

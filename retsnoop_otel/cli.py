"""Command line: `retsnoop-otel trace|features|simfail|agent ...` with retsnoop-compatible trace flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from retsnoop_otel import __version__

SUBCOMMANDS = ("trace", "features", "simfail", "agent")


def _positive_ms(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of milliseconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("-L/--longer needs a positive number of milliseconds")
    return int(value * 1_000_000)


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a process id")
    return int(text)


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags get one line on stderr (argparse's default repeats a many-line usage first).

    Like getopt (and so retsnoop), a flag that takes a value takes the next word even when it starts
    with '-': `-x -ENOMEM` works, where argparse alone would call it a missing value.
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        words = list(sys.argv[1:] if args is None else args)
        takes_value = {opt for a in self._actions if a.nargs is None and a.option_strings
                       for opt in a.option_strings}
        joined: list[str] = []
        i = 0
        while i < len(words):
            if words[i] in takes_value and i + 1 < len(words) and words[i + 1].startswith("-"):
                joined.append(f"{words[i]}={words[i + 1]}")
                i += 2
                continue
            joined.append(words[i])
            i += 1
        return super().parse_known_args(joined, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_trace_parser(prog: str = "retsnoop-otel trace") -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog=prog,
        description="Trace kernel functions the way retsnoop does: sessions start at entry functions "
                    "(-e) and record the allowed functions (-a) they call; failing sessions print the "
                    "deepest error call chain. Optionally export sessions as OpenTelemetry traces and "
                    "serve Prometheus metrics.")
    sel = p.add_argument_group("function selection")
    sel.add_argument("-e", "--entry", action="append", default=[], metavar="GLOB",
                     help="entry function glob ('func', 'func [module]', ':path/*.c' or @file); repeatable")
    sel.add_argument("-a", "--allow", action="append", default=[], metavar="GLOB",
                     help="other functions to record inside sessions; repeatable")
    sel.add_argument("-d", "--deny", action="append", default=[], metavar="GLOB",
                     help="functions never to trace (wins over -e and -a); repeatable")
    mode = sel.add_mutually_exclusive_group()
    mode.add_argument("-F", "--fentries", dest="mode", action="store_const", const="fentry",
                      help="attach with fentry/fexit")
    mode.add_argument("-K", "--kprobes", dest="mode", action="store_const", const="kprobe",
                      help="attach with kprobe/kretprobe")
    mode.add_argument("-M", "--kprobes-multi", dest="mode", action="store_const", const="kprobe_multi",
                      help="attach with kprobe.multi/kretprobe.multi")
    out = p.add_argument_group("what to capture and show")
    out.add_argument("-S", "--success-stacks", action="store_true", help="report sessions without errors too")
    out.add_argument("-T", "--trace", dest="calls", action="store_true",
                     help="record and print every traced call (function call trace)")
    out.add_argument("-E", "--call-stack", action="store_true",
                     help="print the call stack too when -T is given")
    out.add_argument("--json", action="store_true", help="print one JSON object per session")
    out.add_argument("-A", "--capture-args", action="store_true",
                     help="capture function arguments (BTF-typed; off by default: kernel memory can hold secrets)")
    out.add_argument("--trace-json", metavar="FILE", help="write -T sessions as Chrome trace-event JSON (Perfetto)")
    out.add_argument("-B", "--lbr", action="append", nargs="?", const="any_return", metavar="SPEC",
                     help="capture last branch records at the deepest failing function (any, any_call, "
                          "any_return (default), cond, call, ind_call, ind_jump, call_stack, abort_tx, in_tx, "
                          "no_tx, or a number); needs a CPU exposing LBR")
    out.add_argument("--lbr-max-count", type=int, default=None, metavar="N",
                     help="show at most N LBR records")
    out.add_argument("-k", "--kernel", metavar="VMLINUX", help="vmlinux with DWARF for source lines")
    out.add_argument("-s", "--symbolize", action="count", default=None,
                     help="-s: source lines, -ss: also inlined functions (default when DWARF is found)")
    out.add_argument("-sn", dest="symbolize", action="store_const", const=0, help="no DWARF symbolization")
    flt = p.add_argument_group("filters")
    flt.add_argument("-x", "--allow-errors", action="append", default=[], metavar="ERR",
                     help="report only sessions with these errors (EINVAL, -ENOMEM, NULL, any)")
    flt.add_argument("-X", "--deny-errors", action="append", default=[], metavar="ERR",
                     help="never report sessions with these errors (wins over -x)")
    flt.add_argument("-p", "--pid", action="append", default=[], type=_pid, help="only this process id")
    flt.add_argument("-P", "--no-pid", action="append", default=[], type=_pid, help="not this process id")
    flt.add_argument("-n", "--comm", action="append", default=[], help="only threads with this name")
    flt.add_argument("-N", "--no-comm", action="append", default=[], help="not threads with this name")
    flt.add_argument("-L", "--longer", type=_positive_ms, default=0, metavar="MS",
                     help="only sessions whose entry function ran at least MS milliseconds")
    flt.add_argument("--cgroup", metavar="PATH", help="only tasks in this cgroup (v2 path)")
    exp = p.add_argument_group("export")
    exp.add_argument("--otlp-endpoint", metavar="URL",
                     help="export sessions as OTLP traces (default: OTEL_EXPORTER_OTLP_* variables)")
    exp.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"), help="OTLP protocol")
    exp.add_argument("--export-addresses", action="store_true",
                     help="include raw kernel addresses in exported data (they reveal the KASLR offset)")
    exp.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on PORT")
    exp.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR", help="metrics listen address")
    exp.add_argument("--probe-set", default="default", help="probe set label on metrics")
    misc = p.add_argument_group("misc")
    misc.add_argument("--dry-run", action="store_true", help="discover functions, attach nothing")
    misc.add_argument("-C", "--config", action="append", default=[], metavar="KEY=VALUE",
                      help="bpf.ringbuf-size=BYTES, bpf.sessions-size=N, calls.max-per-session=N")
    misc.add_argument("-v", "--verbose", action="count", default=0, help="-v, -vv, -vvv: more details")
    misc.add_argument("-V", "--version", action="store_true", help="print version (-Vv: and kernel features)")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="retsnoop-otel",
        description="retsnoop-style kernel function tracing exported as OpenTelemetry traces and "
                    "Prometheus metrics.")
    p.add_argument("-V", "--version", action="store_true", help="print version")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("trace", help="trace kernel functions (retsnoop flags)", add_help=False)
    sub.add_parser("features", help="report what the running kernel allows", add_help=False)
    sub.add_parser("simfail", help="make the kernel fail in known ways (test workload)", add_help=False)
    sub.add_parser("agent", help="long-running exporter driven by a YAML config", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # retsnoop users type flags directly: treat `retsnoop-otel -e ...` as `retsnoop-otel trace -e ...`
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help", "-V", "--version", "-Vv"):
        args = ["trace", *args]
    if args and args[0] in ("-V", "--version", "-Vv"):
        args = ["trace", *args]
    if not args or args[0] not in SUBCOMMANDS:
        parser = build_parser()
        parser.parse_args(args)  # prints help / errors for unknown commands
        parser.print_help()
        return 2
    cmd, rest = args[0], args[1:]
    try:
        if cmd == "trace":
            from retsnoop_otel.trace.main import run_trace
            return run_trace(build_trace_parser(), rest)
        if cmd == "features":
            from retsnoop_otel.kernel import features
            return features.main(rest)
        if cmd == "simfail":
            from retsnoop_otel import simfail
            return simfail.main(rest)
        from retsnoop_otel.agent import main as agent_cmd
        return agent_cmd.main(rest)
    except KeyboardInterrupt:
        return 130


def version_line() -> str:
    return f"retsnoop-otel v{__version__}"


if __name__ == "__main__":
    sys.exit(main())

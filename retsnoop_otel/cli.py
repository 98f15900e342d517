"""Command line: `retsnoop-otel trace|agent|features|simfail ...`; retsnoop users may type trace flags directly.

Each command's module is imported only when it runs, so `--help` and `simfail` start without
loading the OpenTelemetry or Prometheus libraries.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from retsnoop_otel import interrupted_while_loading
from retsnoop_otel.command.errors import EXIT_INPUT, EXIT_INTERRUPTED, exit_code_epilog
from retsnoop_otel.command.help_format import HelpFormatter, OneLineParser
from retsnoop_otel.command.streams import SignalStop, StartSignals, Streams, exit_of, raise_deferred
from retsnoop_otel.symbols.read_ahead import read_ahead

if TYPE_CHECKING:
    from retsnoop_otel.runtime.deps import RuntimeDeps

SUBCOMMANDS = ("trace", "features", "simfail", "agent")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="retsnoop-otel", formatter_class=HelpFormatter,
        description="retsnoop-style kernel function tracing exported as OpenTelemetry traces and "
                    "Prometheus metrics.", epilog=exit_code_epilog())
    p.add_argument("-V", "--version", action="store_true", help="print version")
    p.add_argument("-v", "--verbose", action="count", default=0)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("trace", help="trace kernel functions (retsnoop flags)", add_help=False)
    sub.add_parser("agent", help="long-running exporter driven by a YAML config", add_help=False)
    sub.add_parser("features", help="report what the running kernel allows", add_help=False)
    sub.add_parser("simfail", help="make the kernel fail in known ways (test workload)", add_help=False)
    return p


def features_main(argv: Sequence[str]) -> int:
    """`retsnoop-otel features`: what this kernel lets a tracer do, and why not."""
    import json

    from retsnoop_otel.kernel import features
    from retsnoop_otel.kernel import libbpf as lb
    p = OneLineParser(prog="retsnoop-otel features", formatter_class=HelpFormatter,
                                description="Report what the running kernel allows a tracer to do.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))
    try:
        feats = features.detect(args.root)
    except lb.LibbpfUnavailable as exc:
        print(f"retsnoop-otel: {exc}", file=sys.stderr)
        return 1
    raise_deferred()  # a Ctrl-C that landed in libbpf's print callback: 130, not lost (it printed a traceback, exit 0)
    if args.json:
        out = feats.to_dict()
        out["default_mode"] = features.choose_mode(feats)
        print(json.dumps(out, indent=2))
    else:
        print(features.format_features(feats))
    return 0


def process_age_s(root: str = "/") -> float | None:
    """Seconds since this process was created (exec'ed or forked), or None when /proc cannot say.

    /proc/self/stat's start time counts clock ticks since boot (suspend included), like CLOCK_BOOTTIME.
    """
    try:
        with open(os.path.join(root, "proc/self/stat")) as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22; the name in (...) may hold spaces
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def main(argv: Sequence[str] | None = None, deps: RuntimeDeps | None = None) -> int:
    """`deps`: trace's way out to the kernel (runtime/deps.py); None, as users run it, except where a bench passes
    another BPF object (bench/harness.py BASE_LAUNCH)."""
    main_t0, python_s = time.monotonic(), process_age_s()  # before any import of ours: Python's own start
    if signal.getsignal(signal.SIGINT) is interrupted_while_loading:  # loaded: Ctrl-C raises, caught below (130)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    args = list(sys.argv[1:] if argv is None else argv)
    # retsnoop users type flags directly: treat `retsnoop-otel -e ...` as `retsnoop-otel trace -e ...`
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
        args = ["trace", *args]
    cmd, rest = (args[0], args[1:]) if args else (None, [])  # None: no command; '' is a command that does not exist
    if cmd in ("trace", "features"):  # before their imports: Ctrl-C, SIGTERM and SIGHUP end a start the same way
        StartSignals().install()  # from here on, also when one lands in libbpf's print callback (raise_deferred)
    streams = Streams(sys.stdout, sys.stderr).install()
    system_exit = False
    try:
        try:
            code = _run(cmd, rest, deps, main_t0, python_s, streams)
        except SystemExit as exc:  # argparse: --help, --version, a bad flag
            system_exit, code = True, _system_exit_code(exc, streams)
        except (KeyboardInterrupt, SignalStop) as exc:
            code = exit_of(exc) or EXIT_INTERRUPTED.code
        code = streams.exit_code(code)
    finally:
        streams.finish()
    if system_exit:
        raise SystemExit(code)
    return code


def _run(cmd: str | None, rest: list[str], deps: RuntimeDeps | None, main_t0: float, python_s: float | None,
         streams: Streams) -> int:
    """One command, writing to the guarded streams (command/streams.py decides how a failed one ends it)."""
    if cmd not in SUBCOMMANDS:
        parser = build_parser()
        parser.parse_args([] if cmd is None else [cmd, *rest])  # prints help / errors for unknown commands
        parser.print_help()
        return EXIT_INPUT.code
    if cmd in ("trace", "agent"):
        gc.disable()  # start-up builds large tables that all live on: no collection passes (runtime.py)
    # the kernel's tables (BTF functions, symbols) read from here on, beside the imports below; not where a bench
    # passes deps
    ahead = read_ahead(cmd, rest, os.environ) if deps is None else None
    if cmd == "trace":
        from retsnoop_otel.runtime.startup import StartClock
        from retsnoop_otel.trace.main import run_trace
        return run_trace(rest, out=streams.out, err=streams.err, deps=deps,  # type: ignore[arg-type]
                         started=StartClock(main_t0, python_s), ahead=ahead)
    if cmd == "features":
        return features_main(rest)
    if cmd == "simfail":
        from retsnoop_otel import simfail
        return simfail.main(rest)
    from retsnoop_otel.agent import main as agent_cmd
    from retsnoop_otel.runtime.startup import StartClock
    return agent_cmd.main(rest, out=streams.out, err=streams.err,  # type: ignore[arg-type]
                          started=StartClock(main_t0, python_s), ahead=ahead)


def run() -> NoReturn:
    """The installed command and `python -m retsnoop_otel`: main(), then out without the interpreter's teardown.

    By then every link is detached, every output flushed and closed, and only daemon threads are left. The teardown
    would free a start's tables object by object (a collection of the whole heap, with gc off since the start)
    and unload every module, memory the kernel frees at once at exit: 50-70 ms of a stop in the emulated VM, where
    retsnoop's whole stop is 70-140 ms (bench/RESULTS.md "Start and stop side by side")."""
    try:
        code = main()
    except SystemExit as exc:  # main's own: argparse's help, version or refusal, its code decided
        code = exc.code if isinstance(exc.code, int) else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: main's code says so already
            pass
    os._exit(code)


def _system_exit_code(exc: SystemExit, streams: Streams) -> int:
    """sys.exit()'s argument as the exit code the interpreter would make of it (a message: said on stderr, 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=streams.err)
    return 1


if __name__ == "__main__":
    run()

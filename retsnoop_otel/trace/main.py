"""`retsnoop-otel trace`: one ad-hoc probe set over the capture runtime, presented the way retsnoop is.

The runtime's phases report through a StartHook so that retsnoop's lines come between them: -v says
the attach mode and what was found, "Receiving data..." once attached, "Detaching... DONE" at the end with
the kernel's loss counters. An OTEL_* variable whose value is ignored gets one "retsnoop-otel: warning:" line on
stderr at start. Exit codes: command/errors.py (EXIT_CODES). A failed stdout (its reader gone, a full disk) stops
the run as a signal does, before attaching when it fails during the start; command/streams.py then picks the exit
code. SIGHUP stops a running trace as SIGTERM does (detach, flush, exit 0).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from retsnoop_otel import __version__
from retsnoop_otel.command.errors import RunRefused
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.command.streams import raise_deferred
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.environment import kernel_env_loader
from retsnoop_otel.runtime.hooks import Resolved, StartHook
from retsnoop_otel.runtime.probe_set import ProbeSet
from retsnoop_otel.runtime.requests import Requests
from retsnoop_otel.runtime.runtime import Runtime
from retsnoop_otel.runtime.startup import Phase, StartClock, format_phases, phase_since
from retsnoop_otel.trace.flags import TraceRequest, capped_arg_sizes, parse

if TYPE_CHECKING:
    from retsnoop_otel.symbols.read_ahead import TablesAhead
    from retsnoop_otel.trace.origin_intervals import OriginIntervals


def _version(request: TraceRequest, out: TextIO) -> int:
    from retsnoop_otel.kernel import libbpf as lb
    try:
        loader = "libbpf {}.{} (built with the package)".format(*lb.version())
    except lb.LibbpfUnavailable as exc:
        loader = f"libbpf unavailable: {exc}"
    print(f"retsnoop-otel v{__version__}, {loader}", file=out)
    if request.verbose:
        from retsnoop_otel.kernel import features
        print(features.format_features(features.detect()), file=out)
    return 0


def run_trace(argv: Sequence[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr,
              deps: RuntimeDeps | None = None, started: StartClock | None = None,
              ahead: TablesAhead | None = None) -> int:
    """`started`: when main() began (cli.main), so that -v can say where the time to "Receiving data..." went;
    `ahead`: the kernel's tables being read since then (symbols/read_ahead.py), taken with `deps` None."""
    started = started or StartClock(time.monotonic(), None)
    imports = phase_since("imports", started.main_t0, "the trace command's modules")
    t0 = time.monotonic()
    deps = deps or RuntimeDeps(console=out, load_env=kernel_env_loader(ahead))
    request = parse(argv, deps.environ)
    flags = phase_since("flags", t0, "command line")
    if request.version:
        return _version(request, out)
    runtime = Runtime(request.config, deps, EventLog(err, level="debug" if request.verbose >= 2 else "error"))
    requests = Requests(getattr(out, "interrupt_write", None))  # guarded streams (cli.py): a blocked write given up
    on_failure = getattr(out, "on_failure", None)  # a guarded stdout (command/streams.py): its failure stops the run
    if on_failure is not None:
        on_failure(requests.ask_stop)
    try:  # until the run's own handlers are in, a start signal (cli.py) unwinds: detached here, then the exit
        try:
            attached = runtime.start(_TraceHook(request, out, err, requests))
        except RunRefused as exc:  # nothing is left attached, listening or open (Runtime.start)
            print(f"retsnoop-otel: {exc.message}", file=err)
            return exc.exit_code
        if request.verbose:
            end = phase_since("ready", started.main_t0, 'main to "Receiving data...", Python\'s own start excluded') \
                if attached else phase_since("dry-run", started.main_t0, "main to the list of functions")
            steps = [imports, flags, *runtime.phases]
            rest = Phase("other", max(0.0, end.seconds - sum(p.seconds for p in steps)),
                         "between the phases above: privilege check, kernel identity, output")
            print("\n".join(format_phases([*started.before_main(), *steps, rest, end])), file=err, flush=True)
        raise_deferred()  # a start signal that landed in a C callback: the start ends here as it would have
        if not attached:
            return 0
        requests.install(reload=False)
    except BaseException:
        runtime.shutdown(0.0)
        raise
    print("Receiving data...", file=out, flush=True)
    t0 = time.monotonic()

    def detaching() -> None:
        nonlocal t0
        print("Detaching... ", end="", file=out, flush=True)
        t0 = time.monotonic()

    intervals = _intervals(runtime, request, out)
    try:
        stats = runtime.run(requests, detaching=detaching, after_poll=intervals.tick if intervals else lambda: None)
    except RunRefused as exc:  # a file output failed during the run (runtime/sinks.py): detached and flushed by now
        print(file=out, flush=True)  # the end of "Detaching... "
        print(f"retsnoop-otel: {exc.message}", file=err, flush=True)
        return exc.exit_code
    if stats.dropped_sessions or stats.incomplete_sessions or stats.dropped_records:
        print(f"DROPPED SESSIONS: {stats.dropped_sessions}, INCOMPLETE SESSIONS: {stats.incomplete_sessions}, "
              f"LOST RECORDS: {stats.dropped_records}. ", end="", file=out)
    print(f"DONE in {(time.monotonic() - t0) * 1000:.0f} ms.", file=out, flush=True)
    if intervals is not None:
        intervals.stop(runtime.origins_at_stop)
    _print_origins(runtime, request, out)
    if request.verbose:
        print("\n".join(format_phases(runtime.stop_phases)), file=err, flush=True)
    return 0


def _intervals(runtime: Runtime, request: TraceRequest, out: TextIO) -> OriginIntervals | None:
    """--origins-interval's tables, from the kernel's counts of the running probe sets; its first interval starts
    at "Receiving data..."."""
    if request.origins_interval is None:
        return None
    from retsnoop_otel.trace.origin_intervals import OriginIntervals
    return OriginIntervals(request.origins_interval, lambda: [(ps.funcs, ps.origin_counts())
                                                              for ps in runtime.probe_sets],
                           out, _json(request), runtime.deps.monotonic)


def _json(request: TraceRequest) -> bool:
    console = request.config.exporter.console
    return console is not None and console.format == "json"


def _print_origins(runtime: Runtime, request: TraceRequest, out: TextIO) -> None:
    """Where the run's errors started (every failing session the kernel counted), as a table or one JSON line;
    nothing (and nothing imported: this runs within the stop) when no session failed."""
    if not any(counts for _, counts in runtime.origins_at_stop):
        return
    from retsnoop_otel.render.origin_table import origin_rows, render_origins

    print(render_origins(origin_rows(runtime.origins_at_stop), _json(request)), end="", file=out, flush=True)


class _TraceHook(StartHook):
    """retsnoop's -v lines between the phases, and --dry-run's list of functions in place of attaching."""

    def __init__(self, request: TraceRequest, out: TextIO, err: TextIO, requests: Requests | None = None) -> None:
        self.request, self.out, self.err = request, out, err
        self.requests = requests or Requests()

    def _say(self, msg: str) -> None:
        if self.request.verbose:
            print(msg, file=self.err, flush=True)

    def warned(self, runtime: Runtime, messages: tuple[str, ...]) -> None:
        """The OTEL_* values ignored, whatever -v says: the run's log only prints errors."""
        for message in messages:
            print(f"retsnoop-otel: warning: {message}", file=self.err, flush=True)

    def go_on(self, runtime: Runtime, found: Resolved) -> bool:
        from retsnoop_otel.symbols.discovery import format_dry_run
        ((cfg, disc),) = found
        env = runtime.env
        assert env is not None
        if disc.mode:
            self._say(f"Using attach mode {disc.mode}" + ("" if cfg.attach_mode != "auto" else " (auto-detected)"))
        if disc.user_mode:
            self._say(f"Using user attach mode {disc.user_mode}"
                      + ("" if cfg.user_attach_mode != "auto" else " (auto-detected)"))
        self._say(f"Using vmlinux {env.vmlinux} for DWARF" if env.vmlinux else
                  "No vmlinux with DWARF found: kallsyms names only")
        if cfg.capture_args:
            for line in capped_arg_sizes(cfg.arg_sizes):
                self._say(line)
        if self.request.dry_run or self.request.verbose:
            from retsnoop_otel.kernel.inject_attach import dry_run_lines  # its probes: resolved with its functions
            text = "\n".join([format_dry_run(disc, self.request.verbose), *dry_run_lines(cfg.inject)])
            print(text, file=self.out if self.request.dry_run else self.err, flush=True)
        return not self.request.dry_run and not self.requests.stop  # stdout failed meanwhile: attach nothing

    def attached(self, runtime: Runtime, sets: list[ProbeSet]) -> None:
        for ps in sets:
            for name, why in ps.attach_failures:
                self._say(f"Failed to attach {name}: {why}")
            if ps.report is not None and ps.report.split_links:
                self._say(f"The kernel ran out of memory for a multi-function link (the objpool bug of Linux "
                          f"6.7-6.11): split {ps.report.split_links} times into smaller links")
            if ps.report is not None and ps.report.hooks_missing:
                self._say(f"Thread context: no publish hook ({'; '.join(ps.report.hooks_missing)}): processes "
                          "started from now on are found by timed checks only")
            if ps.report is not None:
                self._say(f"Successfully attached {ps.attached} functions in {ps.report.attach_ms:.0f} ms.")

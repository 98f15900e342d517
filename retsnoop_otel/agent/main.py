"""`retsnoop-otel agent`: the capture runtime driven by a YAML file, for as long as the host runs.

One capture loop polls every probe set's ring buffer; each kept session becomes one trace handed
to bounded export queues (the network never blocks capture). SIGHUP reloads the file: the new
probe sets are attached before the old ones are detached, and a bad new file (or one that does
not attach) leaves the old ones running. SIGTERM/SIGINT detach everything, flush the exporters
within a deadline and exit 0.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from retsnoop_otel import __version__
from retsnoop_otel.agent.config_file import AgentConfig, ConfigError, load_config
from retsnoop_otel.runtime.config import MetricsConfig
from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.runtime.errors import EXIT_HOST, EXIT_INPUT, RunRefused, exit_code_epilog
from retsnoop_otel.runtime.help_format import HelpFormatter, OneLineParser
from retsnoop_otel.runtime.log_bridge import bridge_library_logs
from retsnoop_otel.runtime.logs import EventLog
from retsnoop_otel.runtime.probe_set import resolve
from retsnoop_otel.runtime.runtime import SHUTDOWN_FLUSH_S, Runtime, RuntimeDeps
from retsnoop_otel.runtime.startup import Phase, StartClock, phase_fields, phase_since
from retsnoop_otel.symbols.discovery import format_dry_run


class Agent:
    def __init__(self, config_path: str, deps: RuntimeDeps | None = None, log: EventLog | None = None,
                 started: StartClock | None = None, before: Sequence[Phase] = ()) -> None:
        self.config_path = config_path
        self.started = started  # when main() began (cli.py): the start log says where the time went
        self.before = list(before)  # Python's start and the imports, measured by main()
        self.deps = deps or RuntimeDeps()
        self.log = log or EventLog()
        self.runtime: Runtime | None = None
        self._stop = False
        self._reload = False

    def start(self) -> None:
        """Load the config and attach everything; on failure nothing is left attached or listening."""
        cfg = load_config(self.config_path, self.deps.environ, "--config file")
        self.log.configure(cfg.logging.format, cfg.logging.level)
        runtime = Runtime(cfg.runtime, self.deps, self.log)
        runtime.start()
        self.runtime = runtime
        self._log_attached()
        phases = [*self.before, *runtime.phases]
        if self.started is not None:
            phases.append(phase_since("ready", self.started.main_t0, "main to attached"))
        self.log.info("agent started", config=self.config_path, listen=cfg.metrics.listen,
                      probe_sets=len(runtime.probe_sets), version=__version__, **phase_fields(phases))

    def _log_attached(self) -> None:
        assert self.runtime is not None
        for ps in self.runtime.probe_sets:
            self.log.info("probe set attached", probe_set=ps.name, mode=ps.cfg.mode, attach_mode=ps.mode,
                          functions=ps.attached, entry_functions=ps.discovery.entry_count,
                          failed=len(ps.attach_failures))
            for name, err in ps.attach_failures[:5]:
                self.log.warning("function not attached", probe_set=ps.name, function=name,
                                 error=err.splitlines()[0])

    def request_stop(self) -> None:
        self._stop = True

    def request_reload(self) -> None:
        self._reload = True

    def run(self) -> int:
        """The capture loop; returns when a stop was requested (after shutdown)."""
        assert self.runtime is not None, "start() first"
        try:
            while not self._stop:
                if self._reload:
                    self._reload = False
                    self.reload()
                    continue
                self.runtime.poll_once()
        finally:
            self.runtime.shutdown(SHUTDOWN_FLUSH_S)
        return 0

    def reload(self) -> bool:
        """Apply the config file again; on any error keep what runs now. Returns success."""
        assert self.runtime is not None
        try:
            cfg = load_config(self.config_path, self.deps.environ, "--config file")
        except ConfigError as exc:
            self.runtime.reloads["failure"] += 1
            self.log.error("config reload failed; the previous config keeps running", config=self.config_path,
                           error=str(exc))
            return False
        if not self.runtime.reload(cfg.runtime):
            return False
        self.log.configure(cfg.logging.format, cfg.logging.level)
        self.log.info("config reloaded", config=self.config_path, probe_sets=len(self.runtime.probe_sets),
                      **phase_fields(self.runtime.phases))
        self._log_attached()
        return True


def install_signal_handlers(agent: Agent) -> None:
    """SIGHUP: reload; SIGTERM/SIGINT: stop. The loop acts on them between polls."""
    signal.signal(signal.SIGHUP, lambda _s, _f: agent.request_reload())
    signal.signal(signal.SIGTERM, lambda _s, _f: agent.request_stop())
    signal.signal(signal.SIGINT, lambda _s, _f: agent.request_stop())


def _sampling_text(ps: object, metrics: MetricsConfig) -> str:
    """What --check says of sampling (with the tracestate the spans carry) and of the histogram buckets."""
    from retsnoop_otel.capture.sampling import threshold, trace_state
    s = ps.sampling  # type: ignore[attr-defined]
    rng = ps.duration_range or metrics.duration_range  # type: ignore[attr-defined]
    buckets = f", duration buckets {rng.describe()}" if rng is not None else ""
    if not s.captures_success:
        return f"success sessions: none{buckets}"
    if s.success_rate_per_s:
        return f"success sessions: {s.success_rate_per_s:g}/s per entry function (no sampling threshold){buckets}"
    return (f"success sessions: probability {s.success_probability:g} "
            f"({trace_state(threshold(s.success_probability))}){buckets}")


def check(path: str, out: TextIO, deps: RuntimeDeps | None = None,
          load_env: Callable[[AgentConfig], KernelEnv] | None = None) -> int:
    """`agent --check`: validate, then resolve every probe set's globs against this kernel (no attach).

    "configuration is valid" is the last line, printed only after every check passed: the config, the files and
    endpoints it names, this host's kernel and each probe set's functions. A failed check ends the run with its
    error alone (raised: exit 2 for bad input, 1 for this host) or, for probe sets whose globs match nothing
    here, their ERROR lines and exit 1."""
    deps = deps or RuntimeDeps()
    cfg = load_config(path, deps.environ, "--check file")
    runtime = Runtime(cfg.runtime, deps)
    runtime.vmlinux = runtime.check_inputs()
    env = load_env(cfg) if load_env is not None else runtime.load_env()
    report: list[str] = []
    failed = 0
    try:
        for ps in cfg.probe_sets:
            try:
                disc = resolve(ps, env, cfg.names)
            except RunRefused as exc:
                report.append(f"probe set '{ps.name}': ERROR: {exc.message}")
                failed += 1
                continue
            report.append(f"probe set '{ps.name}' (mode {ps.mode}, attach_mode {ps.attach_mode} -> {disc.mode}, "
                          f"{_sampling_text(ps, cfg.metrics)}):\n"
                          + "  " + format_dry_run(disc).replace("\n", "\n  "))
    finally:
        env.close()
    print("\n\n".join(report), file=out)
    if failed:
        return EXIT_HOST.code
    print(f"\n{path}: configuration is valid ({len(cfg.probe_sets)} probe sets)", file=out)
    return 0


def main(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr,
         started: StartClock | None = None) -> int:
    before = [*started.before_main(), phase_since("imports", started.main_t0, "the agent's modules")] if started else []
    p = OneLineParser(prog="retsnoop-otel agent", formatter_class=HelpFormatter,
                                description="Run the long-running exporter: probe sets from a YAML config, "
                                            "sessions as OTLP traces, metrics on /metrics.",
                                epilog=exit_code_epilog())
    p.add_argument("--config", metavar="FILE", help="YAML config (see config/agent.yaml)")
    p.add_argument("--check", metavar="FILE", help="validate FILE and resolve its globs against the running "
                   "kernel without attaching; exit 0 when every probe set would attach")
    p.add_argument("--health", action="store_true", help="ask the agent running with --config FILE for its "
                   "/healthz, where and as the config serves it (TLS, basic auth); exit 0 when healthy (a container's "
                   "health check)")
    args = p.parse_args(argv)
    if args.health:
        if not args.config:
            p.error("--health needs --config FILE (the running agent's)")
        from retsnoop_otel.agent import health
        code, line = health.main(args.config)
        print(line if code != EXIT_INPUT.code else f"retsnoop-otel agent: {line}", file=out if code == 0 else err)
        return code
    if args.check:
        try:
            return check(args.check, out)
        except ConfigError as exc:
            print(f"retsnoop-otel agent: {exc}", file=err)
            return EXIT_INPUT.code
        except RunRefused as exc:
            print(f"retsnoop-otel agent: {exc}", file=err)
            return exc.exit_code
    if not args.config:
        p.error("--config FILE is required (or --check FILE)")
    log = EventLog(err)
    bridge_library_logs(log)  # grpc's and the exporters' own warnings follow the configured log format too
    agent = Agent(args.config, log=log, started=started, before=before)
    install_signal_handlers(agent)
    try:
        agent.start()
    except ConfigError as exc:
        log.error("invalid config", error=str(exc))
        return EXIT_INPUT.code
    except RunRefused as exc:
        log.error("cannot start", error=str(exc))
        return exc.exit_code
    return agent.run()

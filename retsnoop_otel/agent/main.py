"""`retsnoop-otel agent`: the capture runtime driven by a YAML file, for as long as the host runs.

One capture loop polls every probe set's ring buffer; each kept session becomes one trace handed
to bounded export queues (the network never blocks capture). SIGHUP reloads the file, and so does a
change of it (config_watch.py: a ConfigMap update too): the new probe sets are attached before the
old ones are detached, and a bad new file (or one that does not attach) leaves the old ones running.
SIGTERM/SIGINT detach everything, flush the exporters within a deadline and exit 0.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from retsnoop_otel import __version__
from retsnoop_otel.agent.check import check, located
from retsnoop_otel.agent.config_file import ConfigError, LoggingConfig, load_config
from retsnoop_otel.agent.config_watch import ConfigWatch
from retsnoop_otel.command.errors import EXIT_INPUT, RunRefused, exit_code_epilog
from retsnoop_otel.command.help_format import HelpFormatter, OneLineParser
from retsnoop_otel.command.log_bridge import bridge_library_logs
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.command.streams import StartSignals, raise_deferred
from retsnoop_otel.export.otel_env import log_level
from retsnoop_otel.metrics import server as _listener  # noqa: F401 - with the agent: every agent binds /metrics
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.environment import kernel_env_loader
from retsnoop_otel.runtime.hooks import StartHook
from retsnoop_otel.runtime.probe_set import ProbeSet
from retsnoop_otel.runtime.requests import Requests
from retsnoop_otel.runtime.runtime import Runtime
from retsnoop_otel.runtime.startup import Phase, StartClock, phase_fields, phase_since

if TYPE_CHECKING:
    from retsnoop_otel.symbols.read_ahead import TablesAhead


class Agent:
    def __init__(self, config_path: str, deps: RuntimeDeps | None = None, log: EventLog | None = None,
                 started: StartClock | None = None, before: Sequence[Phase] = (), watch: bool = False,
                 requests: Requests | None = None) -> None:
        self.config_path = config_path
        self.started = started  # when main() began (cli.py): the start log says where the time went
        self.before = list(before)  # Python's start and the imports, measured by main()
        self.deps = deps or RuntimeDeps()
        self.log = log or EventLog()
        self.runtime: Runtime | None = None
        self.requests = requests or Requests()
        self.watch_file = watch
        self.watch: ConfigWatch | None = None

    def start(self) -> None:
        """Load the config and attach everything; on failure nothing is left attached or listening. With `watch`,
        the file is watched from before it is read: a change during the start reloads once the run begins."""
        if self.watch_file:
            self.watch = ConfigWatch(self.config_path, lambda: self.requests.ask_reload("file change"), self.log)
            self.watch.start()
        try:
            self._start()
        except BaseException:
            self.stop_watch()
            raise

    def _start(self) -> None:
        cfg = load_config(self.config_path, "--config file")
        self.log.configure(cfg.logging.format, self._level(cfg.logging))
        runtime = Runtime(cfg.runtime, self.deps, self.log)
        try:
            runtime.start(_AgentHook(self.log))
        except RunRefused as exc:
            raise located(exc, cfg) from None
        self.runtime = runtime  # from here a Ctrl-C is the caller's to undo (main), with self.runtime set
        phases = [*self.before, *runtime.phases]
        if self.started is not None:
            phases.append(phase_since("ready", self.started.main_t0, "main to attached"))
        self.log.info("agent started", config=self.config_path, listen=cfg.runtime.metrics.listen,
                      probe_sets=len(runtime.probe_sets), version=__version__, watch=self.watch is not None,
                      **phase_fields(phases))

    def _level(self, logging: LoggingConfig) -> str:
        """logging.level, else OTEL_LOG_LEVEL (the run's settings warn about a value it cannot be), else info."""
        return logging.level or log_level(self.deps.environ) or "info"

    def request_stop(self) -> None:
        self.requests.stop = True

    def request_reload(self) -> None:
        self.requests.reload = True

    def run(self) -> int:
        """The capture loop; returns when a stop was requested (after shutdown)."""
        assert self.runtime is not None, "start() first"
        try:
            self.runtime.run(self.requests, reload=self.reload)
        finally:
            self.stop_watch()
        return 0

    def stop_watch(self) -> None:
        if self.watch is not None:
            watch, self.watch = self.watch, None
            watch.stop()

    def reload(self) -> bool:
        """Apply the config file again; on any error keep what runs now. Returns success."""
        assert self.runtime is not None
        trigger, self.requests.reload_cause = self.requests.reload_cause or "request", ""
        self.log.info("reloading config", trigger=trigger, config=self.config_path)
        if self.watch is not None:
            self.watch.reloading()
        try:
            cfg = load_config(self.config_path, "--config file")
        except ConfigError as exc:
            self.runtime.reload_failed(str(exc), config=self.config_path, trigger=trigger)
            return False
        if not self.runtime.reload(cfg.runtime, _AgentHook(self.log)):
            return False
        self.log.configure(cfg.logging.format, self._level(cfg.logging))
        self.log.info("config reloaded", config=self.config_path, probe_sets=len(self.runtime.probe_sets),
                      trigger=trigger, **phase_fields(self.runtime.phases))
        return True


class _AgentHook(StartHook):
    """The log lines of what was attached, at a start and at every reload."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def attached(self, runtime: Runtime, sets: list[ProbeSet]) -> None:
        for ps in sets:
            self.log.info("probe set attached", probe_set=ps.name, mode=ps.cfg.mode, attach_mode=ps.mode,
                          **({"user_attach_mode": ps.discovery.user_mode} if ps.discovery.user_mode else {}),
                          functions=ps.attached, entry_functions=ps.discovery.entry_count,
                          failed=len(ps.attach_failures))
            if ps.report is not None and ps.report.hooks_missing:
                self.log.warning("thread-context publish hooks not attached: processes started from now on are "
                                 "found by timed checks only", probe_set=ps.name, hooks=ps.report.hooks_missing)
            for name, err in ps.attach_failures[:5]:
                self.log.warning("function not attached", probe_set=ps.name, function=name,
                                 error=err.splitlines()[0])


def main(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr,
         started: StartClock | None = None, ahead: TablesAhead | None = None) -> int:
    """`ahead`: the kernel's tables being read since main() began (symbols/read_ahead.py)."""
    before = [*started.before_main(), phase_since("imports", started.main_t0, "the agent's modules")] if started else []
    p = OneLineParser(prog="retsnoop-otel agent", formatter_class=HelpFormatter,
                                description="Run the long-running exporter: probe sets from a YAML config, "
                                            "sessions as OTLP traces, metrics on /metrics.",
                                epilog=exit_code_epilog())
    p.add_argument("--config", metavar="FILE", help="YAML config (see config/agent.yaml)")
    p.add_argument("--check", metavar="FILE", help="validate FILE as the run would, without attaching: settings, "
                   "outputs (files opened, /metrics bound, then released), and on a host that can trace the globs "
                   "against this kernel (skipped and said otherwise); the run's exit code")
    p.add_argument("--no-kernel", action="store_true", help="with --check: skip the checks that need this host's "
                   "kernel (privileges, kernel, globs) even where it can trace, as in CI")
    p.add_argument("--health", action="store_true", help="ask the agent running with --config FILE for its "
                   "/healthz, where and as the config serves it (TLS, basic auth); exit 0 when healthy (a container's "
                   "health check)")
    p.add_argument("--no-watch-config", dest="watch_config", action="store_false", help="do not reload when the "
                   "--config file changes (a ConfigMap update included); SIGHUP still reloads")
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
            return check(args.check, out, err=err, no_kernel=args.no_kernel)
        except ConfigError as exc:
            print(f"retsnoop-otel agent: {exc}", file=err)
            return EXIT_INPUT.code
        except RunRefused as exc:
            print(f"retsnoop-otel agent: {exc}", file=err)
            return exc.exit_code
    if args.no_kernel:
        p.error("--no-kernel goes with --check FILE")
    if not args.config:
        p.error("--config FILE is required (or --check FILE)")
    log = EventLog(err)
    bridge_library_logs(log)  # grpc's and the exporters' own warnings follow the configured log format too
    agent = Agent(args.config, deps=RuntimeDeps(load_env=kernel_env_loader(ahead)), log=log, started=started,
                  before=before, watch=args.watch_config,
                  requests=Requests(getattr(err, "interrupt_write", None)))  # a log write blocked: given up at a stop
    # Ctrl-C interrupts the start (130, what was attached detached); SIGTERM and SIGHUP wait for its end
    StartSignals({signal.SIGTERM: agent.requests.ask_stop,
                  signal.SIGHUP: lambda: agent.requests.ask_reload("SIGHUP")}).install()
    try:
        agent.start()
        raise_deferred()  # a Ctrl-C that landed in a C callback during the start
        agent.requests.install(reload=True)
    except ConfigError as exc:
        log.error("invalid config", error=str(exc))
        return EXIT_INPUT.code
    except RunRefused as exc:
        log.error("cannot start", error=str(exc))
        return exc.exit_code
    except BaseException:  # Ctrl-C after the runtime started, before the run's handlers: detached here
        if agent.runtime is not None:
            agent.runtime.shutdown(0.0)
        agent.stop_watch()
        raise
    return agent.run()

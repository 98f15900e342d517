"""What a command does between the runtime's start steps: trace's -v lines and --dry-run, agent --check's
report, the agent's log. The commands say what they need here instead of sequencing the steps themselves."""

from __future__ import annotations

from typing import Any, Protocol

from retsnoop_otel.command.errors import RunRefused
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.runtime.config import ProbeSetConfig, RuntimeConfig
from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.runtime.probe_set import ProbeSet
from retsnoop_otel.symbols import discovery

Resolved = list[tuple[Any, discovery.Discovery]]


class Runtime(Protocol):
    """What a hook reads of the runtime (runtime.Runtime) between the steps."""

    config: RuntimeConfig
    env: KernelEnv | None
    log: EventLog


class StartHook:
    """This one says nothing and goes through every step: the agent's run."""

    outputs = True  # bind /metrics and open the outputs to keep (False: agent --check opens and releases them)
    each_set = False  # a probe set whose functions cannot be resolved goes to discovered(); the rest go on

    def warned(self, runtime: Runtime, messages: tuple[str, ...]) -> None:
        """The OTEL_* values ignored (RunSettings.warnings), right after the settings: one log line each."""
        for message in messages:
            runtime.log.warning(message)

    def discovered(self, ps: ProbeSetConfig, found: discovery.Discovery | None, error: RunRefused | None) -> None:
        """A probe set's functions and attach mode, or (with each_set) why it has none here."""

    def go_on(self, runtime: Runtime, found: Resolved) -> bool:
        """Every set is resolved and nothing is attached yet: False stops the start here (a dry run)."""
        return True

    def attached(self, runtime: Runtime, sets: list[ProbeSet]) -> None:
        """The sets are attached (at a start, or swapped in at a reload)."""

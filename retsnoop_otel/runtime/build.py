"""What one pass of the runtime's start steps made (runtime.py `_steps`), part by part: a start keeps all of
it, a reload swaps it in beside the running parts, and a failure closes exactly these parts."""

from __future__ import annotations

from typing import Any

from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.runtime.probe_set import ProbeSet
from retsnoop_otel.runtime.settings import RunSettings
from retsnoop_otel.runtime.sinks import Sinks
from retsnoop_otel.workload.resolver import WorkloadResolver


class Build:
    __slots__ = ("settings", "server", "web", "sinks", "workloads", "env", "env_key", "sets")

    def __init__(self) -> None:
        self.settings: RunSettings | None = None
        self.server: Any = None  # a /metrics server bound by these steps
        self.web: Any = None  # the running server's web config, read again (a reload keeping the listen address)
        self.sinks: Sinks | None = None
        self.workloads: WorkloadResolver | None = None
        self.env: KernelEnv | None = None
        self.env_key: tuple | None = None  # what env was loaded for (None: load again at a reload)
        self.sets: list[ProbeSet] = []

    def close(self, running_env: KernelEnv | None) -> None:
        """A start or reload that failed: never the running parts (the kernel tables may be shared). Its sets are
        attached only when what follows the attach failed (the sinks)."""
        for ps in self.sets:
            ps.close()
        self.sets = []
        if self.server is not None:
            self.server.close()
        if self.sinks is not None:
            self.sinks.close(0.0)
        if self.workloads is not None:
            self.workloads.close()
        if self.env is not None and self.env is not running_env:
            self.env.close()

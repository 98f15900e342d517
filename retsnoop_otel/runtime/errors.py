"""The two ways a run can be refused, so that each command maps them to its exit code once.

InputError: what the user wrote cannot work (a flag, a config value, a glob, a path, an endpoint).
SetupError: this host or kernel cannot do it now (privileges, a kernel feature, a busy port).
Both are raised before anything is loaded into the kernel, or after everything was detached.
"""

from __future__ import annotations


class RunRefused(Exception):
    """One sentence for the user; `probe_set` names the set it concerns when there are several."""

    exit_code = 1

    def __init__(self, message: str, probe_set: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.probe_set = probe_set

    def __str__(self) -> str:
        return f"probe set '{self.probe_set}': {self.message}" if self.probe_set else self.message

    def for_set(self, probe_set: str) -> RunRefused:
        """The same error, naming the probe set it happened in."""
        return type(self)(self.message, probe_set)


class InputError(RunRefused):
    exit_code = 2


class SetupError(RunRefused):
    exit_code = 1

"""The two ways a run can be refused, so that each command maps them to its exit code once.

InputError: what the user wrote cannot work (a flag, a config value, a glob, a path, an endpoint).
SetupError: this host or kernel cannot do it now (privileges, a kernel feature, a busy port).
Both are raised before anything is loaded into the kernel, or after everything was detached.
"""

from typing import NamedTuple


class ExitCode(NamedTuple):
    code: int
    short: str  # for --help
    meaning: str  # for the README


# Every exit code of every command, in one place: the README's table and `--help` are rendered from it.
EXIT_OK = ExitCode(0, "done", "done; Ctrl-C, SIGTERM or (`trace`, unless started under `nohup`) SIGHUP after "
                   "start-up detaches, flushes and ends here too")
EXIT_HOST = ExitCode(1, "this host cannot do it", "this host cannot do it now: privileges, a missing kernel feature, "
                     "no LBR, a busy or privileged port, a listen address that is not this machine's (or a name "
                     "that does not resolve here), an agent that is not healthy (`agent --health`); or stdout "
                     "failed (a full disk, `>/dev/full`: one line on stderr, after detaching)")
EXIT_INPUT = ExitCode(2, "bad input", "bad input: a flag, a config file, a file it names or a variable of its own "
                      "(an `OTEL_*` variable is warned about and ignored instead); nothing was loaded into the kernel")
EXIT_HANGUP = ExitCode(129, "SIGHUP during start-up", "SIGHUP during the start-up of `trace` (or while `features` "
                       "probes): what was already attached is detached first (the agent reloads its config on SIGHUP "
                       "instead)")
EXIT_INTERRUPTED = ExitCode(130, "Ctrl-C during start-up", "Ctrl-C (SIGINT) during the start-up of `trace`, `features` "
                            "or the agent, a slow BPF load or attach included: what was already attached is detached "
                            "first (not in Python's own start, before the package runs: docs/reference/exit-codes.md)")
EXIT_PIPE = ExitCode(141, "the output's reader went away",
                     "the reader of the output went away (a `head` that read enough): said nowhere, after detaching")
EXIT_TERMINATED = ExitCode(143, "SIGTERM during start-up", "SIGTERM during the start-up of `trace` (or while "
                           "`features` probes): what was already attached is detached first")
EXIT_CODES = (EXIT_OK, EXIT_HOST, EXIT_INPUT, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_PIPE, EXIT_TERMINATED)

def exit_code_table() -> str:
    """The README's Markdown table."""
    return "\n".join(["| Exit | Meaning |", "|---|---|", *(f"| {c.code} | {c.meaning} |" for c in EXIT_CODES)])


def exit_code_epilog() -> str:
    """One paragraph for the end of `--help`."""
    return "exit codes: " + ", ".join(f"{c.code} {c.short}" for c in EXIT_CODES)


class RunRefused(Exception):
    """One sentence for the user; `probe_set` names the set it concerns when there are several."""

    exit_code = EXIT_HOST.code

    def __init__(self, message: str, probe_set: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.probe_set = probe_set

    def __str__(self) -> str:
        return f"probe set '{self.probe_set}': {self.message}" if self.probe_set else self.message

    def for_set(self, probe_set: str) -> "RunRefused":
        """The same error, naming the probe set it happened in."""
        return type(self)(self.message, probe_set)


class InputError(RunRefused):
    exit_code = EXIT_INPUT.code


class SetupError(RunRefused):
    exit_code = EXIT_HOST.code

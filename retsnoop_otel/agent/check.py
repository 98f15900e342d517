"""`agent --check`: the agent's start minus the kernel, so that a config can be checked where it is written.

It runs the runtime's own start steps (runtime.py `_steps`), so the check and the run refuse the same input the
same way: settings, then the outputs opened and released (/metrics bound with its web config, output files opened
as the run opens them), then, only when this host can trace, privileges, the kernel and each probe set's
discovery, never the attach. A host that cannot trace (no privileges, a kernel without kprobes or fentry, or
`--no-kernel`) skips those last steps and says so; the rest still decides the exit code, the run's own.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from retsnoop_otel.agent.config_file import AgentConfig, load_config
from retsnoop_otel.command.errors import RunRefused, SetupError
from retsnoop_otel.runtime.config import MetricsConfig, ProbeSetConfig
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.hooks import Resolved, StartHook
from retsnoop_otel.runtime.runtime import Runtime
from retsnoop_otel.symbols.discovery import Discovery, format_dry_run

NO_KERNEL = "--no-kernel was given"


class KernelSkipped(Exception):
    """The kernel's steps cannot run here: not an error of the config, the reason is reported instead."""


def located(exc: RunRefused, cfg: AgentConfig) -> RunRefused:
    """The runtime's error with the file and line of the key it names."""
    return exc if exc.probe_set else type(exc)(cfg.where(exc.message))


def _sampling_text(ps: Any, metrics: MetricsConfig) -> str:
    """What --check says of sampling (with the tracestate the spans carry) and of the histogram buckets."""
    from retsnoop_otel.capture.sampling import threshold, trace_state
    s = ps.sampling
    rng = ps.duration_range or metrics.duration_range
    buckets = f", duration buckets {rng.describe()}" if rng is not None else ""
    errors = ""
    if s.error_rate_per_s:
        errors = f", error sessions: {s.error_rate_per_s:g}/s per error origin (no sampling threshold)"
    elif s.error_probability < 1.0:
        state = trace_state(threshold(s.error_probability))
        errors = f", error sessions: probability {s.error_probability:g} ({state})"
    if not s.captures_success:
        return f"success sessions: none{errors}{buckets}"
    if s.success_rate_per_s:
        return (f"success sessions: {s.success_rate_per_s:g}/s per entry function (no sampling threshold)"
                f"{errors}{buckets}")
    return (f"success sessions: probability {s.success_probability:g} "
            f"({trace_state(threshold(s.success_probability))}){errors}{buckets}")


class CheckHook(StartHook):
    """Every probe set resolved against this kernel when it can trace, one report per set, nothing attached."""

    outputs = False  # opened and released (MetricsView.check): a running agent may hold them
    each_set = True

    def __init__(self, metrics: MetricsConfig, err: TextIO) -> None:
        self.metrics = metrics
        self.err = err
        self.report: list[str] = []
        self.errors: list[RunRefused] = []
        self.refusal = ""  # why this kernel cannot trace kernel functions ("" = it can)
        self.skipped: list[str] = []  # probe sets whose kernel functions were not resolved because of that

    def warned(self, runtime: Any, messages: tuple[str, ...]) -> None:
        """The OTEL_* values ignored, on stderr at once: said even when a later check fails."""
        for message in messages:
            print(f"retsnoop-otel agent: warning: {message}", file=self.err, flush=True)

    def discovered(self, ps: ProbeSetConfig, found: Discovery | None, error: RunRefused | None) -> None:
        if found is None:
            if isinstance(error, SetupError) and self.refusal and error.message == self.refusal:
                self.skipped.append(ps.name)
            else:
                self.errors.append(error.for_set(ps.name) if error and not error.probe_set
                                   else error or RunRefused("not resolved", ps.name))
            return
        modes = [f"attach_mode {ps.attach_mode} -> {found.mode}"] if found.mode else []
        modes += [f"user_attach_mode {ps.user_attach_mode} -> {found.user_mode}"] if found.user_mode else []
        self.report.append(f"probe set '{ps.name}' (mode {ps.mode}, {', '.join(modes)}, "
                           f"{_sampling_text(ps, self.metrics)}):\n"
                           + "  " + format_dry_run(found).replace("\n", "\n  "))

    def go_on(self, runtime: Any, found: Resolved) -> bool:
        return False


def _kernel_free(deps: RuntimeDeps, hook: CheckHook, no_kernel: bool) -> RuntimeDeps:
    """The same dependencies, with the kernel's refusals turned into KernelSkipped (all of them with no_kernel)."""
    out = RuntimeDeps()
    for slot in RuntimeDeps.__slots__:
        setattr(out, slot, getattr(deps, slot))

    def check_privileges() -> None:
        if no_kernel:
            raise KernelSkipped(NO_KERNEL)
        try:
            deps.check_privileges()
        except SetupError as exc:
            raise KernelSkipped(exc.message) from None

    def load_env(*args: Any) -> Any:
        try:
            env = deps.load_env(*args)
        except SetupError as exc:
            raise KernelSkipped(exc.message) from None
        hook.refusal = env.kernel_refusal
        return env

    out.check_privileges, out.load_env = check_privileges, load_env
    return out


def check(path: str, out: TextIO, deps: RuntimeDeps | None = None, err: TextIO | None = None,
          no_kernel: bool = False) -> int:
    """Validate `path` as the run would; returns the run's exit code (errors go to `err`, the run's stream).

    "configuration is valid" is the last line of `out`, printed only when every check that could run here passed;
    the kernel's checks that could not run are named before it."""
    err = sys.stderr if err is None else err
    cfg = load_config(path, "--check file")
    hook = CheckHook(cfg.runtime.metrics, err)
    skipped = ""
    try:
        Runtime(cfg.runtime, _kernel_free(deps or RuntimeDeps(), hook, no_kernel)).start(hook)
    except KernelSkipped as exc:
        skipped = str(exc)
    except SetupError as exc:
        if not (hook.refusal and exc.message == hook.refusal):  # env.refuse_kernel_only: no set of user functions
            raise located(exc, cfg) from None
        skipped = hook.refusal
    except RunRefused as exc:
        raise located(exc, cfg) from None
    if hook.errors:
        for exc in hook.errors:
            print(f"retsnoop-otel agent: {exc}", file=err)
        return hook.errors[0].exit_code
    if hook.report:
        print("\n\n".join(hook.report), file=out)
    n = len(cfg.runtime.probe_sets)
    if skipped or hook.skipped:
        what = ("privileges, the kernel and the discovery of every probe set" if skipped
                else "the kernel functions of probe sets " + ", ".join(hook.skipped))
        print(f"kernel checks skipped ({skipped or hook.refusal}): {what}", file=out)
    note = "; kernel checks skipped" if skipped or hook.skipped else ""
    print(f"\n{path}: configuration is valid ({n} probe sets{note})", file=out)
    return 0

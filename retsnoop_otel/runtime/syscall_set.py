"""A probe set with `syscalls: true` (`trace --syscalls`) as the globs discovery resolves: the preset's functions
(symbols/syscall_preset.py) chosen on the running kernel's tables, before the set's own entry and allow globs.

Called by runtime/probe_set.py resolve, so that the agent, `trace`, --dry-run and agent --check resolve the preset
the one way; a set without the key passes through unchanged.
"""

from __future__ import annotations

import os

from retsnoop_otel.command.errors import SetupError
from retsnoop_otel.kernel.attach_modes import BY_ADDRESS
from retsnoop_otel.runtime.config import ProbeSetConfig
from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.symbols import syscall_numbers, syscall_preset

# the modes auto may choose that attach a whole set with one syscall (kprobe.multi links: kprobe.session and
# kprobe.multi): the preset's ~1,400 functions attach in well under a second there, where one trampoline or kprobe per
# function took many minutes under emulation
MULTI_ATTACH = BY_ADDRESS


def with_preset(cfg: ProbeSetConfig, env: KernelEnv, machine: str | None = None) -> ProbeSetConfig:
    """`cfg` with the preset's entries and allow set added (unchanged without `syscalls`).

    Refused (SetupError): a kernel that cannot trace, no BTF index to list the functions' return types, or, when
    the attach mode is left to auto, a kernel with no multi-attach mode (asking for a mode attaches singly)."""
    if not cfg.syscalls:
        return cfg
    if env.kernel_refusal:
        raise SetupError(env.kernel_refusal, cfg.name)
    names_returning = getattr(env.ret_kind, "names_returning", None)
    if names_returning is None:
        raise SetupError("the syscall preset lists functions by their BTF return type, and this kernel's BTF was read "
                         "by libbpf's lookups only (a BTF kind the index does not know): give entry globs instead",
                         cfg.name)
    if cfg.attach_mode == "auto" and env.auto_mode not in MULTI_ATTACH:
        raise SetupError("the syscall preset attaches about a thousand functions, in one call with kprobe.session or "
                         "kprobe.multi (Linux 5.18+, CONFIG_FPROBE), which this kernel lacks; one probe per function "
                         "takes minutes to attach: ask for it with an attach mode (-K) if that is what you want",
                         cfg.name)
    try:
        prefix = syscall_preset.entry_prefix(machine or os.uname().machine)
    except ValueError as exc:
        raise SetupError(str(exc), cfg.name) from None
    preset = syscall_preset.select(names_returning(syscall_preset.ERRNO_KINDS), env.available,  # type: ignore[arg-type]
                                   prefix, cfg.syscalls_budget, cfg.deny)
    if not preset.entry:
        raise SetupError(f"the syscall preset found no traceable {prefix}* function on this kernel", cfg.name)
    return cfg._replace(entry=(*preset.entry, *cfg.entry), allow=(*preset.allow, *cfg.allow))


def boundaries(cfg: ProbeSetConfig, machine: str | None = None) -> dict[str, tuple[int, ...]]:
    """The preset's entry functions whose sessions the syscall tracepoints start and end, by name, with their
    syscall numbers (kernel/syscall_hooks.py); none without `syscalls`. A raw tracepoint at every syscall costs
    a fraction of a probe on each entry function, and the preset enters by every syscall."""
    return syscall_numbers.entry_numbers(machine or os.uname().machine) if cfg.syscalls else {}

"""The "every syscall, no choosing" preset (`trace --syscalls`, a probe set's `syscalls: true`): which functions.

Entries: every syscall entry function of the running kernel's architecture (`__x64_sys_*`, `__arm64_sys_*`) that
ftrace can hook. Allow set: functions whose BTF return type can carry an errno (int, long and their signed
typedefs and enums; not void, bool, unsigned or pointers), traceable, minus the deny lists, at most `budget` of
them, in origin_rank's order (checks, then gates, then the rest; a hash of the name within each). Pure: the
kernel's tables come in as values (runtime/syscall_set.py passes the running kernel's), and the names chosen go to
discovery (symbols/discovery.py) as exact globs, which checks and attaches them as any `-a`.
"""

import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.inputs.numbers import IntRange
from retsnoop_otel.symbols.discovery import BUILTIN_DENY, is_user_spec
from retsnoop_otel.symbols.globs import lines_matching, name_blob
from retsnoop_otel.symbols.traceable import Traceable

ENTRY_PREFIXES = {"x86_64": "__x64_sys_", "aarch64": "__arm64_sys_", "arm64": "__arm64_sys_"}
ERRNO_KINDS = frozenset({RetKind.INT32, RetKind.SIGNED})
DEFAULT_BUDGET = 1000
BUDGET = IntRange(0, 50000, "functions of the allow set")
# Syscall wrappers (other ABIs', and the inner layers of an entry): they pass an error up, they do not start one.
_WRAPPERS = re.compile(r"^__(?:x64|ia32|x32|arm64|se|do)_(?:compat_)?sys_")
# Hot paths that run in every syscall (or outside any: interrupts, the scheduler, timers) and return an int:
# a probe on them costs on every call, in a session or not, and they are not where a syscall's error starts; and
# the BPF LSM's empty hooks (bpf_lsm_*), which return 0 unless a BPF LSM program is attached to them, and the
# tracepoints' generated code (their iterators, event output and offsets), never part of a syscall's error path.
HOT_PATHS = ("bpf_lsm_*", "__traceiter_*", "trace_raw_output_*", "trace_event_*", "perf_trace_*", "__probestub_*",
             "*spin_*", "*_lock", "*_lock_*", "*_trylock*", "*mutex*", "*rwsem*", "*sched*", "*wake_up*",
             "*irq*", "*hrtimer*", "*timer*", "tick_*", "rcu_*", "*printk*", "*console*", "*_nmi*", "perf_*",
             "*workqueue*", "*queue_work*", "*ktime*", "*clock*", "*_cpu_*", "*stack*", "*tlb*", "*seqcount*")
# Each security module's own implementation of an LSM hook (AppArmor, TOMOYO, Landlock, IMA/EVM, SELinux, Smack,
# Yama, IPE): the security_* dispatcher that calls them returns what they return, so an LSM's refusal still has its
# origin, the hook (security_file_open, EACCES), one `-a 'apparmor_*'` away from the module's own function. Every
# open, read and write passes through several of them on success, each with a probe's cost (leaving them out took
# the preset's syscall loop from +348% to +301%: bench/RESULTS.md "Syscall preset").
LSM_MODULES = ("aa_*", "apparmor_*", "tomoyo_*", "hook_*", "landlock_*", "ima_*", "evm_*", "integrity_*", "selinux_*",
               "smack_*", "yama_*", "ipe_*")
_CHECKS = re.compile(r"(?:^|_)(?:check|checks|validate|valid|verify|sanity)(?:_|$)")
_GATES = re.compile(r"(?:^|_)(?:perm|permission|capable|may|security|parse|lookup|alloc|charge|reserve|resolve|"
                    r"prepare|get_unused_fd|copy_from_user|access|limit|prot)(?:_|$)")


class Preset(NamedTuple):
    """The functions chosen, and how many could have been (what the budget left out: candidates - len(allow))."""

    entry: tuple[str, ...]
    allow: tuple[str, ...]
    candidates: int  # errno-returning functions left after the deny lists and the traceability check


def entry_prefix(machine: str) -> str:
    """The syscall entry functions' prefix on this architecture (os.uname().machine); ValueError for another."""
    try:
        return ENTRY_PREFIXES[machine]
    except KeyError:
        raise ValueError(f"the syscall preset knows the entry functions of {', '.join(sorted(set(ENTRY_PREFIXES)))}"
                         f", not {machine}'s: give entry globs (-e) instead") from None


def origin_rank(name: str, crc32: Callable[[bytes], int]) -> tuple[int, int]:
    """The order in which candidates fill the budget: functions that check and validate first (where EINVAL,
    E2BIG and the like start), then the gates (permissions, lookups, allocations, parsing: EPERM, ENOENT, ENOMEM),
    then the rest; within a tier, by CRC-32 of the name, a fixed order spread over every subsystem rather than
    the alphabet's first few. The same tables give the same set on every run and every node. `crc32`: zlib's,
    imported by the caller (an extension module: loaded by the preset's runs, not by every start)."""
    tier = 0 if _CHECKS.search(name) else 1 if _GATES.search(name) else 2
    return tier, crc32(name.encode())


def _denied(names: Iterable[str], deny: Sequence[str], hot: bool) -> set[str]:
    """The names any of these deny globs (plain function globs: discovery applies the module and source ones)
    or the built-in deny list match, and with `hot` the hot paths."""
    blob = name_blob(names)
    plain = [g.strip() for g in deny if g.strip() and not is_user_spec(g) and not g.strip().startswith(":")
             and not any(c.isspace() for c in g.strip())]
    globs = [*plain, *(HOT_PATHS + LSM_MODULES if hot else ()), *(g for group in BUILTIN_DENY for g in group.globs)]
    return set().union(*(lines_matching(g, blob) for g in globs))


def select(errno_funcs: Iterable[str], available: Traceable, prefix: str, budget: int = DEFAULT_BUDGET,
           deny: Sequence[str] = ()) -> Preset:
    """The preset on one kernel: `errno_funcs` are the names whose BTF return kind is in ERRNO_KINDS, `available`
    the traceable functions (available_filter_functions), `prefix` entry_prefix()'s, `deny` the set's deny globs.

    Only functions listed once by ftrace are chosen (one instance: no ambiguity to resolve in any attach mode)."""
    entries = sorted(lines_matching(prefix + "*", available.names_blob()))
    candidates = sorted({n for n in errno_funcs if not _WRAPPERS.match(n)})
    counts = dict(zip(candidates, available.count_many(candidates), strict=True))
    candidates = [n for n in candidates if counts[n] == 1]
    denied = _denied(entries, deny, hot=False)
    entry = tuple(n for n in entries if n not in denied and available.count(n) == 1)
    denied = _denied(candidates, deny, hot=True)
    from zlib import crc32
    kept = sorted((n for n in candidates if n not in denied), key=lambda n: origin_rank(n, crc32))
    return Preset(entry=entry, allow=tuple(sorted(kept[:budget])), candidates=len(kept))

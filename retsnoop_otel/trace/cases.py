"""retsnoop's `-c/--case` presets: the entry, allow and deny globs of a subsystem, added to the user's own.

The sets retsnoop v0.11 gives `-c bpf` and `-c perf`, so a command line copied from its README or from a
colleague's shell history means the same functions here, with one correction: retsnoop's perf entry glob
`*_sys__perf_event_open` names no function (the syscall's are `__x64_sys_perf_event_open`,
`__do_sys_perf_event_open`, ...), and an entry glob that matches nothing stops a run; here it is
`*_sys_perf_event_open`.
"""

from types import MappingProxyType
from typing import NamedTuple


class Case(NamedTuple):
    entry: tuple[str, ...]
    allow: tuple[str, ...]
    deny: tuple[str, ...]


CASES = MappingProxyType({
    "bpf": Case(
        entry=("*_sys_bpf",),
        allow=("*bpf*", "*btf*", "do_check*", "reg_*", "check_*", "resolve_*", "convert_*", "adjust_*",
               "sanitize_*", "map_*", "ringbuf_*", "array_*", "__vmalloc_*", "__alloc*", "pcpu_*", "memdup_*",
               "stack_map_*", "htab_*", "generic_map_*", "*copy_from*", "*copy_to*"),
        # noisy (LSM hooks, scheduler balancing, VMA lookups), never failing, or not attachable
        deny=("bpf_get_smp_processor_id", "bpf_get_current_pid_tgid", "*migrate*", "rcu_read_lock*",
              "rcu_read_unlock*", "bpf_lsm_*", "check_cfs_rq_runtime", "find_busiest_group", "find_vma*",
              "btf_sec_info_cmp", "copy_to_user_nofault")),
    "perf": Case(entry=("*_sys_perf_event_open", "perf_ioctl"), allow=("*perf_*",), deny=()),
})


def with_cases(names: list[str], entry: list[str], allow: list[str], deny: list[str]
               ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The user's globs with those of the named cases added (names already checked against CASES)."""
    cases = [CASES[n] for n in dict.fromkeys(names)]
    return (tuple(g for c in cases for g in c.entry) + tuple(entry),
            tuple(g for c in cases for g in c.allow) + tuple(allow),
            tuple(g for c in cases for g in c.deny) + tuple(deny))

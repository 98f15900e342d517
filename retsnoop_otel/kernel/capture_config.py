"""What the kernel side records and how it attaches (CaptureConfig), and how that is written into the BPF object:
before load its read-only settings, the sizes of its maps and which of its programs load (configure), after load
the maps' first contents: the traced functions, argument specs and pid and comm filters (fill_maps).
"""

import errno
import os
import struct
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from retsnoop_otel.capture import records
from retsnoop_otel.capture.inject import ProbeInfo
from retsnoop_otel.capture.model import RET_KIND_CODES, TracedFunc
from retsnoop_otel.kernel import app_hooks, attach_modes, clones, inject_attach, multi_link, syscall_hooks, uprobes
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf

MODE_PROGRAMS = attach_modes.PROGRAMS
MAX_HELD_SESSIONS = 1024  # sessions whose per-call records the kernel holds at once (the rest stream)


class CaptureConfig(NamedTuple):
    """What the kernel side records and how it attaches; applied to the BPF object before load."""

    mode: str  # how the kernel functions attach ("" when there are none)
    emit_calls: bool = False
    capture_success: bool = False  # successful sessions are reported, as sampled by the three below
    success_threshold: int = 0  # probability sampling: kept when the 56-bit randomness >= this (0: all)
    success_interval_ns: int = 0  # rate sampling: ns between kept successes per entry function (0: off)
    success_burst_ns: int = 0  # rate sampling: burst tolerance, (burst - 1) x interval
    error_threshold: int = 0  # error sessions by probability: kept when the randomness >= this (0: all kept)
    error_interval_ns: int = 0  # error sessions by rate: ns between kept ones per error origin (0: off)
    error_burst_ns: int = 0
    min_duration_ns: int = 0
    pids: Sequence[int] = ()
    no_pids: Sequence[int] = ()
    comms: Sequence[str] = ()
    no_comms: Sequence[str] = ()
    cgroup_id: int = 0  # --cgroup: only tasks in this cgroup v2 or below it
    cgroup_level: int = 0  # depth of that cgroup below the root cgroup
    ringbuf_size: int = 8 << 20
    max_sessions: int = 4096
    max_depth: int = 64  # traced-call nesting recorded per session (1..64)
    capture_args: bool = False  # -A; needs emit_calls (arguments travel with the per-call records)
    exclude_self: bool = True  # our own bpf() calls (map reads at scrape time) are not the user's
    user_mode: str = "uprobe_session"  # how the functions with a binary (u:BINARY:GLOB) attach (kernel/uprobes.py)
    lbr_branch_types: int = 0  # --lbr: perf branch_sample_type of the LBR events; 0 = no LBR capture
    lbr_perf_events: bool = True  # open the per-CPU LBR perf events (tests on CPUs without LBR: False)
    arg_specs: Mapping[int, Sequence[int]] = MappingProxyType({})  # -A: function id -> arg_spec words
    app_context: bool = False  # read the application's OTel thread context when a session starts
    user_stacks: bool = False  # take the user stack when a session starts
    # the kernel stack at the error: off where no session is reported (mode metrics), as it is the
    # most expensive step of a failing call (with fentry it grows with the attached functions)
    kernel_stack: bool = True
    max_app_processes: int = 16384  # processes whose thread-context location the kernel side keeps
    func_counts: bool = True  # count calls, errors and latency per function and session (read by metrics only)
    workload_stats: bool = False  # also count calls, errors and sessions per cgroup v2 (metrics workload label)
    max_workload_counts: int = 16384  # (cgroup, function, outcome) counts the kernel side keeps
    max_origin_counts: int = 4096  # (entry, error origin, error) counts the kernel side keeps
    inject: Sequence[ProbeInfo] = ()  # -J injected probes (kernel/inject_attach.py); need emit_calls
    # entry function name -> syscall numbers: these entries' sessions start and end at the syscall tracepoints
    # instead of the mode's probes (the syscall preset's; kernel/syscall_hooks.py)
    syscall_entries: Mapping[str, Sequence[int]] = MappingProxyType({})
    # (name, address) of the thread-context publish hooks' functions, which may join the mode's entry link
    # (kernel/app_hooks.py folded); () where they go by a link of their own
    publish_targets: Sequence[tuple[str, int]] = ()


def mode_funcs(funcs: Sequence[TracedFunc], hooks: Mapping[int, Sequence[int]]) -> list[TracedFunc]:
    """The functions the attach mode links: the kernel functions, but those the syscall tracepoints hook (the user
    functions attach apart)."""
    return [f for f in funcs if f.binary is None and f.id not in hooks]


def configure(obj: lb.BpfObject, cfg: CaptureConfig, funcs: Sequence[TracedFunc], fentry: clones.FentryPrograms,
              by_address: bool, ncpus: int, hooks: Mapping[int, Sequence[int]], app_kprobes: bool = False,
              publish: Sequence[TracedFunc] = ()) -> None:
    """Before load: the object's read-only settings, its maps' sizes, and which programs load (and how).

    `hooks`: function id -> syscall numbers of the entries the syscall tracepoints hook (syscall_hooks.hooked);
    `app_kprobes`: the thread-context publish hooks go by kprobe.multi (app_hooks.by_kprobe); `publish`: they are
    members of the mode's entry link instead (app_hooks.folded)."""
    kfuncs = mode_funcs(funcs, hooks)
    rodata = obj.map(".rodata")
    data = bytearray(rodata.initial_value())
    layout = Btf.of_object(obj).datasec_vars(".rodata")
    no_pids = _denied_pids(cfg)
    allow_pids = [p for p in cfg.pids if p not in set(no_pids)]
    allow_comms = [c for c in cfg.comms if c not in set(cfg.no_comms)]
    values = {
        "emit_calls": struct.pack("<?", cfg.emit_calls),
        "capture_success": struct.pack("<?", cfg.capture_success),
        "min_duration_ns": struct.pack("<Q", cfg.min_duration_ns),
        "tgid_allow_cnt": struct.pack("<I", len(allow_pids)),
        "comm_allow_cnt": struct.pack("<I", len(allow_comms)),
        "has_tgid_filter": struct.pack("<?", bool(cfg.pids or cfg.no_pids)),
        "self_tgid": struct.pack("<I", os.getpid() if cfg.exclude_self else 0),
        "has_comm_filter": struct.pack("<?", bool(cfg.comms or cfg.no_comms)),
        "cgroup_id_filter": struct.pack("<Q", cfg.cgroup_id),
        "cgroup_level": struct.pack("<I", cfg.cgroup_level),
        "capture_args": struct.pack("<?", cfg.capture_args and cfg.emit_calls),
        "max_depth": struct.pack("<I", min(max(cfg.max_depth, 1), records.MAX_FSTACK_DEPTH)),
        "use_lbr": struct.pack("<?", bool(cfg.lbr_branch_types)),
        "read_app": struct.pack("<?", cfg.app_context),
        "user_stacks": struct.pack("<?", cfg.user_stacks),
        "kernel_stack": struct.pack("<?", cfg.kernel_stack),
        "func_counts": struct.pack("<?", cfg.func_counts),
        "workload_stats": struct.pack("<?", cfg.workload_stats),
        "rb_bytes": struct.pack("<Q", _ringbuf_size(cfg.ringbuf_size)),
        "success_threshold": struct.pack("<Q", cfg.success_threshold),
        "success_interval_ns": struct.pack("<Q", cfg.success_interval_ns),
        "success_burst_ns": struct.pack("<Q", cfg.success_burst_ns),
        "error_threshold": struct.pack("<Q", cfg.error_threshold),
        "error_interval_ns": struct.pack("<Q", cfg.error_interval_ns),
        "error_burst_ns": struct.pack("<Q", cfg.error_burst_ns),
    }
    mode = attach_modes.BY_NAME.get(cfg.mode) if kfuncs else None  # None: no kernel functions
    if mode and mode.joins_entries:
        values |= multi_link.one_link_rodata(kfuncs, publish)
    if missing := [name for name in values if name not in layout]:
        raise lb.LibbpfError(f"{obj.path} was built from older sources (no {', '.join(missing)}): "
                             "rebuild it with `make bpf`", errno.ENOEXEC)
    for name, raw in values.items():
        off, size = layout[name]
        data[off:off + size] = raw
    rodata.set_initial_value(bytes(data))
    n = len(funcs)
    obj.map("func_infos").set_max_entries(n)
    obj.map("func_stats").set_max_entries(n if cfg.func_counts else 1)
    obj.map("entry_stats").set_max_entries(n if cfg.func_counts else 1)
    if not cfg.func_counts:
        obj.map("err_stats").set_max_entries(1)
    obj.map("arg_specs").set_max_entries(n)
    obj.map("rb").set_max_entries(_ringbuf_size(cfg.ringbuf_size))
    sessions = (kmode := attach_modes.BY_NAME.get(cfg.mode)) is None or kmode.sessions
    obj.map("sessions").set_max_entries(cfg.max_sessions if sessions else 1)
    obj.map("pending").set_max_entries(1 if sessions else cfg.max_sessions)  # bpf/origins.bpf.h: a chain per thread
    # without --lbr the LBR maps keep one entry each: no memory for a feature that is off
    obj.map("lbr_snaps").set_max_entries(ncpus if cfg.lbr_branch_types else 1)
    obj.map("session_lbrs").set_max_entries(cfg.max_sessions if cfg.lbr_branch_types else 1)
    watch = cfg.app_context or cfg.user_stacks
    obj.map("app_targets").set_max_entries(cfg.max_app_processes if watch else 1)
    obj.map("app_asked").set_max_entries(cfg.max_app_processes if watch else 1)
    obj.map("origin_stats").set_max_entries(max(cfg.max_origin_counts, 1))
    obj.map("wl_stats").set_max_entries(cfg.max_workload_counts if cfg.workload_stats else 1)
    obj.map("ip_ids").set_max_entries(n + len(publish) if by_address else 1)
    held = cfg.emit_calls and not cfg.capture_args  # -A records are too large to hold: they stream
    obj.map("call_bufs").set_max_entries(min(cfg.max_sessions, MAX_HELD_SESSIONS) if held else 1)
    obj.map("rate_tat").set_max_entries(n if cfg.success_interval_ns else 1)
    obj.map("rate_busy").set_max_entries(n if cfg.success_interval_ns else 1)
    obj.map("err_rate_tat").set_max_entries(n if cfg.error_interval_ns else 1)  # keyed by the origin's function id
    obj.map("err_rate_busy").set_max_entries(n if cfg.error_interval_ns else 1)
    progs = mode.autoload(kfuncs) if mode else ()
    user = uprobes.PROGRAMS[cfg.user_mode] if any(f.binary is not None for f in funcs) else ()
    for names in {*MODE_PROGRAMS.values(), *uprobes.PROGRAMS.values()}:
        for name in names:
            obj.program(name).set_autoload(name in progs or name in user)
    if mode:
        mode.prepare(obj, progs, fentry)
    app_hooks.configure(obj, cfg.app_context, app_kprobes, fold=bool(publish))
    syscall_hooks.configure(obj, hooks, syscall_hooks.for_mode(attach_modes.BY_NAME.get(cfg.mode)))
    inject_attach.configure(obj, cfg.inject)


def fill_maps(obj: lb.BpfObject, cfg: CaptureConfig, funcs: Sequence[TracedFunc], by_address: bool,
              arg_specs: Mapping[int, Sequence[int]], hooks: Mapping[int, Sequence[int]],
              publish: Sequence[TracedFunc] = ()) -> None:
    """After load: the traced functions (and the publish hooks folded into the entry link: their ids by address),
    their argument specs (-A), the hooked syscalls and the pid and comm filters."""
    inject_attach.fill(obj, cfg.inject)
    syscall_hooks.fill(obj, hooks)
    infos = obj.map("func_infos")
    for f in funcs:
        kind = RET_KIND_CODES[f.ret] << records.FUNC_RET_KIND_SHIFT
        flags = (records.FUNC_IS_ENTRY if f.is_entry else 0) | (records.FUNC_IS_USER if f.binary else 0) | kind
        infos.update(struct.pack("<I", f.id), records.FUNC_INFO.pack(f.addr, flags, 0))
    if by_address:
        multi_link.fill_ip_ids(obj.map("ip_ids"), [*(f for f in funcs if f.binary is None), *publish])
    specs = obj.map("arg_specs")
    for fid, words in arg_specs.items():
        specs.update(struct.pack("<I", fid), records.ARG_SPEC.pack(*words))
    pids = obj.map("tgid_filter")
    for pid in cfg.pids:
        pids.update(struct.pack("<I", pid), bytes([1]))
    for pid in cfg.no_pids:
        pids.update(struct.pack("<I", pid), bytes([2]))  # deny entries written last: they win
    comms = obj.map("comm_filter")
    for comm in cfg.comms:
        comms.update(_comm_key(comm), bytes([1]))
    for comm in cfg.no_comms:
        comms.update(_comm_key(comm), bytes([2]))


def _denied_pids(cfg: CaptureConfig) -> list[int]:
    """--no-pid's processes, and this one unless it traces itself."""
    return [*cfg.no_pids, *([os.getpid()] if cfg.exclude_self else [])]


def _comm_key(comm: str) -> bytes:
    return comm.encode()[:15].ljust(16, b"\0")


def _ringbuf_size(size: int) -> int:
    """Ring buffers must be a power-of-two number of pages."""
    page = 4096
    n = max(page, size)
    return 1 << (n - 1).bit_length()

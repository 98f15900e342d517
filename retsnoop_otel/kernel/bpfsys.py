"""Raw bpf(2) and perf_event_open(2) system calls through ctypes, without libbpf in between.

The failure workload and the feature probes need to hand the kernel exactly the attributes they
choose (invalid ones included, NULL pointers included) and to see the kernel's own errno; libbpf
would validate, retry or rewrite some of them first. The tracer's LBR perf events are opened here
too: libbpf has no call that opens a plain perf event. A failed system call raises OSError(errno).
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence

# enum bpf_cmd (uapi linux/bpf.h).
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28

# enum bpf_map_type.
MAP_ARRAY = 2
MAP_PERCPU_ARRAY = 6
MAP_STACK_TRACE = 7
MAP_RINGBUF = 27

# enum bpf_prog_type / bpf_attach_type.
PROG_KPROBE = 2
PROG_TRACING = 26
ATTACH_TRACE_FENTRY = 24
ATTACH_TRACE_FEXIT = 25
ATTACH_TRACE_KPROBE_MULTI = 42
ATTACH_TRACE_KPROBE_SESSION = 56  # Linux 6.10+
ATTACH_TRACE_FSESSION = 58  # Linux 7.0+
ATTACH_TRACE_FEXIT_MULTI = 60  # Linux 7.2+, through a tracing_multi link
ATTACH_TRACE_FSESSION_MULTI = 61  # Linux 7.2+, through a tracing_multi link
BPF_F_KPROBE_MULTI_RETURN = 1

# perf_event_open(2).
PERF_TYPE_HARDWARE = 0
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_SAMPLE_BRANCH_STACK = 1 << 11
PERF_SAMPLE_BRANCH_KERNEL = 1 << 1
PERF_SAMPLE_BRANCH_ANY_RETURN = 1 << 5
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)

_SYSCALLS = {  # machine -> (bpf, perf_event_open)
    "x86_64": (321, 298),
    "aarch64": (280, 241),
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _numbers(machine: str | None = None) -> tuple[int, int]:
    machine = machine or os.uname().machine
    try:
        return _SYSCALLS[machine]
    except KeyError:
        raise OSError(38, f"raw bpf(2) numbers are not known for machine '{machine}'") from None  # ENOSYS


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def sys_bpf(cmd: int, attr: ctypes.Structure, what: str) -> int:
    """bpf(cmd, &attr, sizeof(attr)); the unused tail of each attr struct stays zero, as the kernel demands."""
    bpf_nr = _numbers()[0]
    rc = _libc.syscall(ctypes.c_long(bpf_nr), ctypes.c_int(cmd), ctypes.byref(attr),
                       ctypes.c_uint(ctypes.sizeof(attr)))
    return _check(rc, what)


# ---- union bpf_attr members (only the commands used here) ---------------------------------------


class MapCreateAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("inner_map_fd", ctypes.c_uint32), ("numa_node", ctypes.c_uint32),
                ("map_name", ctypes.c_char * 16), ("map_ifindex", ctypes.c_uint32),
                ("btf_fd", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("btf_vmlinux_value_type_id", ctypes.c_uint32),
                ("map_extra", ctypes.c_uint64)]


class MapElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("_pad", ctypes.c_uint32), ("key", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class ProgLoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32), ("expected_attach_type", ctypes.c_uint32),
                ("prog_btf_fd", ctypes.c_uint32), ("func_info_rec_size", ctypes.c_uint32),
                ("func_info", ctypes.c_uint64), ("func_info_cnt", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32), ("line_info", ctypes.c_uint64),
                ("line_info_cnt", ctypes.c_uint32), ("attach_btf_id", ctypes.c_uint32),
                ("attach_prog_fd", ctypes.c_uint32)]


class LinkCreateAttr(ctypes.Structure):
    """link_create with the kprobe_multi layout of the trailing union; a tracing link's cookie (after its u32
    target_btf_id) lies where kprobe_multi has `syms`."""

    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("kmulti_flags", ctypes.c_uint32), ("kmulti_cnt", ctypes.c_uint32),
                ("kmulti_syms", ctypes.c_uint64), ("kmulti_addrs", ctypes.c_uint64),
                ("kmulti_cookies", ctypes.c_uint64)]


class TracingMultiLinkAttr(ctypes.Structure):
    """link_create with the tracing_multi layout of the trailing union (Linux 7.2+), as long as LinkCreateAttr."""

    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("ids", ctypes.c_uint64), ("cookies", ctypes.c_uint64),
                ("cnt", ctypes.c_uint32), ("_pad", ctypes.c_uint32 * 3)]


class BpfLoadError(OSError):
    """BPF_PROG_LOAD failed; `log` holds the verifier's explanation (may be empty)."""

    def __init__(self, err: int, what: str, log: str) -> None:
        super().__init__(err, f"{what}: {os.strerror(err)}")
        self.log = log


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, map_flags: int = 0,
               name: bytes = b"") -> int:
    """BPF_MAP_CREATE; returns the map fd. Values are truncated to u32 the way C callers pass -1."""
    attr = MapCreateAttr(map_type & 0xFFFFFFFF, key_size, value_size, max_entries, map_flags & 0xFFFFFFFF)
    attr.map_name = name[:15]
    return sys_bpf(BPF_MAP_CREATE, attr, "bpf(BPF_MAP_CREATE)")


def map_lookup_elem(fd: int, key_ptr: int | None, value_ptr: int | None) -> None:
    """BPF_MAP_LOOKUP_ELEM with raw user pointers (None = NULL: the kernel answers EFAULT)."""
    attr = MapElemAttr(map_fd=fd, key=key_ptr or 0, value=value_ptr or 0)
    sys_bpf(BPF_MAP_LOOKUP_ELEM, attr, "bpf(BPF_MAP_LOOKUP_ELEM)")


def map_update_elem(fd: int, key_ptr: int, value_ptr: int, flags: int = 0) -> None:
    attr = MapElemAttr(map_fd=fd, key=key_ptr, value=value_ptr, flags=flags)
    sys_bpf(BPF_MAP_UPDATE_ELEM, attr, "bpf(BPF_MAP_UPDATE_ELEM)")


def prog_load(prog_type: int, insns: bytes, license: bytes = b"GPL", expected_attach_type: int = 0,
              attach_btf_id: int = 0, log: bool = False, name: bytes = b"") -> int:
    """BPF_PROG_LOAD of raw instructions; with log=True a failure carries the verifier log."""
    if len(insns) % 8:
        raise ValueError("BPF instructions are 8 bytes each")
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license)
    logbuf = ctypes.create_string_buffer(64 * 1024) if log else None
    attr = ProgLoadAttr(prog_type=prog_type, insn_cnt=len(insns) // 8, insns=ctypes.addressof(code),
                        license=ctypes.addressof(lic), expected_attach_type=expected_attach_type,
                        attach_btf_id=attach_btf_id)
    attr.prog_name = name[:15]
    if logbuf is not None:
        attr.log_level, attr.log_size, attr.log_buf = 1, len(logbuf), ctypes.addressof(logbuf)
    try:
        return sys_bpf(BPF_PROG_LOAD, attr, "bpf(BPF_PROG_LOAD)")
    except OSError as exc:
        text = logbuf.value.decode(errors="replace") if logbuf is not None else ""
        raise BpfLoadError(exc.errno, "bpf(BPF_PROG_LOAD)", text) from None


def link_create(prog_fd: int, attach_type: int, target_fd: int = 0, cookie: int = 0) -> int:
    """BPF_LINK_CREATE for fentry/fexit (target given at load time, `cookie`: Linux 5.19+); returns the link fd."""
    attr = LinkCreateAttr(prog_fd=prog_fd, target_fd=target_fd, attach_type=attach_type, kmulti_syms=cookie)
    return sys_bpf(BPF_LINK_CREATE, attr, "bpf(BPF_LINK_CREATE)")


def link_create_kprobe_multi(prog_fd: int, syms: Sequence[str] = (), addrs: Sequence[int] = (),
                             cookies: Sequence[int] = (), attach_type: int = ATTACH_TRACE_KPROBE_MULTI,
                             retprobe: bool = False) -> int:
    """BPF_LINK_CREATE of a kprobe.multi (or kprobe.session) link on functions named by `syms` or at
    `addrs`, each with its cookie; returns the link fd. libbpf 1.1 knows no kprobe.session links."""
    arrays: list[ctypes.Array] = []  # must outlive the call

    def arr(values: Sequence[int]) -> int:
        if not values:
            return 0
        a = (ctypes.c_uint64 * len(values))(*values)
        arrays.append(a)
        return ctypes.addressof(a)

    names = [ctypes.create_string_buffer(s.encode()) for s in syms]
    attr = LinkCreateAttr(prog_fd=prog_fd, attach_type=attach_type, kmulti_cnt=len(names) or len(addrs),
                          kmulti_flags=BPF_F_KPROBE_MULTI_RETURN if retprobe else 0,
                          kmulti_syms=arr([ctypes.addressof(n) for n in names]), kmulti_addrs=arr(addrs),
                          kmulti_cookies=arr(cookies))
    kind = "kprobe.session" if attach_type == ATTACH_TRACE_KPROBE_SESSION else "kprobe_multi"
    return sys_bpf(BPF_LINK_CREATE, attr, f"bpf(BPF_LINK_CREATE {kind})")


def link_create_tracing_multi(prog_fd: int, btf_ids: Sequence[int], cookies: Sequence[int] = (),
                              attach_type: int = ATTACH_TRACE_FSESSION_MULTI) -> int:
    """BPF_LINK_CREATE of one tracing_multi link: the functions by their BTF ids (u32, in the BTF the program was
    loaded against), each with its cookie (u64, same order: the kernel sorts both together); returns the link fd."""
    ids = (ctypes.c_uint32 * len(btf_ids))(*btf_ids)
    values = (ctypes.c_uint64 * len(cookies))(*cookies) if cookies else None
    attr = TracingMultiLinkAttr(prog_fd=prog_fd, attach_type=attach_type, ids=ctypes.addressof(ids),
                                cookies=ctypes.addressof(values) if values is not None else 0, cnt=len(btf_ids))
    return sys_bpf(BPF_LINK_CREATE, attr, "bpf(BPF_LINK_CREATE tracing_multi)")


# ---- perf_event_open --------------------------------------------------------------------------


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER5 (112 bytes); `flags` holds the bit-fields."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
                ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
                ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
                ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
                ("sample_max_stack", ctypes.c_uint16), ("_reserved", ctypes.c_uint16)]


def perf_event_open(attr: PerfEventAttr, pid: int = -1, cpu: int = 0, group_fd: int = -1,
                    flags: int = PERF_FLAG_FD_CLOEXEC) -> int:
    attr.size = ctypes.sizeof(PerfEventAttr)
    nr = _numbers()[1]
    rc = _libc.syscall(ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_int(pid), ctypes.c_int(cpu),
                       ctypes.c_int(group_fd), ctypes.c_ulong(flags))
    return _check(rc, "perf_event_open")


def kprobe_pmu_type(root: str = "/") -> int:
    """Dynamic PMU type of kprobes; FileNotFoundError when the kernel has no kprobe PMU."""
    with open(os.path.join(root, "sys/bus/event_source/devices/kprobe/type")) as f:
        return int(f.read().strip())


def perf_kprobe_open(func: str, pmu_type: int, retprobe: bool = False) -> int:
    """Create a kprobe on `func` through the kprobe PMU (registers it in the kernel); returns the event fd."""
    name = ctypes.create_string_buffer(func.encode())
    attr = PerfEventAttr(type=pmu_type, config=1 if retprobe else 0, sample_period=1, wakeup_events=1,
                         config1=ctypes.addressof(name), config2=0)
    return perf_event_open(attr, pid=-1, cpu=0)


def perf_lbr_open(cpu: int = 0, branch_types: int = PERF_SAMPLE_BRANCH_KERNEL | PERF_SAMPLE_BRANCH_ANY_RETURN) -> int:
    """A CPU-cycles event that records kernel branch stacks (LBR) of the given perf branch types.

    While one is open on a CPU, the kernel keeps that CPU's LBR running, which is what lets
    bpf_get_branch_snapshot() read it from a BPF program.
    """
    attr = PerfEventAttr(type=PERF_TYPE_HARDWARE, config=PERF_COUNT_HW_CPU_CYCLES,
                         sample_type=PERF_SAMPLE_BRANCH_STACK, branch_sample_type=branch_types)
    return perf_event_open(attr, pid=-1, cpu=cpu)


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,5' (the format of /sys/devices/system/cpu/online) -> [0, 1, 2, 3, 5]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def online_cpus(root: str = "/") -> list[int]:
    with open(os.path.join(root, "sys/devices/system/cpu/online")) as f:
        return parse_cpu_list(f.read())


def perf_set_bpf(event_fd: int, prog_fd: int) -> None:
    """Attach a loaded kprobe program to a perf kprobe event (PERF_EVENT_IOC_SET_BPF)."""
    import fcntl
    fcntl.ioctl(event_fd, PERF_EVENT_IOC_SET_BPF, prog_fd)


# ---- instruction encoding ---------------------------------------------------------------------

_INSN = struct.Struct("<BBhi")
R0, R1, R2, R10 = 0, 1, 2, 10
BPF_PSEUDO_MAP_FD = 1
HELPER_MAP_LOOKUP_ELEM = 1


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One struct bpf_insn (little-endian: dst in the low nibble of the register byte)."""
    return _INSN.pack(code, (src << 4) | dst, off, imm)


def mov64_imm(dst: int, imm: int) -> bytes:
    return insn(0xB7, dst, imm=imm)  # BPF_ALU64 | BPF_MOV | BPF_K


def mov64_reg(dst: int, src: int) -> bytes:
    return insn(0xBF, dst, src)  # BPF_ALU64 | BPF_MOV | BPF_X


def add64_imm(dst: int, imm: int) -> bytes:
    return insn(0x07, dst, imm=imm)  # BPF_ALU64 | BPF_ADD | BPF_K


def st_mem_w(dst: int, off: int, imm: int) -> bytes:
    return insn(0x62, dst, off=off, imm=imm)  # BPF_ST | BPF_MEM | BPF_W


def ld_map_fd(dst: int, map_fd: int) -> bytes:
    """Two-slot ld_imm64 the verifier rewrites into the map's address."""
    return insn(0x18, dst, BPF_PSEUDO_MAP_FD, imm=map_fd) + insn(0)


def call(helper: int) -> bytes:
    return insn(0x85, imm=helper)  # BPF_JMP | BPF_CALL


def jeq_imm(dst: int, imm: int, off: int) -> bytes:
    return insn(0x15, dst, off=off, imm=imm)  # BPF_JMP | BPF_JEQ | BPF_K


def atomic_add64(dst: int, src: int, off: int = 0) -> bytes:
    return insn(0xDB, dst, src, off=off, imm=0)  # BPF_STX | BPF_ATOMIC | BPF_DW, BPF_ADD


def exit_insn() -> bytes:
    return insn(0x95)  # BPF_JMP | BPF_EXIT


RETURN_ZERO = mov64_imm(R0, 0) + exit_insn()


def counter_prog(map_fd: int) -> bytes:
    """`value[0] += 1` on an ARRAY map with u32 key and u64 value, then return 0."""
    return b"".join([
        st_mem_w(R10, -4, 0),          # *(u32 *)(fp - 4) = 0  (key)
        mov64_reg(R2, R10),
        add64_imm(R2, -4),             # r2 = &key
        ld_map_fd(R1, map_fd),         # r1 = map
        call(HELPER_MAP_LOOKUP_ELEM),  # r0 = bpf_map_lookup_elem(map, &key)
        jeq_imm(R0, 0, 2),             # if (!r0) goto out
        mov64_imm(R1, 1),
        atomic_add64(R0, R1),          # lock *(u64 *)r0 += 1
        RETURN_ZERO,                   # out: return 0
    ])

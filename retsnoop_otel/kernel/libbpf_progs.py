"""Program fds outside the BPF object: fentry/fexit clones, their links, and run statistics.

These are libbpf's low-level calls (bpf/bpf.h) on bare fds, where libbpf.py wraps its object API.
"""

from __future__ import annotations

import ctypes

from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_abi as abi

# enum bpf_attach_type values (uapi linux/bpf.h).
ATTACH_TRACE_FENTRY = 24
ATTACH_TRACE_FEXIT = 25


class ProgInfo(ctypes.Structure):
    """struct bpf_prog_info (uapi linux/bpf.h, 5.12 layout) up to recursion_misses.

    Pointer fields stay 0 with their counts 0, so the kernel copies no arrays; a newer kernel's
    longer struct is cut to this size, an older one leaves the fields it lacks at zero.
    """

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
                ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
                ("load_time", ctypes.c_uint64), ("created_by_uid", ctypes.c_uint32),
                ("nr_map_ids", ctypes.c_uint32), ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16),
                ("ifindex", ctypes.c_uint32), ("gpl_compatible", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64),
                ("netns_ino", ctypes.c_uint64), ("nr_jited_ksyms", ctypes.c_uint32),
                ("nr_jited_func_lens", ctypes.c_uint32), ("jited_ksyms", ctypes.c_uint64),
                ("jited_func_lens", ctypes.c_uint64), ("btf_id", ctypes.c_uint32),
                ("func_info_rec_size", ctypes.c_uint32), ("func_info", ctypes.c_uint64),
                ("nr_func_info", ctypes.c_uint32), ("nr_line_info", ctypes.c_uint32), ("line_info", ctypes.c_uint64),
                ("jited_line_info", ctypes.c_uint64), ("nr_jited_line_info", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32), ("jited_line_info_rec_size", ctypes.c_uint32),
                ("nr_prog_tags", ctypes.c_uint32), ("prog_tags", ctypes.c_uint64), ("run_time_ns", ctypes.c_uint64),
                ("run_cnt", ctypes.c_uint64), ("recursion_misses", ctypes.c_uint64)]



def clone_program(prog: lb.BpfProgram, *, attach_btf_id: int, attach_type: int, name: str) -> int:
    """Load a copy of a loaded tracing program retargeted at another function; returns its fd.

    fentry/fexit programs are bound to one function at load time, so mass-attaching needs one
    program per function. Cloning the relocated instructions avoids re-opening the object.
    """
    insns, cnt = prog.insns()
    opts = abi.ProgLoadOpts()
    opts.sz = ctypes.sizeof(abi.ProgLoadOpts)
    opts.expected_attach_type = attach_type
    opts.attach_btf_id = attach_btf_id
    fd = lb.lib().lib.bpf_prog_load(prog.prog_type, name.encode()[:15], b"GPL", insns, cnt, ctypes.byref(opts))
    if fd < 0:
        raise lb.fail(f"load {name} for BTF id {attach_btf_id}", ctypes.get_errno())
    return fd


def link_create(prog_fd: int, attach_type: int, cookie: int = 0, what: str = "link") -> lb.Link:
    """Attach a loaded tracing program fd (fentry/fexit) with a BPF cookie; returns an fd-owning Link."""
    opts = abi.LinkCreateOpts()
    opts.sz = ctypes.sizeof(abi.LinkCreateOpts)
    opts.u.tracing.cookie = cookie
    fd = lb.lib().lib.bpf_link_create(prog_fd, 0, attach_type, ctypes.byref(opts))
    if fd < 0:
        raise lb.fail(f"attach {what}", ctypes.get_errno())
    return lb.Link(fd=fd)


def prog_info(prog_fd: int) -> ProgInfo:
    """BPF_OBJ_GET_INFO_BY_FD on a program: its run_cnt and run_time_ns are the bpf_stats counters."""
    info = ProgInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    rc = lb.lib().lib.bpf_obj_get_info_by_fd(prog_fd, ctypes.byref(info), ctypes.byref(size))
    if rc < 0:  # libbpf logs nothing here: older messages in its log would only mislead
        raise lb.LibbpfError(f"get info of BPF program fd {prog_fd}", -rc)
    return info

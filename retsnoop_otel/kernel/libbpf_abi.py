"""The C declarations of libbpf that retsnoop-otel relies on: option structs, callbacks and the
signature of every function it calls.

One table, resolved all at once when the library loads (kernel/libbpf.py): a libbpf that lacks
one of these functions refuses to start with one message instead of failing in the middle of a run.
Layouts are those of libbpf 1.1; the `sz` field of each opts struct lets newer libbpfs accept them.
"""

from __future__ import annotations

import ctypes
import os

PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
# print_filter.c, built with the package: libbpf's debug messages dropped in C, before the Python hook (4,699 in
# one load of our object, each a call into Python that needs the GIL: 0.1-0.3 s of an agent's load under
# emulation, where a thread imports beside it)
PRINT_FILTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libprint_filter.so")


def without_debug(hook: ctypes._CFuncPtr, most_verbose: int, library: str | None = None) -> ctypes._CFuncPtr:
    """What to hand libbpf_set_print(): `hook` for messages of level `most_verbose` (enum libbpf_print_level) and
    more severe; `hook` itself where the library is missing (a checkout without `make bpf`): every message then
    reaches it, only slower."""
    try:
        lib = ctypes.CDLL(library or PRINT_FILTER)
    except OSError:
        return hook
    lib.pf_install.restype = ctypes.c_void_p
    lib.pf_install.argtypes = [PRINT_FN, ctypes.c_int]
    return PRINT_FN(lib.pf_install(hook, most_verbose))


class KprobeOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("bpf_cookie", ctypes.c_uint64), ("offset", ctypes.c_size_t),
                ("retprobe", ctypes.c_bool)]


class CookieOpts(ctypes.Structure):
    """struct bpf_tracepoint_opts and struct bpf_raw_tracepoint_opts (libbpf 1.5+): the same layout."""

    _fields_ = [("sz", ctypes.c_size_t), ("cookie", ctypes.c_uint64)]


class KprobeMultiOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("syms", ctypes.POINTER(ctypes.c_char_p)),
                ("addrs", ctypes.POINTER(ctypes.c_ulong)), ("cookies", ctypes.POINTER(ctypes.c_uint64)),
                ("cnt", ctypes.c_size_t), ("retprobe", ctypes.c_bool)]


class UprobeOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ref_ctr_offset", ctypes.c_size_t), ("bpf_cookie", ctypes.c_uint64),
                ("retprobe", ctypes.c_bool), ("func_name", ctypes.c_char_p)]


class UprobeMultiOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("syms", ctypes.POINTER(ctypes.c_char_p)),
                ("offsets", ctypes.POINTER(ctypes.c_ulong)), ("ref_ctr_offsets", ctypes.POINTER(ctypes.c_ulong)),
                ("cookies", ctypes.POINTER(ctypes.c_uint64)), ("cnt", ctypes.c_size_t), ("retprobe", ctypes.c_bool),
                ("session", ctypes.c_bool)]


SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class ProgLoadOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("attempts", ctypes.c_int), ("expected_attach_type", ctypes.c_int),
                ("prog_btf_fd", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_ifindex", ctypes.c_uint32), ("kern_version", ctypes.c_uint32),
                ("attach_btf_id", ctypes.c_uint32), ("attach_prog_fd", ctypes.c_uint32),
                ("attach_btf_obj_fd", ctypes.c_uint32), ("fd_array", ctypes.POINTER(ctypes.c_int)),
                ("func_info", ctypes.c_void_p), ("func_info_cnt", ctypes.c_uint32),
                ("func_info_rec_size", ctypes.c_uint32), ("line_info", ctypes.c_void_p),
                ("line_info_cnt", ctypes.c_uint32), ("line_info_rec_size", ctypes.c_uint32),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32), ("log_buf", ctypes.c_char_p)]


class TracingLinkOpts(ctypes.Structure):
    _fields_ = [("cookie", ctypes.c_uint64)]


class KprobeMultiLinkOpts(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint32), ("cnt", ctypes.c_uint32), ("syms", ctypes.c_void_p),
                ("addrs", ctypes.c_void_p), ("cookies", ctypes.c_void_p)]


class LinkUnion(ctypes.Union):
    """Two members of libbpf's per-attach-type union (1.1 layout); only `tracing` is set."""

    _fields_ = [("tracing", TracingLinkOpts), ("kprobe_multi", KprobeMultiLinkOpts)]


class LinkCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("iter_info", ctypes.c_void_p),
                ("iter_info_len", ctypes.c_uint32), ("target_btf_id", ctypes.c_uint32), ("u", LinkUnion)]

class BtfTypeRecord(ctypes.Structure):
    """struct btf_type; kind-specific records (members, params, ...) follow it in memory."""

    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size_or_type", ctypes.c_uint32)]


class BtfParam(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32)]


# name -> (restype, argtypes)
SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "libbpf_major_version": (ctypes.c_uint32, []),
    "libbpf_minor_version": (ctypes.c_uint32, []),
    "libbpf_set_print": (ctypes.c_void_p, [PRINT_FN]),
    "bpf_object__open_file": (ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_void_p]),
    "bpf_object__load": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_object__close": (None, [ctypes.c_void_p]),
    "bpf_object__btf": (ctypes.c_void_p, [ctypes.c_void_p]),
    "bpf_object__find_map_by_name": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "bpf_object__find_program_by_name": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "bpf_map__fd": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_map__set_max_entries": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32]),
    "bpf_map__max_entries": (ctypes.c_uint32, [ctypes.c_void_p]),
    "bpf_map__key_size": (ctypes.c_uint32, [ctypes.c_void_p]),
    "bpf_map__value_size": (ctypes.c_uint32, [ctypes.c_void_p]),
    "bpf_map__initial_value": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "bpf_map__set_initial_value": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "bpf_program__fd": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_program__set_autoload": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_bool]),
    "bpf_program__set_expected_attach_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "bpf_program__set_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "bpf_program__set_attach_target": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]),
    "bpf_program__insns": (ctypes.c_void_p, [ctypes.c_void_p]),
    "bpf_program__insn_cnt": (ctypes.c_size_t, [ctypes.c_void_p]),
    "bpf_program__type": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_program__attach_kprobe_opts": (ctypes.c_void_p,
                                        [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(KprobeOpts)]),
    "bpf_program__attach_kprobe_multi_opts": (
        ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(KprobeMultiOpts)]),
    "bpf_program__attach_uprobe_opts": (
        ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                          ctypes.POINTER(UprobeOpts)]),
    "bpf_program__attach_uprobe_multi": (
        ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                          ctypes.POINTER(UprobeMultiOpts)]),
    "bpf_program__attach_raw_tracepoint": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "bpf_program__attach_raw_tracepoint_opts": (ctypes.c_void_p,
                                                [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(CookieOpts)]),
    "bpf_program__attach_tracepoint_opts": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                                              ctypes.POINTER(CookieOpts)]),
    "bpf_link__destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_map_update_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]),
    "bpf_map_delete_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "bpf_map_get_next_key": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "libbpf_num_possible_cpus": (ctypes.c_int, []),
    "libbpf_probe_bpf_map_type": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "libbpf_probe_bpf_helper": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]),
    "bpf_prog_load": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.POINTER(ProgLoadOpts)]),
    "bpf_link_create": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(LinkCreateOpts)]),
    "bpf_obj_get_info_by_fd": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]),
    "btf__load_vmlinux_btf": (ctypes.c_void_p, []),
    "btf__free": (None, [ctypes.c_void_p]),
    "btf__find_by_name_kind": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]),
    "btf__type_by_id": (ctypes.POINTER(BtfTypeRecord), [ctypes.c_void_p, ctypes.c_uint32]),
    "btf__name_by_offset": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_uint32]),
    "ring_buffer__new": (ctypes.c_void_p, [ctypes.c_int, SAMPLE_FN, ctypes.c_void_p, ctypes.c_void_p]),
    "ring_buffer__poll": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "ring_buffer__consume": (ctypes.c_int, [ctypes.c_void_p]),
    "ring_buffer__epoll_fd": (ctypes.c_int, [ctypes.c_void_p]),
    "ring_buffer__free": (None, [ctypes.c_void_p]),
}

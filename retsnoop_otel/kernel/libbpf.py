"""Thin ctypes binding over the system libbpf.so.1 (>= 1.1).

Only what retsnoop-otel needs: objects, maps, programs, attach points, ring buffers and the BTF
queries used to classify return types. Every failure becomes a LibbpfError carrying errno and
the messages libbpf printed while failing, so users see libbpf's own explanation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

MIN_VERSION = (1, 1)

# enum bpf_prog_type / bpf_attach_type / bpf_map_type values (uapi linux/bpf.h).
PROG_TYPE_KPROBE = 2
PROG_TYPE_TRACEPOINT = 5
PROG_TYPE_PERF_EVENT = 7
PROG_TYPE_RAW_TRACEPOINT = 17
PROG_TYPE_TRACING = 26
ATTACH_TRACE_RAW_TP = 23
ATTACH_TRACE_FENTRY = 24
ATTACH_TRACE_FEXIT = 25
ATTACH_TRACE_KPROBE_MULTI = 42
MAP_TYPE_RINGBUF = 27

# BTF kinds (uapi linux/btf.h).
BTF_KIND_INT = 1
BTF_KIND_PTR = 2
BTF_KIND_STRUCT = 4
BTF_KIND_UNION = 5
BTF_KIND_ENUM = 6
BTF_KIND_TYPEDEF = 8
BTF_KIND_VOLATILE = 9
BTF_KIND_CONST = 10
BTF_KIND_RESTRICT = 11
BTF_KIND_FUNC = 12
BTF_KIND_FUNC_PROTO = 13
BTF_KIND_VAR = 14
BTF_KIND_DATASEC = 15
BTF_KIND_TYPE_TAG = 18
BTF_KIND_ENUM64 = 19
BTF_INT_SIGNED = 1
BTF_INT_BOOL = 4


class LibbpfError(OSError):
    """A libbpf call failed; `errno` is the positive error code, `log` libbpf's own messages."""

    def __init__(self, what: str, err: int, log: Sequence[str] = ()) -> None:
        self.what = what
        self.log = [line.rstrip() for line in log if line.strip()]
        msg = f"{what}: {os.strerror(err)} (errno {err})"
        if self.log:
            msg += "\n  " + "\n  ".join(self.log[-8:])
        super().__init__(err, msg)

    def __str__(self) -> str:
        return self.args[1]


class LibbpfUnavailable(RuntimeError):
    """libbpf.so.1 is missing or older than MIN_VERSION."""


# ---- loading the library ----------------------------------------------------------------------

_c_int_p = ctypes.POINTER(ctypes.c_int)
_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _KprobeOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("bpf_cookie", ctypes.c_uint64), ("offset", ctypes.c_size_t),
                ("retprobe", ctypes.c_bool)]


class _KprobeMultiOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("syms", ctypes.POINTER(ctypes.c_char_p)),
                ("addrs", ctypes.POINTER(ctypes.c_ulong)), ("cookies", ctypes.POINTER(ctypes.c_uint64)),
                ("cnt", ctypes.c_size_t), ("retprobe", ctypes.c_bool)]


class _UprobeOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ref_ctr_offset", ctypes.c_size_t), ("bpf_cookie", ctypes.c_uint64),
                ("retprobe", ctypes.c_bool), ("func_name", ctypes.c_char_p)]


class _TraceOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("cookie", ctypes.c_uint64)]


class _ProgLoadOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("attempts", ctypes.c_int), ("expected_attach_type", ctypes.c_int),
                ("prog_btf_fd", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_ifindex", ctypes.c_uint32), ("kern_version", ctypes.c_uint32),
                ("attach_btf_id", ctypes.c_uint32), ("attach_prog_fd", ctypes.c_uint32),
                ("attach_btf_obj_fd", ctypes.c_uint32), ("fd_array", _c_int_p),
                ("func_info", ctypes.c_void_p), ("func_info_cnt", ctypes.c_uint32),
                ("func_info_rec_size", ctypes.c_uint32), ("line_info", ctypes.c_void_p),
                ("line_info_cnt", ctypes.c_uint32), ("line_info_rec_size", ctypes.c_uint32),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32), ("log_buf", ctypes.c_char_p)]


class _TracingLinkOpts(ctypes.Structure):
    _fields_ = [("cookie", ctypes.c_uint64)]


class _KprobeMultiLinkOpts(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint32), ("cnt", ctypes.c_uint32), ("syms", ctypes.c_void_p),
                ("addrs", ctypes.c_void_p), ("cookies", ctypes.c_void_p)]


class _LinkUnion(ctypes.Union):
    _fields_ = [("tracing", _TracingLinkOpts), ("kprobe_multi", _KprobeMultiLinkOpts)]


class _LinkCreateOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("iter_info", ctypes.c_void_p),
                ("iter_info_len", ctypes.c_uint32), ("target_btf_id", ctypes.c_uint32), ("u", _LinkUnion)]


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


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32), ("size_or_type", ctypes.c_uint32)]


class _BtfParam(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("type", ctypes.c_uint32)]


_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "libbpf_major_version": (ctypes.c_uint32, []),
    "libbpf_minor_version": (ctypes.c_uint32, []),
    "libbpf_set_print": (ctypes.c_void_p, [_PRINT_FN]),
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
    "bpf_map__set_value_size": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32]),
    "bpf_map__initial_value": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "bpf_map__set_initial_value": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "bpf_program__fd": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_program__set_autoload": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_bool]),
    "bpf_program__set_attach_target": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]),
    "bpf_program__insns": (ctypes.c_void_p, [ctypes.c_void_p]),
    "bpf_program__insn_cnt": (ctypes.c_size_t, [ctypes.c_void_p]),
    "bpf_program__type": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_program__expected_attach_type": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_program__attach_trace_opts": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(_TraceOpts)]),
    "bpf_program__attach_kprobe_opts": (ctypes.c_void_p,
                                        [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_KprobeOpts)]),
    "bpf_program__attach_kprobe_multi_opts": (
        ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_KprobeMultiOpts)]),
    "bpf_program__attach_uprobe_opts": (
        ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                          ctypes.POINTER(_UprobeOpts)]),
    "bpf_program__attach_raw_tracepoint": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
    "bpf_link__destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_link__fd": (ctypes.c_int, [ctypes.c_void_p]),
    "bpf_prog_load": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.POINTER(_ProgLoadOpts)]),
    "bpf_link_create": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(_LinkCreateOpts)]),
    "bpf_obj_get_info_by_fd": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]),
    "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "bpf_map_update_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]),
    "bpf_map_delete_elem": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "bpf_map_get_next_key": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]),
    "libbpf_num_possible_cpus": (ctypes.c_int, []),
    "libbpf_probe_bpf_prog_type": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "libbpf_probe_bpf_map_type": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "libbpf_probe_bpf_helper": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]),
    "ring_buffer__new": (ctypes.c_void_p, [ctypes.c_int, _SAMPLE_FN, ctypes.c_void_p, ctypes.c_void_p]),
    "ring_buffer__poll": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
    "ring_buffer__consume": (ctypes.c_int, [ctypes.c_void_p]),
    "ring_buffer__free": (None, [ctypes.c_void_p]),
    "btf__load_vmlinux_btf": (ctypes.c_void_p, []),
    "btf__parse": (ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_void_p]),
    "btf__parse_split": (ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_void_p]),
    "btf__free": (None, [ctypes.c_void_p]),
    "btf__type_cnt": (ctypes.c_uint32, [ctypes.c_void_p]),
    "btf__find_by_name_kind": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]),
    "btf__type_by_id": (ctypes.POINTER(_BtfType), [ctypes.c_void_p, ctypes.c_uint32]),
    "btf__name_by_offset": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_uint32]),
}


_LIBBPF_INFO = 1  # enum libbpf_print_level: WARN 0, INFO 1, DEBUG 2


class _Libbpf:
    """The loaded library plus the captured libbpf log (libbpf's print hook is process-wide)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        except OSError as exc:
            raise LibbpfUnavailable(
                "libbpf.so.1 not found: install the Debian package 'libbpf1' (version 1.1 or newer)") from exc
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise LibbpfUnavailable(f"libbpf.so.1 lacks {name}(): install libbpf1 1.1 or newer")
            fn.restype = restype
            fn.argtypes = argtypes
        self.version = (self.lib.libbpf_major_version(), self.lib.libbpf_minor_version())
        if self.version < MIN_VERSION:
            raise LibbpfUnavailable(
                f"libbpf {self.version[0]}.{self.version[1]} is too old: retsnoop-otel needs libbpf "
                f"{MIN_VERSION[0]}.{MIN_VERSION[1]} or newer (Debian package libbpf1)")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._vsnprintf = libc.vsnprintf
        self._vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
        self.log: deque[str] = deque(maxlen=64)
        self.debug_sink: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        self._print_cb = _PRINT_FN(self._on_print)  # kept alive for the life of the process
        self.lib.libbpf_set_print(self._print_cb)

    def _on_print(self, level: int, fmt: bytes, args: int) -> int:
        buf = ctypes.create_string_buffer(256 * 1024)  # verifier logs arrive as one message
        self._vsnprintf(buf, len(buf), fmt, args)
        text = buf.value.decode(errors="replace").rstrip("\n")
        if level <= _LIBBPF_INFO:  # debug chatter (relocations, ...) would bury the reason in errors
            self.log.append(text)
        if self.debug_sink is not None:
            self.debug_sink(text)
        return 0

    def take_log(self) -> list[str]:
        with self._lock:
            lines = list(self.log)
            self.log.clear()
        return lines


_LIB: _Libbpf | None = None
_LIB_LOCK = threading.Lock()


def lib() -> _Libbpf:
    """The process's libbpf, loaded on first use (so that `--help` works without libbpf)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = _Libbpf()
        return _LIB


def version() -> tuple[int, int]:
    return lib().version


def set_debug_sink(sink: Callable[[str], None] | None) -> None:
    """Forward every libbpf message (for -vvv)."""
    lib().debug_sink = sink


def _fail(what: str, err: int | None = None) -> LibbpfError:
    err = err if err else ctypes.get_errno() or _errno.EINVAL
    return LibbpfError(what, abs(err), lib().take_log())


def _check_ptr(ptr: int | None, what: str) -> int:
    if not ptr:
        raise _fail(what)
    return ptr


def _check_rc(rc: int, what: str) -> int:
    if rc < 0:
        raise _fail(what, -rc)
    return rc


# ---- objects, maps, programs, links --------------------------------------------------------


class Link:
    """An attached BPF link; destroying it detaches."""

    def __init__(self, ptr: int | None = None, fd: int | None = None) -> None:
        self._ptr = ptr
        self._fd = fd

    @property
    def fd(self) -> int:
        if self._ptr:
            return lib().lib.bpf_link__fd(self._ptr)
        return -1 if self._fd is None else self._fd

    def destroy(self) -> None:
        if self._ptr:
            lib().lib.bpf_link__destroy(self._ptr)
            self._ptr = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class BpfMap:
    def __init__(self, ptr: int, name: str) -> None:
        self._ptr = ptr
        self.name = name

    @property
    def fd(self) -> int:
        return lib().lib.bpf_map__fd(self._ptr)

    @property
    def key_size(self) -> int:
        return lib().lib.bpf_map__key_size(self._ptr)

    @property
    def value_size(self) -> int:
        return lib().lib.bpf_map__value_size(self._ptr)

    @property
    def max_entries(self) -> int:
        return lib().lib.bpf_map__max_entries(self._ptr)

    def set_max_entries(self, n: int) -> None:
        _check_rc(lib().lib.bpf_map__set_max_entries(self._ptr, n), f"set max_entries of map '{self.name}'")

    def set_value_size(self, n: int) -> None:
        _check_rc(lib().lib.bpf_map__set_value_size(self._ptr, n), f"set value_size of map '{self.name}'")

    def initial_value(self) -> bytes:
        size = ctypes.c_size_t(0)
        ptr = lib().lib.bpf_map__initial_value(self._ptr, ctypes.byref(size))
        return ctypes.string_at(ptr, size.value) if ptr else b""

    def set_initial_value(self, data: bytes) -> None:
        """Set .rodata/.data contents before load (read-only configuration of the BPF side)."""
        buf = ctypes.create_string_buffer(data, len(data))
        _check_rc(lib().lib.bpf_map__set_initial_value(self._ptr, buf, len(data)),
                  f"set initial value of map '{self.name}'")

    def lookup(self, key: bytes, value_size: int | None = None) -> bytes | None:
        size = value_size if value_size is not None else self.value_size
        out = ctypes.create_string_buffer(size)
        rc = lib().lib.bpf_map_lookup_elem(self.fd, key, out)
        if rc < 0:
            err = ctypes.get_errno()
            if err == _errno.ENOENT:
                return None
            raise _fail(f"lookup in map '{self.name}'", err)
        return out.raw

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        rc = lib().lib.bpf_map_update_elem(self.fd, key, value, flags)
        if rc < 0:
            raise _fail(f"update of map '{self.name}'", ctypes.get_errno())

    def delete(self, key: bytes) -> None:
        if lib().lib.bpf_map_delete_elem(self.fd, key) < 0:
            raise _fail(f"delete from map '{self.name}'", ctypes.get_errno())

    def keys(self) -> Iterator[bytes]:
        ksize = self.key_size
        prev: bytes | None = None
        nxt = ctypes.create_string_buffer(ksize)
        while True:
            rc = lib().lib.bpf_map_get_next_key(self.fd, prev, nxt)
            if rc < 0:
                err = ctypes.get_errno()
                if err == _errno.ENOENT:
                    return
                raise _fail(f"iterate map '{self.name}'", err)
            prev = nxt.raw
            yield prev


class BpfProgram:
    def __init__(self, ptr: int, name: str) -> None:
        self._ptr = ptr
        self.name = name

    @property
    def fd(self) -> int:
        return lib().lib.bpf_program__fd(self._ptr)

    @property
    def prog_type(self) -> int:
        return lib().lib.bpf_program__type(self._ptr)

    @property
    def expected_attach_type(self) -> int:
        return lib().lib.bpf_program__expected_attach_type(self._ptr)

    def set_autoload(self, autoload: bool) -> None:
        _check_rc(lib().lib.bpf_program__set_autoload(self._ptr, autoload), f"set autoload of '{self.name}'")

    def set_attach_target(self, func_name: str) -> None:
        _check_rc(lib().lib.bpf_program__set_attach_target(self._ptr, 0, func_name.encode()),
                  f"set attach target '{func_name}' of '{self.name}'")

    def insns(self) -> tuple[int, int]:
        """Address and count of the final (relocated) instructions, valid after load; for cloning."""
        return lib().lib.bpf_program__insns(self._ptr), lib().lib.bpf_program__insn_cnt(self._ptr)

    def attach_trace(self, cookie: int = 0) -> Link:
        opts = _TraceOpts(ctypes.sizeof(_TraceOpts), cookie)
        ptr = lib().lib.bpf_program__attach_trace_opts(self._ptr, ctypes.byref(opts))
        return Link(_check_ptr(ptr, f"attach {self.name}"))

    def attach_kprobe(self, func: str | None, retprobe: bool = False, cookie: int = 0, offset: int = 0) -> Link:
        """With func None, `offset` is an absolute kernel address (for names with several instances)."""
        opts = _KprobeOpts(ctypes.sizeof(_KprobeOpts), cookie, offset, retprobe)
        ptr = lib().lib.bpf_program__attach_kprobe_opts(self._ptr, func.encode() if func else None,
                                                        ctypes.byref(opts))
        kind = "kretprobe" if retprobe else "kprobe"
        return Link(_check_ptr(ptr, f"attach {kind} to {func or hex(offset)}"))

    def attach_kprobe_multi(self, *, syms: Sequence[str] | None = None, addrs: Sequence[int] | None = None,
                            cookies: Sequence[int] | None = None, retprobe: bool = False) -> Link:
        n = len(syms) if syms is not None else len(addrs or ())
        opts = _KprobeMultiOpts()
        opts.sz = ctypes.sizeof(_KprobeMultiOpts)
        keep: list[object] = []
        if syms is not None:
            arr = (ctypes.c_char_p * n)(*[s.encode() for s in syms])
            keep.append(arr)
            opts.syms = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        if addrs is not None:
            arr2 = (ctypes.c_ulong * n)(*addrs)
            keep.append(arr2)
            opts.addrs = ctypes.cast(arr2, ctypes.POINTER(ctypes.c_ulong))
        if cookies is not None:
            arr3 = (ctypes.c_uint64 * n)(*cookies)
            keep.append(arr3)
            opts.cookies = ctypes.cast(arr3, ctypes.POINTER(ctypes.c_uint64))
        opts.cnt = n
        opts.retprobe = retprobe
        ptr = lib().lib.bpf_program__attach_kprobe_multi_opts(self._ptr, None, ctypes.byref(opts))
        kind = "kretprobe.multi" if retprobe else "kprobe.multi"
        return Link(_check_ptr(ptr, f"attach {kind} to {n} functions"))

    def attach_uprobe(self, binary: str, func: str, retprobe: bool = False, cookie: int = 0,
                      pid: int = -1) -> Link:
        """Uprobes run the same kprobe-type programs; the host allows them where kprobes are off."""
        opts = _UprobeOpts(ctypes.sizeof(_UprobeOpts), 0, cookie, retprobe, func.encode())
        ptr = lib().lib.bpf_program__attach_uprobe_opts(self._ptr, pid, binary.encode(), 0, ctypes.byref(opts))
        kind = "uretprobe" if retprobe else "uprobe"
        return Link(_check_ptr(ptr, f"attach {kind} to {binary}:{func}"))

    def attach_raw_tracepoint(self, name: str) -> Link:
        ptr = lib().lib.bpf_program__attach_raw_tracepoint(self._ptr, name.encode())
        return Link(_check_ptr(ptr, f"attach raw tracepoint {name}"))


class BpfObject:
    """An opened (and later loaded) BPF ELF object."""

    def __init__(self, ptr: int, path: str) -> None:
        self._ptr: int | None = ptr
        self.path = path

    @classmethod
    def open_file(cls, path: str) -> BpfObject:
        lib().take_log()
        ptr = lib().lib.bpf_object__open_file(path.encode(), None)
        return cls(_check_ptr(ptr, f"open BPF object {path}"), path)

    def map(self, name: str) -> BpfMap:
        ptr = lib().lib.bpf_object__find_map_by_name(self._ptr, name.encode())
        if not ptr:
            raise LibbpfError(f"no map '{name}' in {self.path}", _errno.ENOENT)
        return BpfMap(ptr, name)

    def program(self, name: str) -> BpfProgram:
        ptr = lib().lib.bpf_object__find_program_by_name(self._ptr, name.encode())
        if not ptr:
            raise LibbpfError(f"no program '{name}' in {self.path}", _errno.ENOENT)
        return BpfProgram(ptr, name)

    def btf(self) -> Btf:
        """The object's BTF, data-section offsets fixed up by libbpf at open (owned by the object)."""
        return Btf(_check_ptr(lib().lib.bpf_object__btf(self._ptr), f"BTF of {self.path}"), owned=False)

    def load(self) -> None:
        lib().take_log()
        _check_rc(lib().lib.bpf_object__load(self._ptr), f"load BPF object {os.path.basename(self.path)}")

    def close(self) -> None:
        if self._ptr:
            lib().lib.bpf_object__close(self._ptr)
            self._ptr = None


def clone_program(prog: BpfProgram, *, attach_btf_id: int, attach_type: int, name: str,
                  attach_btf_obj_fd: int = 0) -> int:
    """Load a copy of a loaded tracing program retargeted at another function; returns its fd.

    fentry/fexit programs are bound to one function at load time, so mass-attaching needs one
    program per function. Cloning the relocated instructions avoids re-opening the object.
    """
    insns, cnt = prog.insns()
    opts = _ProgLoadOpts()
    opts.sz = ctypes.sizeof(_ProgLoadOpts)
    opts.expected_attach_type = attach_type
    opts.attach_btf_id = attach_btf_id
    opts.attach_btf_obj_fd = attach_btf_obj_fd
    fd = lib().lib.bpf_prog_load(prog.prog_type, name.encode()[:15], b"GPL", insns, cnt, ctypes.byref(opts))
    if fd < 0:
        raise _fail(f"load {name} for BTF id {attach_btf_id}", ctypes.get_errno())
    return fd


def link_create(prog_fd: int, attach_type: int, cookie: int = 0, what: str = "link") -> Link:
    """Attach a loaded tracing program fd (fentry/fexit) with a BPF cookie; returns an fd-owning Link."""
    opts = _LinkCreateOpts()
    opts.sz = ctypes.sizeof(_LinkCreateOpts)
    opts.u.tracing.cookie = cookie
    fd = lib().lib.bpf_link_create(prog_fd, 0, attach_type, ctypes.byref(opts))
    if fd < 0:
        raise _fail(f"attach {what}", ctypes.get_errno())
    return Link(fd=fd)


def prog_info(prog_fd: int) -> ProgInfo:
    """BPF_OBJ_GET_INFO_BY_FD on a program: its run_cnt and run_time_ns are the bpf_stats counters."""
    info = ProgInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    rc = lib().lib.bpf_obj_get_info_by_fd(prog_fd, ctypes.byref(info), ctypes.byref(size))
    if rc < 0:  # libbpf logs nothing here: older messages in its log would only mislead
        raise LibbpfError(f"get info of BPF program fd {prog_fd}", -rc)
    return info


def num_possible_cpus() -> int:
    return _check_rc(lib().lib.libbpf_num_possible_cpus(), "count possible CPUs")


def probe_prog_type(prog_type: int) -> bool:
    return lib().lib.libbpf_probe_bpf_prog_type(prog_type, None) == 1


def probe_map_type(map_type: int) -> bool:
    return lib().lib.libbpf_probe_bpf_map_type(map_type, None) == 1


def probe_helper(prog_type: int, helper_id: int) -> bool:
    return lib().lib.libbpf_probe_bpf_helper(prog_type, helper_id, None) == 1


# ---- ring buffer ------------------------------------------------------------------------------


class RingBuffer:
    """Consumes a BPF ring buffer map, calling `callback(bytes)` for each record.

    An exception raised by the callback stops the poll and is re-raised from poll()/consume().
    """

    def __init__(self, map_fd: int, callback: Callable[[bytes], None]) -> None:
        self._callback = callback
        self._error: BaseException | None = None
        self._cb = _SAMPLE_FN(self._on_sample)
        ptr = lib().lib.ring_buffer__new(map_fd, self._cb, None, None)
        self._ptr: int | None = _check_ptr(ptr, "create ring buffer consumer")

    def _on_sample(self, _ctx: int, data: int, size: int) -> int:
        try:
            self._callback(ctypes.string_at(data, size))
        except BaseException as exc:  # noqa: BLE001 - carried across the C frame, re-raised in poll()
            self._error = exc
            return -1
        return 0

    def _reraise(self, rc: int, what: str) -> int:
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if rc < 0 and rc != -_errno.EINTR:
            raise _fail(what, -rc)
        return max(rc, 0)

    def poll(self, timeout_ms: int) -> int:
        return self._reraise(lib().lib.ring_buffer__poll(self._ptr, timeout_ms), "poll ring buffer")

    def consume(self) -> int:
        return self._reraise(lib().lib.ring_buffer__consume(self._ptr), "consume ring buffer")

    def free(self) -> None:
        if self._ptr:
            lib().lib.ring_buffer__free(self._ptr)
            self._ptr = None


# ---- BTF --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BtfType:
    id: int
    kind: int
    name: str
    vlen: int
    size_or_type: int
    int_encoding: int = 0
    int_bits: int = 0


class Btf:
    """Read-only view of kernel BTF through libbpf (C parsing: fast even under emulation)."""

    def __init__(self, ptr: int, owned: bool = True) -> None:
        self._ptr: int | None = ptr
        self._owned = owned

    @classmethod
    def load_vmlinux(cls) -> Btf:
        lib().take_log()
        return cls(_check_ptr(lib().lib.btf__load_vmlinux_btf(), "load kernel BTF"))

    @classmethod
    def parse(cls, path: str) -> Btf:
        return cls(_check_ptr(lib().lib.btf__parse(path.encode(), None), f"parse BTF {path}"))

    def find(self, name: str, kind: int) -> int | None:
        tid = lib().lib.btf__find_by_name_kind(self._ptr, name.encode(), kind)
        return tid if tid > 0 else None

    def type_by_id(self, tid: int) -> BtfType:
        t = lib().lib.btf__type_by_id(self._ptr, tid)
        if not t:
            raise LibbpfError(f"BTF type id {tid} not found", _errno.ENOENT)
        rec = t.contents
        kind = (rec.info >> 24) & 0x1F
        name = lib().lib.btf__name_by_offset(self._ptr, rec.name_off) or b""
        enc = bits = 0
        if kind == BTF_KIND_INT:
            extra = ctypes.cast(ctypes.addressof(rec) + ctypes.sizeof(_BtfType),
                                ctypes.POINTER(ctypes.c_uint32)).contents.value
            enc, bits = (extra >> 24) & 0x0F, extra & 0xFF
        return BtfType(tid, kind, name.decode(), rec.info & 0xFFFF, rec.size_or_type, enc, bits)

    def func_params(self, proto_id: int) -> list[tuple[str, int]]:
        """(name, type id) of each parameter of a FUNC_PROTO."""
        proto = lib().lib.btf__type_by_id(self._ptr, proto_id)
        vlen = proto.contents.info & 0xFFFF
        base = ctypes.addressof(proto.contents) + ctypes.sizeof(_BtfType)
        params = (_BtfParam * vlen).from_address(base)
        out = []
        for p in params:
            name = lib().lib.btf__name_by_offset(self._ptr, p.name_off) or b""
            out.append((name.decode(), p.type))
        return out

    def members(self, tid: int) -> list[tuple[str, int, int, int]]:
        """(name, type id, bit offset, bitfield size or 0) of a STRUCT/UNION's members."""
        t = lib().lib.btf__type_by_id(self._ptr, tid)
        info = t.contents.info
        vlen, kflag = info & 0xFFFF, info >> 31
        base = ctypes.addressof(t.contents) + ctypes.sizeof(_BtfType)
        out = []
        for name_off, mtype, offset in (ctypes.c_uint32 * 3 * vlen).from_address(base):
            name = lib().lib.btf__name_by_offset(self._ptr, name_off) or b""
            bits, off = (offset >> 24, offset & 0xFFFFFF) if kflag else (0, offset)
            out.append((name.decode(), mtype, off, bits))
        return out

    def datasec_vars(self, section: str) -> dict[str, tuple[int, int]]:
        """Variables of a data section (.rodata, .bss) as name -> (offset, size)."""
        sec_id = self.find(section, BTF_KIND_DATASEC)
        if sec_id is None:
            return {}
        sec = lib().lib.btf__type_by_id(self._ptr, sec_id)
        vlen = sec.contents.info & 0xFFFF
        base = ctypes.addressof(sec.contents) + ctypes.sizeof(_BtfType)
        out = {}
        for var_type, offset, size in ((ctypes.c_uint32 * 3 * vlen).from_address(base)):
            out[self.type_by_id(var_type).name] = (offset, size)
        return out

    def type_count(self) -> int:
        return lib().lib.btf__type_cnt(self._ptr)

    def free(self) -> None:
        if self._ptr and self._owned:
            lib().lib.btf__free(self._ptr)
            self._ptr = None

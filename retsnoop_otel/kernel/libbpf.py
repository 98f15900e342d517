"""ctypes binding over our own libbpf (built with the package, retsnoop_otel/bpf/libbpf.so.1; bpf/build-libbpf
pins its version): the library, its errors, and BPF objects with their maps, programs and links.

Not the host's libbpf: Debian 12 ships 1.1 and Ubuntu 22.04 0.5, and what current kernels need (kfunc
flavours, fsession) is newer than either; one pinned loader behaves the same on every host.

Only what retsnoop-otel calls. Failures raise LibbpfError carrying errno and the messages libbpf
printed while failing, so users see libbpf's own explanation. libbpf_abi.py declares the C side;
libbpf_progs.py (bare program fds), libbpf_btf.py and libbpf_ringbuf.py bind the rest of what we
use through the library loaded here.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence

from retsnoop_otel.command.streams import callback_code, raise_deferred
from retsnoop_otel.kernel import libbpf_abi as abi

MIN_VERSION = (1, 7)

# enum bpf_prog_type / bpf_map_type values (uapi linux/bpf.h), for the feature probes and set_type().
PROG_TYPE_KPROBE = 2
PROG_TYPE_TRACEPOINT = 5
PROG_TYPE_RAW_TRACEPOINT = 17
PROG_TYPE_TRACING = 26
MAP_TYPE_RINGBUF = 27


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
    """Our libbpf.so.1 is missing, older than MIN_VERSION, or lacks a function we bind."""


def library_path() -> str:
    # next to the BPF object it loads (kernel/tracer.bpf_object_path)
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bpf", "libbpf.so.1")


# ---- loading the library ----------------------------------------------------------------------

_LIBBPF_INFO = 1  # enum libbpf_print_level: WARN 0, INFO 1, DEBUG 2


class _Libbpf:
    """The loaded library and the log its print hook captures.

    Every function of every signature table is resolved here, at load: a libbpf that lacks one
    refuses to start with one clear message instead of failing in the middle of a run.
    """

    def __init__(self, path: str | None = None) -> None:
        path = path or library_path()
        rebuild = "rebuild the package (`make bpf` in a checkout, or reinstall it)"
        if not os.path.exists(path):
            raise LibbpfUnavailable(f"{path} is missing: the package was built without its libbpf; {rebuild}")
        try:
            self.lib = ctypes.CDLL(path, use_errno=True)
        except OSError as exc:  # libelf.so.1 or zlib missing, or a library built for another machine
            raise LibbpfUnavailable(f"cannot load {path}: {exc} (it needs the Debian packages libelf1 and "
                                    f"zlib1g; otherwise {rebuild})") from exc
        for name, (restype, argtypes) in abi.SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise LibbpfUnavailable(f"{path} lacks {name}(): {rebuild}")
            fn.restype = restype
            fn.argtypes = argtypes
        self.path = path
        self.version = (self.lib.libbpf_major_version(), self.lib.libbpf_minor_version())
        if self.version < MIN_VERSION:
            raise LibbpfUnavailable(
                f"{path} is libbpf {self.version[0]}.{self.version[1]}, too old: retsnoop-otel needs libbpf "
                f"{MIN_VERSION[0]}.{MIN_VERSION[1]} or newer; {rebuild}")
        libc = _libc()
        self._vsnprintf = libc.vsnprintf
        self._vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
        self.log: deque[str] = deque(maxlen=64)
        self.interrupt: BaseException | None = None  # a signal's exception raised inside the print hook
        self._lock = threading.Lock()
        self._print_cb = abi.PRINT_FN(self._on_print)  # kept alive for the life of the process
        self.lib.libbpf_set_print(abi.without_debug(self._print_cb, _LIBBPF_INFO))

    def _on_print(self, level: int, fmt: bytes, args: int) -> int:
        """libbpf's print hook: a ctypes callback, where an exception cannot propagate (Python prints "Exception
        ignored" and the call goes on). A signal's exception raised in here (Ctrl-C during a slow load) is kept
        and raised once the libbpf call returns (check_rc, check_ptr, reraise_interrupt)."""
        try:
            if level > _LIBBPF_INFO:  # debug chatter (relocations, ...) would bury the reason in errors
                return 0
            buf = ctypes.create_string_buffer(256 * 1024)  # verifier logs arrive as one message
            self._vsnprintf(buf, len(buf), fmt, args)
            self.log.append(buf.value.decode(errors="replace").rstrip("\n"))
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, a start's SignalStop: raised after the call
            if self.interrupt is None:
                self.interrupt = exc
        return 0

    def reraise_interrupt(self) -> None:
        """The signal's exception kept by the print hook, raised now on the main thread (signals only run there)."""
        if self.interrupt is not None and threading.current_thread() is threading.main_thread():
            exc, self.interrupt = self.interrupt, None
            raise exc

    def take_log(self) -> list[str]:
        with self._lock:
            lines = list(self.log)
            self.log.clear()
        return lines


callback_code(_Libbpf._on_print.__code__)  # a start signal is raised after the libbpf call, not in the hook

# One per process: libbpf_set_print() installs a single process-wide hook, so the log it captures
# cannot belong to anything smaller than the process.
_LIB: _Libbpf | None = None
_LIB_LOCK = threading.Lock()


def lib() -> _Libbpf:
    """The process's libbpf, loaded on first use (so that `--help` works without libbpf)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = _Libbpf()
        return _LIB


def _libc() -> ctypes.CDLL:
    """glibc by its soname; ctypes.util's search (which imports subprocess and shutil: 7 ms of a 100 ms
    start, 0.2 s under emulation) only where that name is unknown."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        from ctypes.util import find_library
        return ctypes.CDLL(find_library("c"), use_errno=True)


def version() -> tuple[int, int]:
    return lib().version


def fail(what: str, err: int | None = None) -> LibbpfError:
    """The error of a call that just failed, with what libbpf printed since the last take_log()."""
    err = err if err else ctypes.get_errno() or _errno.EINVAL
    return LibbpfError(what, abs(err), lib().take_log())


def _reraise_interrupt() -> None:
    """After a libbpf call: the start signal that landed in its print hook, if any (command/streams.py)."""
    raise_deferred()
    if _LIB is not None:
        _LIB.reraise_interrupt()


def check_ptr(ptr: int | None, what: str) -> int:
    _reraise_interrupt()
    if not ptr:
        raise fail(what)
    return ptr


def check_rc(rc: int, what: str) -> int:
    _reraise_interrupt()
    if rc < 0:
        raise fail(what, -rc)
    return rc


# ---- objects, maps, programs, links --------------------------------------------------------


class Link:
    """An attached BPF link (libbpf's, or a bare link fd); destroying it detaches."""

    def __init__(self, ptr: int | None = None, fd: int | None = None) -> None:
        self._ptr = ptr
        self._fd = fd

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
        check_rc(lib().lib.bpf_map__set_max_entries(self._ptr, n), f"set max_entries of map '{self.name}'")

    def initial_value(self) -> bytes:
        size = ctypes.c_size_t(0)
        ptr = lib().lib.bpf_map__initial_value(self._ptr, ctypes.byref(size))
        return ctypes.string_at(ptr, size.value) if ptr else b""

    def set_initial_value(self, data: bytes) -> None:
        """Set .rodata/.data contents before load (read-only configuration of the BPF side)."""
        buf = ctypes.create_string_buffer(data, len(data))
        check_rc(lib().lib.bpf_map__set_initial_value(self._ptr, buf, len(data)),
                 f"set initial value of map '{self.name}'")

    def lookup(self, key: bytes, value_size: int | None = None) -> bytes | None:
        """The value, or None without that key; per-CPU maps need value_size = value size x CPUs."""
        size = value_size if value_size is not None else self.value_size
        out = ctypes.create_string_buffer(size)
        rc = lib().lib.bpf_map_lookup_elem(self.fd, key, out)
        if rc < 0:
            err = ctypes.get_errno()
            if err == _errno.ENOENT:
                return None
            raise fail(f"lookup in map '{self.name}'", err)
        return out.raw

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        rc = lib().lib.bpf_map_update_elem(self.fd, key, value, flags)
        if rc < 0:
            raise fail(f"update of map '{self.name}'", ctypes.get_errno())

    def delete(self, key: bytes) -> bool:
        """False when the key was not there."""
        rc = lib().lib.bpf_map_delete_elem(self.fd, key)
        if rc < 0:
            err = ctypes.get_errno()
            if err == _errno.ENOENT:
                return False
            raise fail(f"delete from map '{self.name}'", err)
        return True

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
                raise fail(f"iterate map '{self.name}'", err)
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

    def set_autoload(self, autoload: bool) -> None:
        check_rc(lib().lib.bpf_program__set_autoload(self._ptr, autoload), f"set autoload of '{self.name}'")

    def set_expected_attach_type(self, attach_type: int) -> None:
        """Before load; how a kprobe program becomes a kprobe.session one with libbpf 1.1 (no such SEC)."""
        check_rc(lib().lib.bpf_program__set_expected_attach_type(self._ptr, attach_type),
                 f"set expected attach type of '{self.name}'")

    def set_type(self, prog_type: int) -> None:
        """Before load; a program in a section libbpf does not know (SEC("fsession.multi") in 1.7) gets its type
        here, and libbpf then leaves its attach target alone (no BTF id: what tracing_multi programs need)."""
        check_rc(lib().lib.bpf_program__set_type(self._ptr, prog_type), f"set type of '{self.name}'")

    def set_attach_target(self, func_name: str) -> None:
        check_rc(lib().lib.bpf_program__set_attach_target(self._ptr, 0, func_name.encode()),
                 f"set attach target '{func_name}' of '{self.name}'")

    def insns(self) -> tuple[int, int]:
        """Address and count of the final (relocated) instructions, valid after load; for cloning."""
        return lib().lib.bpf_program__insns(self._ptr), lib().lib.bpf_program__insn_cnt(self._ptr)

    def attach_kprobe(self, func: str | None, retprobe: bool = False, cookie: int = 0, offset: int = 0) -> Link:
        """With func None, `offset` is an absolute kernel address (for names with several instances)."""
        opts = abi.KprobeOpts(ctypes.sizeof(abi.KprobeOpts), cookie, offset, retprobe)
        ptr = lib().lib.bpf_program__attach_kprobe_opts(self._ptr, func.encode() if func else None,
                                                        ctypes.byref(opts))
        kind = "kretprobe" if retprobe else "kprobe"
        return Link(check_ptr(ptr, f"attach {kind} to {func or hex(offset)}"))

    def attach_kprobe_multi(self, *, syms: Sequence[str] | None = None, addrs: Sequence[int] | None = None,
                            cookies: Sequence[int] | None = None, retprobe: bool = False) -> Link:
        n = len(syms) if syms is not None else len(addrs or ())
        opts = abi.KprobeMultiOpts()
        opts.sz = ctypes.sizeof(abi.KprobeMultiOpts)
        keep: list[object] = []  # the arrays must outlive the call
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
        return Link(check_ptr(ptr, f"attach {kind} to {n} functions"))

    def attach_uprobe_at(self, binary: str, offset: int, retprobe: bool = False, cookie: int = 0) -> Link:
        """One uprobe at a file offset (a function found by the caller, so a local symbol works too)."""
        opts = abi.UprobeOpts(ctypes.sizeof(abi.UprobeOpts), 0, cookie, retprobe, None)
        ptr = lib().lib.bpf_program__attach_uprobe_opts(self._ptr, -1, binary.encode(), offset, ctypes.byref(opts))
        kind = "uretprobe" if retprobe else "uprobe"
        return Link(check_ptr(ptr, f"attach {kind} to {binary}+0x{offset:x}"))

    def attach_uprobe_multi(self, binary: str, offsets: Sequence[int], cookies: Sequence[int],
                            retprobe: bool = False, session: bool = False) -> Link:
        """One uprobe_multi link for functions of one binary, by file offset, each with its cookie."""
        n = len(offsets)
        offs = (ctypes.c_ulong * n)(*offsets)
        cks = (ctypes.c_uint64 * n)(*cookies)
        opts = abi.UprobeMultiOpts()
        opts.sz = ctypes.sizeof(abi.UprobeMultiOpts)
        opts.offsets = ctypes.cast(offs, ctypes.POINTER(ctypes.c_ulong))
        opts.cookies = ctypes.cast(cks, ctypes.POINTER(ctypes.c_uint64))
        opts.cnt = n
        opts.retprobe = retprobe
        opts.session = session
        ptr = lib().lib.bpf_program__attach_uprobe_multi(self._ptr, -1, binary.encode(), None, ctypes.byref(opts))
        kind = "uprobe.session" if session else "uretprobe.multi" if retprobe else "uprobe.multi"
        return Link(check_ptr(ptr, f"attach {kind} to {n} functions of {binary}"))

    def attach_raw_tracepoint(self, tracepoint: str) -> Link:
        """A raw_tp program to a kernel tracepoint (sched_process_exec): raw tracepoints need no tracing program
        type, so they attach where fentry is refused too."""
        ptr = lib().lib.bpf_program__attach_raw_tracepoint(self._ptr, tracepoint.encode())
        return Link(check_ptr(ptr, f"attach raw tracepoint {tracepoint}"))

    def attach_raw_tracepoint_cookie(self, tracepoint: str, cookie: int) -> Link:
        """With a BPF cookie (Linux 6.10+): one program serves several raw tracepoints (-J rawtp:)."""
        opts = abi.CookieOpts(ctypes.sizeof(abi.CookieOpts), cookie)
        ptr = lib().lib.bpf_program__attach_raw_tracepoint_opts(self._ptr, tracepoint.encode(), ctypes.byref(opts))
        return Link(check_ptr(ptr, f"attach raw tracepoint {tracepoint}"))

    def attach_tracepoint(self, category: str, name: str, cookie: int = 0) -> Link:
        """A tracepoint program to events/CATEGORY/NAME, with a BPF cookie (Linux 5.15+)."""
        opts = abi.CookieOpts(ctypes.sizeof(abi.CookieOpts), cookie)
        ptr = lib().lib.bpf_program__attach_tracepoint_opts(self._ptr, category.encode(), name.encode(),
                                                            ctypes.byref(opts))
        return Link(check_ptr(ptr, f"attach tracepoint {category}:{name}"))


class BpfObject:
    """An opened (and later loaded) BPF ELF object."""

    def __init__(self, ptr: int, path: str) -> None:
        self._ptr: int | None = ptr
        self.path = path

    @property
    def ptr(self) -> int | None:
        """The libbpf `struct bpf_object *` (None once closed), for the other binding modules."""
        return self._ptr

    @classmethod
    def open_file(cls, path: str) -> BpfObject:
        lib().take_log()
        ptr = lib().lib.bpf_object__open_file(path.encode(), None)
        return cls(check_ptr(ptr, f"open BPF object {path}"), path)

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

    def load(self) -> None:
        lib().take_log()
        check_rc(lib().lib.bpf_object__load(self._ptr), f"load BPF object {os.path.basename(self.path)}")

    def close(self) -> None:
        if self._ptr:
            lib().lib.bpf_object__close(self._ptr)
            self._ptr = None


def num_possible_cpus() -> int:
    """Per-CPU map values hold one slot per possible (not online) CPU."""
    return check_rc(lib().lib.libbpf_num_possible_cpus(), "count possible CPUs")


def probe_map_type(map_type: int) -> bool:
    return lib().lib.libbpf_probe_bpf_map_type(map_type, None) == 1


def probe_helper(prog_type: int, helper_id: int) -> bool:
    return lib().lib.libbpf_probe_bpf_helper(prog_type, helper_id, None) == 1

"""`retsnoop-otel simfail CASE...`: make the kernel fail (or succeed) in known ways, on purpose.

The workload that ships with the tool, modelled on retsnoop's simfail: each case issues one
well-understood system call whose in-kernel error path is worth tracing (an invalid map, a NULL
pointer, a kprobe on a missing function, a fentry the trampoline refuses). Raw syscalls, not
libbpf, so the kernel sees exactly these arguments and its errno comes back unchanged.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import TextIO

from retsnoop_otel.capture.errnos import errno_name
from retsnoop_otel.command.help_format import HelpFormatter, OneLineParser
from retsnoop_otel.inputs.files import shown
from retsnoop_otel.kernel import bpfsys

MAP_NAME = b"simfail_map"
BASELINE = dict(map_type=bpfsys.MAP_ARRAY, key_size=4, value_size=4, max_entries=1, map_flags=0)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MISSING_KFUNC = "simfail_non_existing_kfunc"
FENTRY_UNSUPP_FUNC = "btf_struct_access"
ENOTSUPP = 524
PR_SET_NAME = 15
TASK_COMM_LEN = 16
S_CREATE = "bpf(BPF_MAP_CREATE)"
S_LOOKUP = "bpf(BPF_MAP_LOOKUP_ELEM)"
S_UPDATE = "bpf(BPF_MAP_UPDATE_ELEM)"
S_LOAD = "bpf(BPF_PROG_LOAD)"
S_LINK = "bpf(BPF_LINK_CREATE)"
S_KPROBE = "perf_event_open(kprobe)"


class StepFailed(Exception):
    """A system call of a case failed: which one and the kernel's errno."""

    def __init__(self, step: str, err: int) -> None:
        super().__init__(f"{step} failed: {_neg(err)}")
        self.step = step
        self.errno = err


class CannotRun(Exception):
    """The case cannot reach its system call here (e.g. no kprobe PMU): not a result."""


@dataclass(frozen=True)
class Case:
    """One workload case: `fails_at` is the call that must fail (None: every call must succeed).

    `expected_errno` is what the kernel's code answers by design; `errno_by_series` overrides it
    for kernel series ("6.1") that answer differently.
    """

    name: str
    description: str
    run: Callable[[ExitStack], str]
    fails_at: str | None
    expected_errno: int | None
    errno_by_series: dict[str, int] = field(default_factory=dict)

    def expected_for(self, series: str) -> int | None:
        return self.errno_by_series.get(series, self.expected_errno)


@dataclass(frozen=True)
class Result:
    case: str
    as_designed: bool
    step: str
    errno: int
    message: str


def _neg(err: int) -> str:
    return f"-{errno_name(err) or err}"


def kernel_series(release: str) -> str:
    """'6.12.117+deb12-amd64' -> '6.12'."""
    parts = release.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else release


def _attempt(step: str, fn: Callable[..., int | None], *args: object, **kwargs: object) -> int | None:
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        raise StepFailed(step, exc.errno or _errno.EINVAL) from None


def _fd(res: ExitStack, step: str, fn: Callable[..., int], *args: object, **kwargs: object) -> int:
    """Run a call that returns an fd and make sure the fd gets closed."""
    fd = _attempt(step, fn, *args, **kwargs)
    assert isinstance(fd, int)
    res.callback(os.close, fd)
    return fd


# ---- case bodies ------------------------------------------------------------------------------


def _map_create(**overrides: int) -> Callable[[ExitStack], str]:
    attrs = {**BASELINE, **overrides}

    def run(res: ExitStack) -> str:
        fd = _fd(res, S_CREATE, bpfsys.map_create, name=MAP_NAME, **attrs)
        return f"map fd {fd}"
    return run


def _good_map_array(res: ExitStack) -> str:
    fd = _fd(res, S_CREATE, bpfsys.map_create, name=MAP_NAME, **BASELINE)
    key, value, out = ctypes.c_uint32(0), ctypes.c_uint32(0x5EED), ctypes.c_uint32(0)
    _attempt(S_UPDATE, bpfsys.map_update_elem, fd, ctypes.addressof(key), ctypes.addressof(value))
    _attempt(S_LOOKUP, bpfsys.map_lookup_elem, fd, ctypes.addressof(key), ctypes.addressof(out))
    if out.value != value.value:
        raise CannotRun(f"map value read back as {out.value:#x}, wrote {value.value:#x}")
    return f"map fd {fd}, element 0 written and read back"


def _lookup_null(null_key: bool) -> Callable[[ExitStack], str]:
    def run(res: ExitStack) -> str:
        fd = _fd(res, S_CREATE, bpfsys.map_create, name=MAP_NAME, **BASELINE)
        key, value = ctypes.c_uint32(0), ctypes.c_uint32(0)
        key_ptr = None if null_key else ctypes.addressof(key)
        value_ptr = None if not null_key else ctypes.addressof(value)
        _attempt(S_LOOKUP, bpfsys.map_lookup_elem, fd, key_ptr, value_ptr)
        return "lookup returned"
    return run


def _kprobe_bad_kfunc(res: ExitStack) -> str:
    prog = _fd(res, S_LOAD, bpfsys.prog_load, bpfsys.PROG_KPROBE, bpfsys.RETURN_ZERO, name=b"simfail_kprobe")
    try:
        pmu = bpfsys.kprobe_pmu_type()
    except (OSError, ValueError):
        raise CannotRun("this kernel has no kprobe PMU (/sys/bus/event_source/devices/kprobe): kprobes are "
                        "not configured (CONFIG_KPROBES/CONFIG_KPROBE_EVENTS)") from None
    event = _fd(res, S_KPROBE, bpfsys.perf_kprobe_open, MISSING_KFUNC, pmu)
    bpfsys.perf_set_bpf(event, prog)
    return f"kprobe on {MISSING_KFUNC} created (event fd {event})"


def _fentry_unsupp_func(res: ExitStack) -> str:
    from retsnoop_otel.kernel import libbpf_btf as lb
    btf = lb.Btf.load_vmlinux()
    try:
        tid = btf.find(FENTRY_UNSUPP_FUNC, lb.BTF_KIND_FUNC)
    finally:
        btf.free()
    if tid is None:
        raise CannotRun(f"{FENTRY_UNSUPP_FUNC} is not in this kernel's BTF")
    prog = _fd(res, S_LOAD, bpfsys.prog_load, bpfsys.PROG_TRACING, bpfsys.RETURN_ZERO,
               expected_attach_type=bpfsys.ATTACH_TRACE_FENTRY, attach_btf_id=tid, name=b"simfail_fentry")
    link = _fd(res, S_LINK, bpfsys.link_create, prog, bpfsys.ATTACH_TRACE_FENTRY)
    return f"fentry on {FENTRY_UNSUPP_FUNC} attached (link fd {link})"


def _simple_obj(res: ExitStack) -> str:
    var = _fd(res, S_CREATE, bpfsys.map_create, bpfsys.MAP_ARRAY, 4, 8, 1, name=b"simfail_my_var")
    prog = _fd(res, S_LOAD, bpfsys.prog_load, bpfsys.PROG_KPROBE, bpfsys.counter_prog(var),
               name=b"simfail_simple")
    return f"kprobe program incrementing my_var loaded (prog fd {prog})"


def _sleep(seconds: float) -> Callable[[ExitStack], str]:
    def run(res: ExitStack) -> str:
        t0 = time.monotonic()
        time.sleep(seconds)
        return f"slept {time.monotonic() - t0:.3f} s"
    return run


E = _errno
CASES: dict[str, Case] = {c.name: c for c in [
    Case("bpf-bad-map-type", "BPF_MAP_CREATE with map_type -1 (no such map type)",
         _map_create(map_type=-1), S_CREATE, E.EINVAL),
    Case("bpf-bad-map-create-flags", "BPF_MAP_CREATE with map_flags -1 (every flag, including conflicting ones)",
         _map_create(map_flags=-1), S_CREATE, E.EINVAL),
    Case("bpf-bad-map-key-size-array", "ARRAY map with an 8-byte key (arrays take u32 indexes)",
         _map_create(key_size=8), S_CREATE, E.EINVAL),
    Case("bpf-bad-map-key-size-stackmap", "STACK_TRACE map with an 8-byte key (stack ids are u32)",
         _map_create(map_type=bpfsys.MAP_STACK_TRACE, key_size=8), S_CREATE, E.EINVAL),
    Case("bpf-bad-map-key-size-ringbuf", "RINGBUF map with key size 1 (ring buffers have no keys)",
         _map_create(map_type=bpfsys.MAP_RINGBUF, key_size=1, value_size=0, max_entries=PAGE_SIZE),
         S_CREATE, E.EINVAL),
    Case("bpf-bad-map-val-size-percpu-array", "PERCPU_ARRAY map with 1 MiB values, 1024 entries",
         _map_create(map_type=bpfsys.MAP_PERCPU_ARRAY, value_size=1 << 20, max_entries=1024),
         S_CREATE, E.E2BIG),
    Case("bpf-bad-map-max-entries-array", "ARRAY map with max_entries 0",
         _map_create(max_entries=0), S_CREATE, E.EINVAL),
    Case("bpf-bad-map-max-entries-ringbuf", "RINGBUF map whose size is not a power-of-2 number of pages",
         _map_create(map_type=bpfsys.MAP_RINGBUF, key_size=0, value_size=0, max_entries=PAGE_SIZE - 1),
         S_CREATE, E.EINVAL),
    Case("bpf-bad-map-lookup-key", "BPF_MAP_LOOKUP_ELEM on a valid ARRAY map with key = NULL",
         _lookup_null(null_key=True), S_LOOKUP, E.EFAULT),
    Case("bpf-bad-map-lookup-value", "BPF_MAP_LOOKUP_ELEM on a valid ARRAY map with value = NULL",
         _lookup_null(null_key=False), S_LOOKUP, E.EFAULT),
    Case("bpf-kprobe-bad-kfunc", f"load a kprobe program, then create a kprobe on missing {MISSING_KFUNC}()",
         _kprobe_bad_kfunc, S_KPROBE, E.ENOENT),
    # btf_struct_access() has 8 arguments; x86 BPF trampolines took at most 6 before Linux 6.6, so
    # attaching fails there with ENOTSUPP. 6.6+ (checked on 6.12) takes up to 12 and attaches it.
    Case("bpf-fentry-unsupp-func", f"load a fentry program for {FENTRY_UNSUPP_FUNC}(), then attach it "
         "(fails before Linux 6.6: 8 arguments)",
         _fentry_unsupp_func, S_LINK, ENOTSUPP),
    Case("bpf-simple-obj", "load a kprobe program that increments a map value (succeeds)",
         _simple_obj, None, None),
    Case("bpf-good-map-array", "create the baseline ARRAY map, write and read element 0 (succeeds)",
         _good_map_array, None, None),
    Case("syscall-long-sleep", "sleep for 1 s (for -L/--longer)", _sleep(1.0), None, None),
    Case("syscall-short-sleep", "sleep for 1 ms (what -L/--longer should leave out)", _sleep(0.001), None, None),
]}


def run_case(case: Case, series: str) -> Result:
    """Run a case once, closing everything it opened, and judge whether it behaved as designed."""
    expected = case.expected_for(series)
    try:
        with ExitStack() as res:
            what = case.run(res)
    except StepFailed as exc:
        if case.fails_at is None:
            return Result(case.name, False, exc.step, exc.errno, f"{case.name}: {exc.step} failed: {_neg(exc.errno)}")
        if exc.step != case.fails_at:
            return Result(case.name, False, exc.step, exc.errno,
                          f"{case.name}: {exc.step} failed: {_neg(exc.errno)} (the case needs it to succeed "
                          f"and {case.fails_at} to fail)")
        if expected is None or exc.errno == expected:
            return Result(case.name, True, exc.step, exc.errno,
                          f"{case.name}: {exc.step} failed as expected: {_neg(exc.errno)}")
        return Result(case.name, True, exc.step, exc.errno,
                      f"{case.name}: {exc.step} failed as designed, with {_neg(exc.errno)} "
                      f"(kernel {series} was expected to answer {_neg(expected)})")
    except CannotRun as exc:
        return Result(case.name, False, "", 0, f"{case.name}: cannot run here: {exc}")
    if case.fails_at is None:
        return Result(case.name, True, "", 0, f"{case.name}: succeeded as expected: {what}")
    return Result(case.name, False, case.fails_at, 0,
                  f"{case.name}: {case.fails_at} unexpectedly succeeded: {what}")


def set_thread_name(name: str) -> None:
    """prctl(PR_SET_NAME): the name the kernel reports as this thread's comm (what -n/-N match)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_NAME, {name!r}) failed")


def wait_for_release(out: TextIO) -> None:
    """Print 'PID <pid>' and block until SIGUSR1, so a test can set up a tracer or cgroup for this pid."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # before printing: no lost signal
    print(f"PID {os.getpid()}", file=out, flush=True)
    signal.sigwait({signal.SIGUSR1})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def format_list() -> str:
    width = max(len(n) for n in CASES)
    lines = []
    for c in CASES.values():
        outcome = "succeeds" if c.fails_at is None else f"{c.fails_at} -> {_neg(c.expected_errno or 0)}"
        lines.append(f"{c.name:<{width}}  {c.description} [{outcome}]")
    return "\n".join(lines)


MAX_DELAY_MS = 3_600_000.0  # an hour between repetitions


def _delay_ms(text: str) -> float:
    """--delay-ms: a finite number of milliseconds, 0 to an hour (NaN passed the `< 0` check, and time.sleep()
    refuses it with a traceback; 1e300 would sleep for ever)."""
    import argparse

    from retsnoop_otel.inputs.numbers import NumberError
    from retsnoop_otel.runtime.config_keys import number_text
    try:
        return number_text(text, 0, MAX_DELAY_MS, "milliseconds")
    except NumberError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_delay_ms.__name__ = "milliseconds"


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="retsnoop-otel simfail", formatter_class=HelpFormatter,
                                description="Make the kernel fail (or succeed) in known ways: a workload "
                                            "for testing tracers. Exit 0 when every case behaved as designed.")
    p.add_argument("cases", nargs="*", metavar="CASE", help="case names (see --list)")
    p.add_argument("-l", "--list", action="store_true", help="list the cases and exit")
    p.add_argument("-a", "--all", action="store_true", help="run every case")
    p.add_argument("-r", "--repeat", type=int, default=1, metavar="N", help="run each case N times")
    p.add_argument("--delay-ms", type=_delay_ms, default=0.0, metavar="MS", help="pause between repetitions")
    p.add_argument("--json", action="store_true", help="print one JSON object per run")
    p.add_argument("-v", "--verbose", action="store_true", help="print every repetition")
    p.add_argument("--comm", metavar="NAME", help="set this thread's name (comm) first, for -n/-N tests")
    p.add_argument("--wait-signal", action="store_true",
                   help="print 'PID <pid>' and wait for SIGUSR1 before running the cases")
    args = p.parse_args(argv)
    if args.list:
        print(format_list())
        return 0
    names = list(CASES) if args.all else args.cases
    if not names:
        print("retsnoop-otel simfail: no case given (name one or more cases, or use -a; --list shows them)",
              file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"retsnoop-otel simfail: unknown case '{unknown[0]}' (retsnoop-otel simfail --list shows the "
              "cases)", file=sys.stderr)
        return 2
    if args.repeat < 1 or args.delay_ms < 0:
        print("retsnoop-otel simfail: -r needs a positive count and --delay-ms a non-negative delay",
              file=sys.stderr)
        return 2
    if args.comm is not None and not 0 < len(args.comm.encode()) < TASK_COMM_LEN:
        print(f"retsnoop-otel simfail: --comm needs 1 to {TASK_COMM_LEN - 1} bytes (the kernel's comm length), "
              f"got {shown(args.comm)}", file=sys.stderr)
        return 2
    if args.comm is not None:
        set_thread_name(args.comm)
    if args.wait_signal:
        wait_for_release(sys.stdout)
    series = kernel_series(os.uname().release)
    all_ok = True
    for name in names:
        case, good = CASES[name], 0
        for i in range(args.repeat):
            if i and args.delay_ms:
                time.sleep(args.delay_ms / 1000)
            result = run_case(case, series)
            good += result.as_designed
            if args.json:
                print(json.dumps(asdict(result)), flush=True)
            elif i == 0 or args.verbose or not result.as_designed:
                print(result.message, flush=True)
        if args.repeat > 1 and not args.json:
            print(f"{name}: {good}/{args.repeat} runs behaved as designed", flush=True)
        all_ok = all_ok and good == args.repeat
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the benches share: the trees they run, the workload, the function sets, the tools under measurement
and the kernel's statistics of their programs.

Every bench runs as a module from the repository root (`python -m bench.NAME`, in the VM guest too, whose
working directory is the repository), so the package and this module import as they do in the tests. Code one
bench alone needs stays in that bench; what two or more use lives here, so that no bench imports another.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from retsnoop_otel.capture.model import Call, RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.kernel import attach_modes, features, libbpf_progs, tracefs
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_btf as lbtf
from retsnoop_otel.kernel.attach_modes import TRAMPOLINE as TRAMPOLINE_MODES
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.runtime.config import RuntimeConfig
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.hooks import Resolved, StartHook
from retsnoop_otel.runtime.hooks import Runtime as HookRuntime
from retsnoop_otel.runtime.probe_set import TracerLike, tracer_factory
from retsnoop_otel.runtime.runtime import Runtime
from retsnoop_otel.symbols.btf import ReturnKinds

ROOT = Path(__file__).resolve().parent.parent
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")  # kernel.bpf_stats_enabled: run_time_ns and run_cnt


# ---- child processes ----------------------------------------------------------------------------


def wait_exit(proc: subprocess.Popen, timeout: float) -> float:
    """When the child exited (time.monotonic()), to the scheduler's precision, then reaped; TimeoutExpired if it did
    not within `timeout`. Popen.wait(timeout) polls in growing sleeps of up to 50 ms, which measured a 70 ms stop as
    113 ms and a 40 ms one as 63 ms: a pidfd becomes readable at the exit itself."""
    fd = os.pidfd_open(proc.pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        t = time.monotonic()
    finally:
        os.close(fd)
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    proc.wait()
    return t


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
    """Stop a child process a bench started: its stop signal, then a kill if it does not exit in time."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def roomy_nofile() -> None:
    """bpftrace keeps several fds per probe and does not raise its own limit (ours does): `ulimit -n` for both."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)) if hard != resource.RLIM_INFINITY
                       else (want, hard))


class Lines:
    """Lines of a child's stdout and stderr with the monotonic time each arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[tuple[float, str, str]] = []
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                         for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))]
        for t in self._threads:
            t.start()

    def _read(self, stream, name: str) -> None:  # noqa: ANN001 - a text pipe
        for line in stream:
            with self._cond:
                self.lines.append((time.monotonic(), name, line.rstrip("\n")))
                self._cond.notify_all()

    def wait_for(self, rx: re.Pattern[str], timeout: float) -> tuple[float, re.Match[str]] | None:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for t, _, line in self.lines[seen:]:
                    if m := rx.search(line):
                        return t, m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and all(not t.is_alive() for t in self._threads):
                    return None
                self._cond.wait(min(left, 1.0))

    def find(self, rx: re.Pattern[str]) -> list[tuple[float, re.Match[str]]]:
        with self._cond:
            return [(t, m) for t, _, line in self.lines if (m := rx.search(line))]

    def quiet_for(self, seconds: float, cap: float) -> None:
        """Wait until no line arrived for `seconds` (a consumer still printing sessions), at most `cap`."""
        end = time.monotonic() + cap
        while time.monotonic() < end:
            with self._cond:
                last = self.lines[-1][0] if self.lines else 0.0
            if time.monotonic() - last >= seconds:
                return
            time.sleep(0.5)

    def tail(self, n: int = 12) -> list[str]:
        with self._cond:
            return [f"{name}: {line}" for _, name, line in self.lines[-n:]]

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=30)


# ---- this checkout against another --------------------------------------------------------------
# Interleaving keeps a machine's slow minute from landing on one tree only, and a fresh interpreter per run
# counts imports as a user's start does.

THIS = "this checkout"


def parse_trees(description: str, runs: int) -> tuple[argparse.Namespace, dict[str, Path]]:
    """--runs and --base, and the trees to measure by name (this checkout first)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--base", type=Path, help="another checkout (`git worktree add /tmp/base REV`), run "
                    "interleaved with this one")
    args = ap.parse_args()
    return args, {THIS: ROOT} | ({"base": args.base.resolve()} if args.base else {})


def child_json(code: str, tree: Path, *argv: str) -> dict[str, float]:
    """Run `code` in a fresh interpreter that imports our package from `tree` (its working directory, and first
    on PYTHONPATH, so that a safe-path interpreter finds it too); `argv` is its sys.argv[1:]; its JSON line."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH")))))
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True,
                         cwd=tree, env=env).stdout
    return json.loads(out)


def interleaved(trees: dict[str, Path], runs: int,
                one_run: Callable[[Path], dict[str, float]]) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(runs):
        for name, tree in trees.items():
            out[name].append(one_run(tree))
    return out


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}


# ---- the function sets --------------------------------------------------------------------------

# the ~10,000: the globs bench/agent_scale.py chose on 6.12 (the largest idle subsystems first)
AGENT_SCALE_GLOBS = (
    "acpi_*", "pci*", "tcp_*", "blk*", "intel_*", "devlink_*", "dev_*", "crypto_*", "amd_*", "perf_*",
    "xfrm*", "inet*", "clk_*", "fib*", "cgroup_*", "ip6*", "sock_*", "iommu_*", "gpio*", "device_*",
    "pm_*", "input_*", "ip_*", "i2c_*", "netdev_*", "audit_*", "regulator_*", "skb_*", "ipv6_*", "sk_*",
    "udp*", "hugetlb*", "thermal_*", "shmem_*", "tcf_*", "cpufreq_*", "rtnl_*", "efi*", "ethtool*", "unix_*",
    "bio_*", "netlink_*", "pnp_*", "neigh_*", "rtc_*", "nf_*", "platform_*", "mce_*", "tc_*", "qdisc_*",
    "xdp_*", "key_*", "swap_*", "raw_*", "icmp*", "ipv4_*", "ping_*", "bus_*", "bdev_*", "genl_*",
    "kvm_*", "page_pool*", "zswap*", "driver_*", "serio_*", "arp_*", "pkcs7_*", "elv_*", "keyring_*",
)
SETS = {
    "20": (["*sys_bpf"], ["array_map_*"]),  # for trying the script out
    "100": (["*sys_bpf"], ["array_map_*", "map_*", "htab_*"]),
    "1000": (["*sys_bpf"], ["bpf_*", "array_map_*", "map_*"]),
    # the workload's own path and little else: start with a handful of functions
    "6": (["*sys_bpf"], ["map_create", "array_map_alloc_check"]),
    # ~10,000 functions of subsystems the VM leaves idle (bench/agent_scale.py's choice on 6.12)
    "10000": (["*sys_bpf"], list(AGENT_SCALE_GLOBS)),
}


@dataclass
class KernelFacts:
    """What the peers' programs are written from (bpftrace's kretfunc reads retval by type); the functions
    themselves come from the product's own steps (discovered)."""
    ret_kinds: ReturnKinds
    feats: features.Features
    btf: lbtf.Btf

    @classmethod
    def load(cls) -> KernelFacts:
        btf = lbtf.Btf.load_vmlinux()
        return cls(ReturnKinds(btf), features.detect(), btf)

    def int_ret(self, name: str) -> bool:
        return int_retval(self.btf, self.ret_kinds, name)


# ---- the product's start, in this process --------------------------------------------------------
# A bench that measures the tool runs what users run: `trace`'s flags parsed by its own parser, then the
# runtime's steps (settings, outputs, privileges, kernel, discovery, attach). What it reads afterwards (the
# probe sets, their tracers' BPF statistics) comes from the started runtime, not from a pipeline of its own.


def trace_argv(entry: Sequence[str], allow: Sequence[str] = (), deny: Sequence[str] = (), mode: str = "") -> list[str]:
    """`retsnoop-otel trace` flags for these globs, in attach mode `mode` ("": the command's own choice)."""
    globs = ([x for g in entry for x in ("-e", g)] + [x for g in allow for x in ("-a", g)]
             + [x for g in deny for x in ("-d", g)])
    return [*globs, *([our_flag(mode)] if mode else [])]


def trace_config(argv: Sequence[str]) -> RuntimeConfig:
    """The run's config exactly as `retsnoop-otel trace ARGV` builds it."""
    from retsnoop_otel.trace.flags import parse
    return parse(list(argv), os.environ).config


class _DryRun(StartHook):
    """Stops the start where `trace --dry-run` does, keeping what discovery found."""

    outputs = False

    def __init__(self) -> None:
        self.found: Resolved = []
        self.btf_func_id: Callable[[str], int | None] | None = None

    def go_on(self, runtime: HookRuntime, found: Resolved) -> bool:
        self.found = found
        self.btf_func_id = runtime.env.btf_func_id if runtime.env is not None else None
        return False


def discovered(argv: Sequence[str]) -> tuple[Any, Callable[[str], int | None] | None]:
    """What `retsnoop-otel trace ARGV --dry-run` finds (one probe set: the runtime's symbols.discovery.Discovery),
    and the kernel's BTF ids by name."""
    hook = _DryRun()
    with open(os.devnull, "w") as devnull:
        Runtime(trace_config(argv), RuntimeDeps(console=devnull)).start(hook)
    ((_cfg, found),) = hook.found
    return found, hook.btf_func_id


def our_functions(entry: Sequence[str], allow: Sequence[str], mode: str) -> list[str]:
    """The names we attach; in the trampoline modes only those with BTF (ours skips the others at attach too)."""
    found, btf_id = discovered(trace_argv(entry, allow, mode=mode))
    trampoline = mode in TRAMPOLINE_MODES
    return sorted({f.name for f in found.funcs if not trampoline or btf_id is not None and btf_id(f.name)})


@contextmanager
def started(argv: Sequence[str], object_path: Path | None = None,
            capture: Callable[[CaptureConfig], CaptureConfig] | None = None) -> Iterator[Runtime]:
    """`retsnoop-otel trace ARGV` started in this process, its sessions printed to /dev/null, shut down on leaving:
    its probe sets, and their tracers, are `runtime.probe_sets`. Through the runtime's own injection point
    (RuntimeDeps.tracer_factory): `object_path`, another build of retsnoop.bpf.c; `capture`, a change to what the
    kernel side records that no flag asks for (a bench taking the per-call cost apart: no kernel stack, ...)."""
    make = tracer_factory(object_path)

    def factory(funcs: Sequence[TracedFunc], cfg: CaptureConfig, btf_func_id: Callable[[str], int | None] | None
                ) -> TracerLike:
        return make(funcs, capture(cfg) if capture is not None else cfg, btf_func_id)

    with open(os.devnull, "w") as devnull:
        runtime = Runtime(trace_config(argv), RuntimeDeps(console=devnull, tracer_factory=factory))
        if not runtime.start():
            raise RuntimeError("the runtime stopped before attaching")
        try:
            yield runtime
        finally:
            runtime.shutdown(0.0)


def drain(runtime: Runtime) -> None:
    """Read every record waiting in the probe sets' ring buffers, as the capture loop does."""
    while sum(ps.poll(0) for ps in runtime.probe_sets) > 0:
        pass
    runtime.route.service()


CHECKED_KINDS = (RetKind.INT32, RetKind.SIGNED, RetKind.UNKNOWN)  # kretfunc: retval an int of its own width


def int_retval(btf: lbtf.Btf, ret_kinds: ReturnKinds, name: str) -> bool:
    """Whether bpftrace 0.17's kretfunc reads this function's retval right as a signed int: it returns one,
    has at most 6 parameters (more: bpftrace refuses a probe that reads retval), and none is a struct passed
    by value wider than 8 bytes (bpftrace#2858: 0.17 reads retval from the wrong slot there, and the
    verifier refuses the program, e.g. bpf_iter_link_attach's bpfptr_t)."""
    if ret_kinds(name) not in CHECKED_KINDS or (fid := btf.find(name, lbtf.BTF_KIND_FUNC)) is None:
        return False
    params = btf.func_params(btf.type_by_id(fid).size_or_type)
    if len(params) > 6:
        return False
    for _name, tid in params:
        t = btf.type_by_id(tid)
        while t.kind in (lbtf.BTF_KIND_TYPEDEF, lbtf.BTF_KIND_CONST, lbtf.BTF_KIND_VOLATILE) and t.size_or_type:
            t = btf.type_by_id(t.size_or_type)
        if t.kind in (lbtf.BTF_KIND_STRUCT, lbtf.BTF_KIND_UNION) and t.size_or_type > 8:
            return False
    return True


# ---- the kernel's side: hooks and program statistics --------------------------------------------

ENABLED = "enabled_functions"


def enabled_names() -> set[str] | None:
    """Functions with an ftrace hook (kprobes on function entries, fprobes, trampolines) right now."""
    try:
        text = (tracefs.find_tracefs() / ENABLED).read_text()
    except (OSError, tracefs.TracefsError):
        return None
    # a trampoline's line is followed by an indented one naming its address: not another function
    return {line.split()[0] for line in text.splitlines() if line.strip() and not line[0].isspace()}


def enabled_count() -> int:
    names = enabled_names()
    return -1 if names is None else len(names)


def settle_hooks(seconds: int) -> None:
    """Wait (at most `seconds`) for the kernel to finish tearing a tool's hooks down."""
    for _ in range(seconds):
        if enabled_count() <= 0:
            return
        time.sleep(1)


def prog_stats() -> dict[int, tuple[str, int, int, int]]:
    """id -> (name, run_time_ns, run_cnt, recursion_misses) of every loaded BPF program. A miss is a run
    the kernel skipped because the program was already running on that CPU (fentry inside our own
    programs' helpers): it costs the hook but is in neither run_cnt nor run_time_ns."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True,
                         timeout=600).stdout
    return {p["id"]: (p.get("name", ""), p.get("run_time_ns", 0), p.get("run_cnt", 0), p.get("recursion_misses", 0))
            for p in json.loads(out)}


def set_stats(on: bool) -> None:
    BPF_STATS.write_text("1" if on else "0")


@contextmanager
def bpf_stats_enabled() -> Iterator[None]:
    """kernel.bpf_stats_enabled=1 while measuring (for the kernel-side column), then the old value."""
    try:
        before = BPF_STATS.read_text()
        BPF_STATS.write_text("1\n")
    except OSError as exc:
        print(f"kernel.bpf_stats_enabled not set ({exc}): no kernel ns/call column", file=sys.stderr)
        yield
        return
    try:
        yield
    finally:
        BPF_STATS.write_text(before)


class ProgInfoBtf(libbpf_progs.ProgInfo):
    """bpf_prog_info continued up to attach_btf_id (5.18+): which function a fentry clone is attached to."""

    _fields_ = [("verified_insns", ctypes.c_uint32), ("attach_btf_obj_id", ctypes.c_uint32),
                ("attach_btf_id", ctypes.c_uint32)]


def prog_info_btf(fd: int) -> ProgInfoBtf:
    info = ProgInfoBtf()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    if lb.lib().lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)) < 0:
        raise OSError(ctypes.get_errno(), f"prog info of fd {fd}")
    return info


# ---- the workload: failing bpf(BPF_MAP_CREATE) calls ---------------------------------------------

WORKLOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    unsigned int attr[30];
    memset(attr, 0, sizeof(attr));
    attr[0] = 2; attr[1] = 8; attr[2] = 4; attr[3] = 1;  /* BPF_MAP_TYPE_ARRAY, key 8: EINVAL */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        long fd = syscall(SYS_bpf, 0, attr, sizeof(attr));
        if (fd >= 0) close((int)fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""

WORKLOAD_PY = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_uint32 * 30)(2, 8, 4, 1)
n = int(sys.argv[1])
t0 = time.monotonic_ns()
for _ in range(n):
    libc.syscall(321, 0, attr, ctypes.sizeof(attr))
print((time.monotonic_ns() - t0) / n)
"""


def build_workload(tmp: Path, name: str = "bpf_fail_loop", c_source: str = WORKLOAD_C,
                   py_source: str = WORKLOAD_PY) -> list[str]:
    """The command of a workload: its C source built with gcc, or its Python twin where there is no gcc."""
    if shutil.which("gcc"):
        src = tmp / f"{name}.c"
        src.write_text(c_source)
        exe = tmp / name
        if subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], capture_output=True).returncode == 0:
            return [str(exe)]
    script = tmp / f"{name}.py"
    script.write_text(py_source)
    return [sys.executable, str(script)]


def run_workload(cmd: list[str], calls: int) -> float:
    """Nanoseconds per call, as the workload measured its own loop."""
    out = subprocess.run([*cmd, str(calls)], capture_output=True, text=True, check=True, timeout=1200).stdout
    return float(out.strip().splitlines()[-1])


def traced_workload(root: Path, tracer: str, workload: list[str], calls: int) -> str:
    """The trace buffer's text after `calls` workload calls under `tracer` (filters set by the caller)."""
    (root / "current_tracer").write_text(tracer)
    (root / "tracing_on").write_text("0")
    (root / "trace").write_text("")
    (root / "tracing_on").write_text("1")
    try:
        run_workload(workload, calls)
    finally:
        (root / "tracing_on").write_text("0")
    try:
        return (root / "trace").read_text()
    finally:
        (root / "current_tracer").write_text("nop")


# ---- the tools: ours, bpftrace, upstream retsnoop ----------------------------------------------

FLAGS = {m.name: m.flags[0] for m in attach_modes.MODES if m.flags}
READY_OURS = re.compile(r"^Receiving data")
READY_BT = re.compile(r"^READY$")
ATTACHING_BT = re.compile(r"^Attaching (\d+) probes")
PHASE_OURS = re.compile(r"^Phase (\S+): (\d+) ms(?: \((.*)\))?")
PEERS = ("bpftrace", "bpftrace-kstack")  # the bpftrace peers (bench/together_cost.py and nested_calls.py take these)
RETSNOOP = "retsnoop"  # upstream retsnoop, built by hand outside the repo (below: retsnoop as a peer)
# the peer's attach mode nearest to each of ours: neither peer has kprobe.session or fsession; bpftrace 0.17 has
# no fentry multi link either, retsnoop none at all (its -M: one kprobe.multi link per direction)
NEAREST = {"kprobe": "kprobe", "kprobe_multi": "kprobe_multi", "kprobe_session": "kprobe_multi", "fentry": "fentry",
           "fsession": "fentry", "fsession_multi": "kprobe_multi"}


def bpftrace_program(mode: str, entry: Sequence[str], allow: Sequence[str], names: Sequence[str],
                     kstack: bool = False, int_ret: Callable[[str], bool] | None = None) -> str:
    """The same work as ours in bpftrace: entry and exit on the same functions, a per-thread map update.

    kstack (peer `bpftrace-kstack`): also the kernel stack where ours takes it, at the first failing
    exit of a call tree (the deepest error), kept per thread until the tree's top returns. Ours takes
    that stack at every failing session; this peer does the same, so the stack's cost is on both sides.
    """
    mode = NEAREST.get(mode, mode)  # bpftrace has no kprobe.session nor fsession: its kprobe.multi, its kfunc
    if mode == "kprobe_multi":
        targets = [*entry, *allow]  # wildcards: bpftrace expands them into kprobe_multi links
        enter, leave = "kprobe", "kretprobe"
    else:
        targets = list(names)
        enter, leave = ("kfunc", "kretfunc") if mode == "fentry" else ("kprobe", "kretprobe")
    if not kstack:
        return "\n".join([
            'BEGIN { printf("READY\\n"); }',
            ",\n".join(f"{enter}:{t}" for t in targets) + " { @t[tid] = nsecs; }",
            ",\n".join(f"{leave}:{t}" for t in targets) + " { @t[tid] = nsecs - @t[tid]; }",
            "END { clear(@t); }",
            ""])
    # kretprobe: retval is the raw register, and its low 32 bits hold an int's errno as they do a long's or
    # an ERR_PTR's. kretfunc: retval is typed, so only functions returning a signed int are checked (the
    # workload's errors are ints; int_retval above); void ones have no retval at all.
    checked = targets if leave == "kretprobe" or int_ret is None else [t for t in targets if int_ret(t)]
    checked_set = set(checked)
    unchecked = [t for t in targets if t not in checked_set]
    exit_ = "@t[tid] = nsecs - @t[tid]; @d[tid] = @d[tid] - 1;"
    done = "if (@d[tid] <= 0) { @e[tid] = 0; }"
    take = "if ((int32)retval < 0 && (int32)retval >= -4095 && @e[tid] == 0) { @k[tid] = kstack; @e[tid] = 1; }"
    lines = ['BEGIN { printf("READY\\n"); }',
             ",\n".join(f"{enter}:{t}" for t in targets) + " { @t[tid] = nsecs; @d[tid] = @d[tid] + 1; }"]
    if checked and leave == "kretfunc":  # one block each: bpftrace wants one retval type per block that reads it
        lines += [f"{leave}:{t} {{ {exit_} {take} {done} }}" for t in checked]
    elif checked:
        lines.append(",\n".join(f"{leave}:{t}" for t in checked) + f" {{ {exit_} {take} {done} }}")
    if unchecked:
        lines.append(",\n".join(f"{leave}:{t}" for t in unchecked) + f" {{ {exit_} {done} }}")
    return "\n".join([*lines, "END { clear(@t); clear(@d); clear(@e); clear(@k); }", ""])


# retsnoop as a peer (bench/peer_compare.py's docstring: --peers retsnoop)
RETSNOOP_ENV = "RETSNOOP_BIN"
RETSNOOP_FLAGS = {"kprobe": "-K", "kprobe_multi": "-M", "fentry": "-F"}
RETSNOOP_HOWTO = (
    "upstream retsnoop is not part of this repository: build v0.11 by hand outside it (README, \"Compared with "
    "retsnoop\": its source and the libbpf and bpftool commits it pins, a stub in place of its Rust addr2line "
    f"sidecar) and give the binary with --retsnoop-bin PATH or {RETSNOOP_ENV}=PATH; it runs with -sn")
FOUND_FUNC_RS = re.compile(r"^Found function '([^' ]+)(?: \[[^]]+\])?' at address")  # retsnoop -vvv


def retsnoop_bin(given: Path | str | None, environ: Mapping[str, str] | None = None) -> Path:
    """The retsnoop binary from --retsnoop-bin or RETSNOOP_BIN; ValueError saying how to get one otherwise."""
    environ = os.environ if environ is None else environ
    path = given or environ.get(RETSNOOP_ENV)
    if not path:
        raise ValueError(RETSNOOP_HOWTO)
    path = Path(path)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"{path} is not an executable file: {RETSNOOP_HOWTO}")
    return path


def retsnoop_command(binary: Path, mode: str, entry: Sequence[str], allow: Sequence[str], deny: Sequence[str] = (),
                     verbosity: int = 1, dry_run: bool = False) -> list[str]:
    """retsnoop in its attach mode nearest to our `mode`, stack capture (its default), no DWARF symbolization
    (-sn: the stub sidecar is never run; ours has no DWARF vmlinux in the VM either)."""
    globs = ([x for g in entry for x in ("-e", g)] + [x for g in allow for x in ("-a", g)]
             + [x for g in deny for x in ("-d", g)])
    return [str(binary), "-" + "v" * verbosity, RETSNOOP_FLAGS[NEAREST[mode]], "-sn",
            *(["--dry-run"] if dry_run else []), *globs]


def parse_retsnoop_dry_run(text: str) -> set[str]:
    """The function names a `retsnoop --dry-run -vvv` would attach (module instances by their name)."""
    return {m.group(1) for line in text.splitlines() if (m := FOUND_FUNC_RS.match(line))}


def retsnoop_functions(binary: Path, mode: str, entry: Sequence[str], allow: Sequence[str],
                       deny: Sequence[str] = ()) -> set[str]:
    res = subprocess.run(retsnoop_command(binary, mode, entry, allow, deny, verbosity=3, dry_run=True),
                         capture_output=True, text=True, errors="replace", timeout=900, preexec_fn=roomy_nofile)
    names = parse_retsnoop_dry_run(res.stdout)
    if res.returncode != 0 or not names:
        tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"retsnoop --dry-run {NEAREST[mode]}: exit {res.returncode}, {len(names)} functions: {tail}")
    return names


@dataclass
class SameSet:
    """One function set for every tool: the names both we and retsnoop would attach from the same globs. Each
    tool also gets, as deny globs, the names that only it would have taken (our deny list covers the helpers of
    our programs, retsnoop's its own few, and each leaves out some names the other keeps)."""
    names: list[str]
    ours_deny: list[str]
    retsnoop_deny: list[str]

    @classmethod
    def of(cls, ours: Iterable[str], retsnoop: Iterable[str] | None, deny: Sequence[str] = ()) -> SameSet:
        mine = set(ours)
        theirs = mine if retsnoop is None else set(retsnoop)
        return cls(sorted(mine & theirs), [*deny, *sorted(mine - theirs)], [*deny, *sorted(theirs - mine)])

    def narrowed(self, keep: Iterable[str]) -> SameSet:
        """The set without what one tool could not attach after all (fentry: variadic functions): the others
        are told to deny those too."""
        keep = set(keep)
        drop = sorted(n for n in self.names if n not in keep)
        return SameSet([n for n in self.names if n in keep], [*self.ours_deny, *drop], [*self.retsnoop_deny, *drop])


def peer_run_key(tool: str, mode: str, same: SameSet) -> tuple:
    """What a peer's run depends on in this mode of ours: runs with equal keys are the same run (bpftrace gets
    globs in the multi modes, so there neither the names nor the deny list change what it attaches)."""
    globs = tool in PEERS and NEAREST[mode] == "kprobe_multi"
    deny = () if tool in PEERS else tuple(same.retsnoop_deny if tool == RETSNOOP else same.ours_deny)
    return tool, NEAREST[mode], () if globs else tuple(same.names), deny


def same_names(set_name: str, mode: str, deny: Sequence[str], rs_bin: Path | None,
               rs_sets: dict[tuple[str, str], set[str]]) -> SameSet:
    """The set's names for every tool in this mode of ours (rs_sets: retsnoop's dry runs so far, by set and mode)."""
    entry, allow = SETS[set_name]
    mine = [n for n in our_functions(entry, allow, mode) if not any(fnmatch(n, g) for g in deny)]
    theirs = None
    if rs_bin is not None:
        key = (set_name, NEAREST[mode])
        if key not in rs_sets:
            try:
                rs_sets[key] = retsnoop_functions(rs_bin, mode, entry, allow, deny)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # its own run will fail and say why
                print(json.dumps({"set": set_name, "mode": mode, "retsnoop_dry_run": str(exc)}), flush=True)
                rs_sets[key] = set()
        theirs = rs_sets[key] or None
    return SameSet.of(mine, theirs, deny)


# ours with another build of retsnoop.bpf.c (--base-object): argv[1] is the object, the rest the command line, run
# by the command's own main() with the object passed through the runtime's injection point (RuntimeDeps)
BASE_LAUNCH = ("import sys; from pathlib import Path; from retsnoop_otel.cli import main; "
               "from retsnoop_otel.runtime.deps import RuntimeDeps; "
               "from retsnoop_otel.runtime.probe_set import tracer_factory; obj = Path(sys.argv.pop(1)); "
               "sys.exit(main(sys.argv[1:], deps=RuntimeDeps(tracer_factory=tracer_factory(obj))))")


def our_flag(mode: str) -> str:
    """Our trace command's flag for an attach mode, from its own parser (modes added later included)."""
    if mode in FLAGS:
        return FLAGS[mode]
    from retsnoop_otel.trace.flags import build_parser
    for d in build_parser().declared:
        if d.action.dest == "attach_mode" and d.action.const == mode:
            return d.action.option_strings[-1]
    raise ValueError(f"retsnoop-otel trace has no flag for attach mode {mode}")


def start_command(tool: str, mode: str, entry: Sequence[str], allow: Sequence[str], program: Path,
                  base_object: Path | None = None, deny: Sequence[str] = (), retsnoop: Path | None = None,
                  python: str = sys.executable) -> list[str]:
    """The command line of one start; ours runs under `python` (by default the bench's own interpreter)."""
    if tool in PEERS:
        return ["bpftrace", "-B", "none", str(program)]
    if tool == RETSNOOP:
        assert retsnoop is not None, "--retsnoop-bin"
        return retsnoop_command(retsnoop, mode, entry, allow, deny)
    by_object = tool == "ours-base" and base_object is not None and not base_object.is_dir()
    launch = ["-c", BASE_LAUNCH, str(base_object)] if by_object else ["-m", "retsnoop_otel"]
    return [python, *launch, "trace", "-v", our_flag(mode), *trace_argv(entry, allow, deny)]


def warm_up(tmp: Path, python: str = sys.executable) -> dict[str, dict[str, int]]:
    """Both tools once, untimed, so that neither pays for reading its files into the page cache; ours
    twice, with an empty kernel cache and then the one it filled (which every timed run of ours uses):
    returns the -v phases of both (cold, warm). (retsnoop's first run is its untimed --dry-run: retsnoop_functions.)"""
    if shutil.which("bpftrace"):
        subprocess.run(["bpftrace", "-e", "BEGIN { exit(); }"], capture_output=True, timeout=600)
    out = {}
    for label in ("cold", "warm"):
        res = subprocess.run([python, "-m", "retsnoop_otel", "trace", "-v", "-e", "*sys_bpf", "--dry-run"],
                             cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, RETSNOOP_OTEL_CACHE=str(tmp / "cache")))
        out[label] = {m.group(1): int(m.group(2)) for line in res.stderr.splitlines() if (m := PHASE_OURS.match(line))}
    return out


@dataclass
class Attached:
    """One tool running, with the ids of the programs it loaded."""
    tool: str
    proc: subprocess.Popen
    lines: Lines
    prog_ids: list[int] = field(default_factory=list)
    probes: int = 0


def attach(tool: str, mode: str, entry: list[str], allow: list[str], names: list[str], tmp: Path,
           facts: KernelFacts, timeout: float, deny: Sequence[str] = ()) -> Attached:
    program = tmp / f"{tool}_{mode}.bt"
    program.write_text(bpftrace_program(mode, entry, allow, names, tool == "bpftrace-kstack", facts.int_ret))
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(4 * len(names) + 64),
               BPFTRACE_MAX_BPF_PROGS=str(4 * len(names) + 64), RETSNOOP_OTEL_CACHE=str(tmp / "cache"))
    before = set(prog_stats())
    proc = subprocess.Popen(start_command(tool, mode, entry, allow, program, deny=deny), cwd=ROOT, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=roomy_nofile)
    lines = Lines(proc)
    if lines.wait_for(READY_BT if tool in PEERS else READY_OURS, timeout) is None:
        tail = " | ".join(lines.tail())
        detach(Attached(tool, proc, lines), timeout)
        raise RuntimeError(f"{tool} {mode} never ready: {tail}")
    got = Attached(tool, proc, lines, [i for i in prog_stats() if i not in before])
    if tool in PEERS and (found := lines.find(ATTACHING_BT)):
        got.probes = int(found[0][1].group(1))
    return got


def detach(a: Attached, timeout: float) -> None:
    stop(a.proc, signal.SIGINT if a.tool in PEERS else signal.SIGTERM, timeout)
    a.lines.join()


# ---- an agent under measurement: its CPU and its /metrics -----------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15 of stat(5)


def scrape(port: int) -> dict[str, float]:
    """Sample name{labels} -> value, Prometheus text format."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def growth(before: dict[str, float], after: dict[str, float], family: str) -> float:
    """How much the samples of one series name (all label sets summed) grew between two scrapes."""
    def total(sample: dict[str, float]) -> float:
        return sum(v for k, v in sample.items() if k.startswith(family + "{"))
    return total(after) - total(before)


def wait_healthy(proc: subprocess.Popen, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the agent exited with {proc.returncode} before attaching")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    raise RuntimeError(f"the agent did not answer /healthz within {timeout_s:.0f} s")


def settle_cpu(pid: int, quiet_rate: float = 0.05, window_s: float = 2.0, timeout_s: float = 120.0) -> float:
    """Wait until the agent uses less than `quiet_rate` CPU-seconds per second over a window (under
    emulation its start-up work goes on for a while after /healthz answers); returns the last rate."""
    deadline = time.monotonic() + timeout_s
    while True:
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(window_s)
        rate = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        if rate < quiet_rate or time.monotonic() > deadline:
            return rate


# ---- synthetic sessions, shaped like a busy call-mode probe set -----------------------------------

OFFSET = 1_700_000_000_000_000_000
_ERRNOS = [(1 << 64) - e for e in (1, 2, 12, 13, 22, 95)]
_KINDS = [RetKind.INT32, RetKind.INT32, RetKind.SIGNED, RetKind.POINTER, RetKind.BOOL, RetKind.VOID,
          RetKind.UNSIGNED]


def make_funcs(count: int = 120) -> dict[int, TracedFunc]:
    rng = random.Random(7)
    return {i: TracedFunc(i, f"kfunc_{i}_{'x' * rng.randrange(4, 20)}", 0xFFFFFFFF81000000 + 64 * i,
                          RetKind.SIGNED if i == 0 else rng.choice(_KINDS), i == 0,
                          module="xfs" if i % 17 == 5 else None) for i in range(count)}


def _result(rng: random.Random, kind: RetKind) -> int:
    roll = rng.random()
    if kind is RetKind.POINTER:
        if roll < 0.1:
            return rng.choice((0, *_ERRNOS))
        return 0xFFFF888800000000 + 64 * rng.randrange(1 << 20)  # distinct valid pointers
    if roll < 0.15 and kind in (RetKind.INT32, RetKind.SIGNED):
        return rng.choice(_ERRNOS)
    if roll < 0.7:
        return 0
    return rng.randrange(1, 4096)


def make_session(rng: random.Random, funcs: dict[int, TracedFunc], calls: int) -> Session:
    """One entry call with `calls` nested calls below it (up to 8 deep), results mixed, a few errors."""
    t = rng.randrange(1 << 40)
    start = t
    root = Call(0, 0, t)
    open_calls = [root]
    made = 0
    while made < calls:
        t += rng.randrange(50, 400)
        if len(open_calls) > 1 and (len(open_calls) >= 8 or rng.random() < 0.45):
            done = open_calls.pop()
            done.end_ns, done.result = t, _result(rng, funcs[done.func_id].ret)
            continue
        fid = rng.randrange(1, len(funcs))
        call = Call(fid, len(open_calls), t, missing_before=1 if rng.random() < 0.01 else 0)
        open_calls[-1].children.append(call)
        open_calls.append(call)
        made += 1
    while len(open_calls) > 1:
        t += rng.randrange(50, 400)
        done = open_calls.pop()
        done.end_ns, done.result = (t, _result(rng, funcs[done.func_id].ret)) if rng.random() > 0.02 else (None,
                                                                                                            None)
    t += 100
    err = rng.random() < 0.3
    root.end_ns, root.result = t, _ERRNOS[4] if err else 0
    return Session(tid=rng.randrange(1, 1 << 22), pid=rng.randrange(1, 1 << 22), comm="worker", proc_comm="app",
                   start_ns=start, end_ns=t, is_err=err, chain=[StackEntry(0, root.result, t - start)],
                   kstack=[0xFFFFFFFF81001000 + 16 * i for i in range(8)], calls=[root], cpu=rng.randrange(64))


def writer_location(pid: int, tries: int = 200) -> object:
    """Where a thread-context writer just started (tests/native/ctx_writer.c) keeps otel_thread_ctx_v1
    (appctx.thread_ctx.TlsLocation), once its executable is mapped."""
    from retsnoop_otel.appctx.thread_ctx import TlsLocator
    loc = None
    for _ in range(tries):
        try:
            loc = TlsLocator().locate(pid)
            break
        except Exception:  # noqa: BLE001 - not exec'ed yet
            time.sleep(0.01)
    assert loc is not None, "otel_thread_ctx_v1 not found in the writer"
    return loc


# ---- stand-in probe programs (bench/probe_variants.bpf.c): probe_cost and exit_only_floor ---------------------
BENCH_DIR = Path(__file__).resolve().parent
VARIANTS_SRC = BENCH_DIR / "probe_variants.bpf.c"
VARIANTS_OBJ = BENCH_DIR / "build" / "probe_variants.bpf.o"
VARIANTS = ("empty", "cookie", "funcip", "iphash", "tidhash", "ktime", "guard", "count")  # its k_/m_ programs


def build_variants() -> Path:
    """The stand-ins' object, built with clang when older than its source."""
    if VARIANTS_OBJ.exists() and VARIANTS_OBJ.stat().st_mtime >= VARIANTS_SRC.stat().st_mtime:
        return VARIANTS_OBJ
    VARIANTS_OBJ.parent.mkdir(exist_ok=True)
    arch = {"x86_64": "x86", "aarch64": "arm64"}[os.uname().machine]
    include = BENCH_DIR.parent / "build" / f"libbpf-{os.uname().machine}" / "include"  # our libbpf's (bpf/Makefile)
    subprocess.run(["clang", "-g", "-O2", "-target", "bpf", f"-D__TARGET_ARCH_{arch}", f"-I{include}",
                    "-Wall", "-Werror", "-c", str(VARIANTS_SRC), "-o", str(VARIANTS_OBJ)], check=True)
    return VARIANTS_OBJ

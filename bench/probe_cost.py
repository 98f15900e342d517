"""Where the per-call BPF cost goes, per attach mode and function-set size, measured side by side in one boot.

    tests/vm/run --kernel 6.12 -- python -m bench.probe_cost --sizes 100,1000 \
        --modes kprobe_multi,kprobe --variants empty,cookie,funcip,iphash,full

Each row attaches one program to the entry and the exit of the same function set (the BPF subsystem's
functions: entry `*sys_bpf`, then other `*bpf*` functions with BTF), runs the workload (--calls x
bpf(BPF_MAP_CREATE), failing with EINVAL by default, or creating and closing an array map with
--workload ok), and reports the kernel's own bpf_stats of that program (run_time_ns / run_cnt) per
probe run and per workload call, and the workload's wall time per call minus the same workload's
time with nothing attached (what the hook and the program together cost the traced thread).

Variants (bench/probe_variants.bpf.c, built into bench/build/ on first use; needs clang):
  empty    returns at once: the hook's program-dispatch cost only
  cookie   bpf_get_attach_cookie() (kprobe.multi: a binary search over the link's sorted addresses)
  funcip   bpf_get_func_ip()
  iphash   bpf_get_func_ip() and a hash lookup ip -> function id
  tidhash  a hash lookup by thread id (what finding the session costs)
  ktime    bpf_ktime_get_boot_ns()
  guard    a per-CPU array lookup (the recursion guard)
  full     retsnoop-otel's own programs (kernel/tracer.py), stack mode, as `trace` runs them (no metrics
           served: no per-function counts)
  counted  full, with the per-function and per-session counts that served metrics read (the agent)
  calls    retsnoop-otel's own programs with per-call records (mode: calls), the ring buffer drained
  nostack  full without the kernel stack at the error (what mode metrics runs, with the counts)
  norecord full without the session's ring-buffer record (no session is long enough: -L): the stack stays
  bare     neither stack nor record: the per-thread session bookkeeping alone, the plain peer's work
  full_app   full, with the application-context lookup that trace and agent do by default
  full_live  full_app, with the ring buffer read and decoded while the workload runs (another thread)
The function sets are the product's own discovery (`trace --dry-run`, bench/harness.py discovered). The programs are
attached below the product, by kernel/tracer.Tracer or libbpf directly: the variants are programs the product does
not have, and ours run here in configurations no flag asks for (our own process traced, since the workload runs in
it; no stack; no record), on an exact cut of the set (tests/test_layout.py allows this bench that, and says why).
Modes: kprobe, kprobe_multi, kprobe_session (one program for entry and exit; 6.10+), fentry, fsession (7.0+) and
fsession_multi (7.2+) (these three: full variants only).

--together A,B (each VARIANT[@BPF_O], a variant of our programs and optionally another build of them)
attaches both at once, in each attach order in turn, and splits the very same workload calls between them:
`--together full,full@OLD.bpf.o` compares a change with the build before it, `--together full,bare` says
what the stack and the record cost. Runs one after the other drift up to 2x under emulation; the ratio of
two programs attached together moved 3% when both were the same build.

--fentry-nested (6.12: needs kprobe.multi): which functions run our fentry programs more often than they
are called. Per function, the runs of its fentry clone against its calls counted by a kprobe.multi
program (kprobe-type programs never run inside BPF programs, so that count is the workload's own); the
excess are runs inside our own programs (their helpers), which the recursion guard discards.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import harness
from retsnoop_otel.kernel import bpfsys, features, libbpf_progs
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.attach_modes import NAMES as tracer_modes_
from retsnoop_otel.kernel.attach_modes import TRAMPOLINE as TRAMPOLINE_MODES
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.btf import ReturnKinds

ATTACH_KPROBE_SESSION = 56
TRACER_MODES = set(tracer_modes_)
# variants that run retsnoop-otel's own Tracer
FULL = ("full", "counted", "nostack", "norecord", "bare", "calls", "full_app", "full_live")


_libc = ctypes.CDLL(None, use_errno=True)


def workload(n: int, ok: bool) -> float:
    """n x bpf(BPF_MAP_CREATE) of an array map: max_entries 0 fails with EINVAL; ok creates (and closes) it."""
    attr = (ctypes.c_uint32 * 30)(2, 4, 4, 1 if ok else 0)
    size = ctypes.sizeof(attr)
    syscall, close = _libc.syscall, os.close
    t0 = time.perf_counter()
    for _ in range(n):
        fd = syscall(321, 0, attr, size)
        if fd >= 0:
            close(fd)
    return time.perf_counter() - t0


# --set: this bench's own set, or bench/peer_compare.py's `--sets 1000` (what trace attaches there), so that a
# gap seen there can be taken apart here, with the same programs and without the CLI around them;
# wide: over 10,000 vmlinux functions with BTF, of subsystems this benchmark leaves idle (none on the scheduler,
# memory or cgroup paths), found as a trampoline mode finds them (one instance per name, no modules), so that every
# mode attaches the very same functions
WIDE = ["*bpf*", "btf_*", "acpi_*", "pci_*", "xfrm*", "netlink_*", "genl*", "rtnl_*", "ethtool_*",
        "crypto_*", "device_*", "driver_*", "bus_*", "class_*", "firmware_*", "efi_*", "iommu_*", "msi_*",
        "audit_*", "key*", "tcp_*", "udp*", "inet*", "ip6*", "ipv6_*", "ip_*", "neigh*", "fib*", "sk_*",
        "sock_*", "skb_*", "dev_*", "net*", "nf_*", "ZSTD_*", "zstd_*", "thermal_*", "rtc_*", "tty_*",
        "n_tty_*", "serial8250_*", "uart_*", "input_*", "cpufreq_*", "mce_*", "pnp_*", "dmi_*", "mpi_*",
        "x509_*", "pkcs7_*", "public_key_*", "zlib_*", "xz_dec_*", "blk_*", "bio_*", "elv_*", "disk_*",
        "bdev_*", "hugetlb_*", "vt_*", "con_*", "fbcon_*", "vc_*", "kbd_*", "inotify_*", "fanotify_*",
        "io_uring_*", "seccomp_*", "landlock_*", "ima_*", "evm_*", "integrity_*", "sysrq_*", "kexec_*"]
SETS = {"bpf": (["*sys_bpf"], ["*bpf*"]), "peer": harness.SETS["1000"],
        "wide": (["*sys_bpf"], WIDE)}
SET_DISCOVERY = {"wide": "fentry"}  # the mode a set is discovered in, whatever mode attaches it


def pick(size: int, mode: str, set_name: str = "bpf") -> list:
    """The set's first `size` functions (its entries first) as `trace --dry-run` finds them (bench/harness.py
    discovered: the product's own discovery)."""
    entry, allow = SETS[set_name]
    disc, btf_id = harness.discovered(harness.trace_argv(entry, allow, mode=SET_DISCOVERY.get(set_name, mode)))
    entries = [f for f in disc.funcs if f.is_entry]
    # the peer set is what trace attaches: functions without BTF too, outside the trampoline modes
    btf_optional = set_name == "peer" and mode not in TRAMPOLINE_MODES
    others = [f for f in disc.funcs if not f.is_entry and (btf_optional or btf_id is not None and btf_id(f.name))]
    others = others[: max(0, size - len(entries))]
    return [f._replace(id=i) for i, f in enumerate(entries + others)]


def session_link(prog_fd: int, funcs: list) -> lb.Link:
    return lb.Link(fd=bpfsys.link_create_kprobe_multi(prog_fd, addrs=[f.addr for f in funcs],
                                                      cookies=[f.id for f in funcs],
                                                      attach_type=ATTACH_KPROBE_SESSION))


class VariantRun:
    """One variant program attached to the entry and exit of every function of the set."""

    def __init__(self, mode: str, variant: str, funcs: list) -> None:
        self.obj = lb.BpfObject.open_file(str(harness.build_variants()))
        self.name = ("k_" if mode == "kprobe" else "m_") + variant
        for prefix in ("k_", "m_"):
            for v in harness.VARIANTS:
                self.obj.program(prefix + v).set_autoload(prefix + v == self.name)
        prog = self.obj.program(self.name)
        if mode == "kprobe_session":
            prog.set_expected_attach_type(ATTACH_KPROBE_SESSION)
        self.obj.load()
        ids = self.obj.map("ip_ids")
        for f in funcs:
            ids.update(struct.pack("<Q", f.addr), struct.pack("<I", f.id))
        self.links: list[lb.Link] = []
        t0 = time.monotonic()
        try:
            self._attach(mode, prog, funcs)
        except BaseException:
            self.close()
            raise
        self.attach_s = time.monotonic() - t0
        self.fds = [prog.fd]

    def _attach(self, mode: str, prog: lb.BpfProgram, funcs: list) -> None:
        if mode == "kprobe":
            for f in funcs:  # as the tracer does, a function the kernel refuses is skipped
                try:
                    self.links.append(prog.attach_kprobe(f.name, retprobe=True, cookie=f.id))
                except lb.LibbpfError:
                    continue
                self.links.append(prog.attach_kprobe(f.name, cookie=f.id))
        elif mode == "kprobe_multi":
            addrs, cookies = [f.addr for f in funcs], [f.id for f in funcs]
            self.links.append(prog.attach_kprobe_multi(addrs=addrs, cookies=cookies, retprobe=True))
            self.links.append(prog.attach_kprobe_multi(addrs=addrs, cookies=cookies))
        elif mode == "kprobe_multi_entry":  # entries only (the count variant)
            self.links.append(prog.attach_kprobe_multi(addrs=[f.addr for f in funcs]))
        else:
            self.links.append(session_link(prog.fd, funcs))

    def counts(self, funcs: list) -> dict[str, int]:
        m = self.obj.map("hits")
        return {f.name: struct.unpack("<Q", m.lookup(struct.pack("<I", f.id)) or bytes(8))[0] for f in funcs}

    def close(self) -> None:
        for link in self.links:
            link.destroy()
        self.obj.close()


class FullRun:
    """retsnoop-otel's own Tracer on the set."""

    def __init__(self, mode: str, funcs: list, btf_func_id, variant: str, obj: Path | None = None,
                 drained: bool = False) -> None:
        # exclude_self off: the workload runs in this process, and the sessions are what is measured
        cfg = CaptureConfig(mode=mode, emit_calls=variant == "calls", exclude_self=False,
                            app_context=variant in ("full_app", "full_live"),
                            kernel_stack=variant not in ("nostack", "bare"),
                            min_duration_ns=2**63 if variant in ("norecord", "bare") else 0,
                            func_counts=variant in ("counted", "nostack"))
        # obj: another build of retsnoop.bpf.c (--base-object), side by side with this one
        self.tracer = Tracer(funcs, cfg, btf_func_id=btf_func_id, object_path=obj)
        self.tracer.load()
        t0 = time.monotonic()
        self.tracer.attach()
        self.attach_s = time.monotonic() - t0
        self.fds = [fd for _name, fd in self.tracer.programs()]
        self.records = 0
        self._stop = threading.Event()
        self._live: threading.Thread | None = None
        if variant in ("calls", "full_live") or drained:
            def count(_rec) -> None:
                self.records += 1
            self.tracer.open_ring_buffer(count)
        if variant == "full_live":  # decoded while the workload runs, on another CPU, as trace and agent do
            self._live = threading.Thread(target=self._consume, daemon=True)
            self._live.start()

    def _consume(self) -> None:
        while not self._stop.is_set():
            self.tracer.poll(10)

    def drain(self) -> None:
        self._stop.set()
        if self._live is not None:
            self._live.join()
        if self.tracer._rb is not None:
            while self.tracer.poll(0) > 0:
                pass

    def close(self) -> None:
        self.drain()
        self.tracer.close()


def fentry_nested(funcs: list, btf_func_id, calls: int, ok: bool) -> None:
    """Per function: fentry clone runs (entry side) against its calls; prints the functions with an excess."""
    by_btf = {btf_func_id(f.name): f.name for f in funcs}
    # exclude_self off: the workload runs in this process, and what runs inside its sessions is the question
    tracer = Tracer(funcs, CaptureConfig(mode="fentry", exclude_self=False), btf_func_id=btf_func_id)
    tracer.load()
    try:
        report = tracer.attach()
        fds = tracer.programs()
        # reading the counters is a bpf() call per clone, traced like the workload's: measure what one
        # round of reads adds (two rounds back to back) and take it off
        first = {fd: harness.prog_info_btf(fd).run_cnt for _name, fd in fds}
        before = {fd: harness.prog_info_btf(fd).run_cnt for _name, fd in fds}
        workload(calls, ok)
        runs: dict[str, int] = {}
        entry_runs: dict[str, int] = {}
        for name, fd in fds:
            info = harness.prog_info_btf(fd)
            fname = by_btf.get(info.attach_btf_id, "?")
            n = info.run_cnt - before[fd] - (before[fd] - first[fd])
            runs[fname] = runs.get(fname, 0) + n
            if name in ("fentry_entry", "fentry_inner"):
                entry_runs[fname] = n
    finally:
        tracer.close()
    attached = [f for f in funcs if f in report.attached]
    counter = VariantRun("kprobe_multi_entry", "count", attached)
    try:
        workload(calls, ok)
        real = counter.counts(attached)
    finally:
        counter.close()
    excess = sorted(((entry_runs.get(n, 0) - real[n], n) for n in real if entry_runs.get(n, 0) > real[n]),
                    reverse=True)
    print(f"\nfentry, {len(attached)} functions: {sum(runs.values())} probe runs for {2 * sum(real.values())} "
          f"entries and exits of traced calls; runs inside our programs by function (entry runs - calls):")
    for n, name in excess[:40]:
        print(f"  {name:<40}{n:>9}  ({entry_runs[name]} runs, {real[name]} calls)")


def stats(fds: list[int]) -> tuple[int, int, int]:
    """Run time, runs, and recursion misses: the hook fired inside a BPF program (often ours) and skipped it."""
    ns = cnt = missed = 0
    for fd in fds:
        info = libbpf_progs.prog_info(fd)
        ns += info.run_time_ns
        cnt += info.run_cnt
        missed += info.recursion_misses
    return ns, cnt, missed


def around(fd_sets: list[list[int]], action):
    """action()'s result, and the run time, runs and recursion misses of each set of programs over it.

    A stats read is a bpf() call per program, traced like the workload's (fentry: ~2,000 clones): two
    reads back to back say what one read adds, and that is taken off."""
    first = [stats(fds) for fds in fd_sets]
    before = [stats(fds) for fds in fd_sets]
    result = action()
    after = [stats(fds) for fds in fd_sets]
    return result, [(a[0] - b[0] - (b[0] - f[0]), a[1] - b[1] - (b[1] - f[1]), a[2] - b[2])
                    for f, b, a in zip(first, before, after, strict=True)]


def measure(run, calls: int, work, base_us: float) -> dict:
    def work_then_drain() -> float:
        wall = work(calls)
        if isinstance(run, FullRun):
            run.drain()
        return wall

    wall, [(ns, runs, missed)] = around([run.fds], work_then_drain)
    return {"attach_s": round(run.attach_s, 2), "probe_runs": runs,
            "ns_per_run": round(ns / runs) if runs else None,
            "bpf_ns_per_call": round(ns / calls),
            "missed_per_call": round(missed / calls, 2),
            "wall_us_per_call": round(wall / calls * 1e6, 1),
            "added_us_per_call": round(wall / calls * 1e6 - base_us, 1)}


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """VARIANT[@BPF_O]: one of the FULL variants, run with this checkout's object or the one given."""
    variant, _, obj = spec.partition("@")
    if variant not in FULL or variant == "full_live":  # full_live reads in its own thread until closed
        raise ValueError(f"--together takes variants of retsnoop-otel's own programs, not {variant!r}")
    return variant, Path(obj) if obj else None


def together(mode: str, funcs: list, btf_func_id, specs: tuple[str, str], calls: int, work,
             rounds: int) -> list[dict]:
    """Two runs of our programs attached at once (variants, or builds), each attach order in turn: every
    workload call runs both, so the kernel's run time per program splits the very same calls between them,
    and the guest's drift between rounds (up to 2x under emulation) falls on both alike."""
    rows = []
    for order in ("this-first", "other-first"):
        runs: list[FullRun] = []
        try:
            for spec in (specs if order == "this-first" else specs[::-1]):
                variant, obj = parse_spec(spec)
                runs.append(FullRun(mode, funcs, btf_func_id, variant, obj, drained=True))
            this, other = runs if order == "this-first" else runs[::-1]
            for rnd in range(1, rounds + 1):
                _, [(ns, cnt, _), (other_ns, other_cnt, _)] = around([this.fds, other.fds], lambda: work(calls))
                for r in (this, other):
                    r.drain()  # outside the counted calls: the next round starts with an empty ring buffer
                row = {"mode": mode, "size": len(funcs), "variant": " vs ".join(specs), "order": order, "round": rnd,
                       "bpf_ns_per_call": round(ns / calls), "other_bpf_ns_per_call": round(other_ns / calls),
                       "probe_runs": cnt, "other_probe_runs": other_cnt,
                       "ratio": round(ns / other_ns, 3) if other_ns else None}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            for r in runs:
                r.close()
    return rows


def together_table(rows: list[dict]) -> str:
    """Per mode, size and pair: medians of both, and the ratio's geometric mean over both attach orders, which
    cancels what being attached first does to a program's run time (the same build twice, 6.12 under
    emulation: 1.2x dearer first in the kprobe modes, 0.65x in fentry)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["size"], r["variant"]), []).append(r)
    lines = ["the first / the second, BPF ns per workload call, --repeat rounds in each attach order",
             f"{'mode':<15}{'funcs':>6} {'first vs second':<40}{'BPF ns/call':>12}{'second':>10}  ratio by round"]
    for (mode, size, variant), group in groups.items():
        ratios = [r["ratio"] for r in group if r["ratio"]]
        lines.append(f"{mode:<15}{size:>6} {variant:<40}"
                     f"{statistics.median(r['bpf_ns_per_call'] for r in group):>12.0f}"
                     f"{statistics.median(r['other_bpf_ns_per_call'] for r in group):>10.0f}  "
                     f"{statistics.geometric_mean(ratios):.2f}x: {', '.join(f'{x:.2f}' for x in ratios)}")
    return "\n".join(lines)


def _median(values: list) -> float | None:
    if not values:
        return None
    m = statistics.median(values)
    return round(m) if all(isinstance(v, int) for v in values) else round(m, 2)


def medians(rows: list[dict]) -> list[dict]:
    """One row per (mode, size, variant): the median of each figure over its rounds, in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["size"], r.get("variant")), []).append(r)
    out = []
    for group in groups.values():
        if "note" in group[0]:
            out.append(group[0])
            continue
        out.append({k: (_median([x[k] for x in group if x[k] is not None])
                        if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                    for k, v in group[0].items()})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000")
    ap.add_argument("--modes", default="kprobe_multi,kprobe")
    ap.add_argument("--variants", default="empty,cookie,full")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--workload", choices=("fail", "ok"), default="fail")
    ap.add_argument("--external", action="store_true", help="run the workload as another process (bench/"
                    "peer_compare.py's C loop, failing calls only), as trace and the agent see it")
    ap.add_argument("--set", choices=sorted(SETS), default="bpf", help="bpf: entry *sys_bpf, then other *bpf* "
                    "functions with BTF (default); peer: bench/peer_compare.py's --sets 1000 globs; wide: over 10,000 "
                    "vmlinux functions with BTF, the same for every mode")
    ap.add_argument("--build-only", action="store_true", help="build the variant object (on the host) and stop")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the variants; the table shows medians")
    ap.add_argument("--base-object", type=Path, metavar="BPF_O", help="also run the full variants with this "
                    "build of retsnoop.bpf.c (rows '<variant>-base'), to compare a change side by side")
    ap.add_argument("--together", metavar="SPEC,SPEC", help="attach two runs of our programs at once and split "
                    "the same calls between them (--repeat rounds per attach order); SPEC: VARIANT[@BPF_O], e.g. "
                    "full,full@bench/build/base.bpf.o (two builds) or full,bare (two configurations)")
    ap.add_argument("--fentry-nested", type=int, metavar="SIZE", help="only the fentry self-firing analysis")
    args = ap.parse_args()
    if args.together:
        try:
            specs = tuple(args.together.split(","))
            if len(specs) != 2:
                raise ValueError("--together takes two specs, comma-separated")
            for spec in specs:
                parse_spec(spec)
        except ValueError as exc:
            ap.error(str(exc))
    harness.build_variants()
    if args.build_only:
        return 0
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # kprobe mode: two links per function
    ok = args.workload == "ok"
    if args.external and ok:
        ap.error("--external runs failing calls only (bench/peer_compare.py's workload)")
    feats = features.detect()
    btf = Btf.load_vmlinux()
    ret_kinds = ReturnKinds(btf)
    old = harness.BPF_STATS.read_text().strip()
    harness.BPF_STATS.write_text("1")
    rows = []
    if args.fentry_nested:
        try:
            fentry_nested(pick(args.fentry_nested, "fentry"), ret_kinds.func_id,
                          args.calls, ok)
        finally:
            harness.BPF_STATS.write_text(old)
            btf.free()
        return 0
    if args.external:
        cmd = harness.build_workload(Path(tempfile.mkdtemp(prefix="probe_cost-")))

        def work(n: int) -> float:
            return harness.run_workload(cmd, n) * n / 1e9
    else:
        def work(n: int) -> float:
            return workload(n, ok)
    try:
        work(200)  # warm up
        base_us = min(work(args.calls) for _ in range(3)) / args.calls * 1e6
        print(json.dumps({"baseline_us_per_call": round(base_us, 1)}), flush=True)
        for size in (int(s) for s in args.sizes.split(",")):
            for mode in args.modes.split(","):
                try:
                    features.require_tracing(feats, mode)
                except features.FeatureError:
                    rows.append({"mode": mode, "size": size, "note": "not supported by this kernel"})
                    continue
                funcs = pick(size, mode, args.set)
                if args.together:
                    rows += together(mode, funcs, ret_kinds.func_id, specs, args.calls, work, args.repeat)
                    continue
                variants = args.variants.split(",")
                if args.base_object:
                    variants = [w for v in variants for w in ((v, f"{v}-base") if v in FULL else (v,))]
                for variant in variants * args.repeat:  # rounds interleaved: drifts hit every variant alike
                    kind = variant.removesuffix("-base")
                    if mode in TRAMPOLINE_MODES and kind not in FULL:
                        continue
                    if kind in FULL and mode not in TRACER_MODES:
                        continue
                    t0 = time.monotonic()
                    try:
                        run = (FullRun(mode, funcs, ret_kinds.func_id, kind,
                                       args.base_object if variant.endswith("-base") else None)
                               if kind in FULL else VariantRun(mode, variant, funcs))
                    except (OSError, lb.LibbpfError) as exc:
                        rows.append({"mode": mode, "size": size, "variant": variant, "note": str(exc)[:200]})
                        print(json.dumps(rows[-1]), flush=True)
                        continue
                    try:
                        row = {"mode": mode, "size": len(funcs), "variant": variant,
                               **measure(run, args.calls, work, base_us)}
                    finally:
                        t1 = time.monotonic()
                        run.close()
                        detach_s = time.monotonic() - t1
                    row["detach_s"] = round(detach_s, 2)
                    row["total_s"] = round(time.monotonic() - t0, 1)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        harness.BPF_STATS.write_text(old)
        btf.free()
    print(f"\nkernel {os.uname().release}; workload: {args.calls} x bpf(BPF_MAP_CREATE) "
          f"({'create + close' if ok else 'failing, EINVAL'}); nothing attached: {base_us:.1f} us per call")
    if args.together:
        print(together_table(rows))
        return 0
    print(f"{'mode':<15}{'funcs':>6} {'variant':<15}{'probe runs':>11}{'ns/run':>8}{'BPF ns/call':>12}"
          f"{'+us/call':>10}{'attach s':>9}{'detach s':>9}{'missed/call':>12}")
    for r in medians(rows) if args.repeat > 1 else rows:
        if "note" in r:
            print(f"{r['mode']:<15}{r['size']:>6} {r.get('variant', ''):<15} {r['note']}")
            continue
        print(f"{r['mode']:<15}{r['size']:>6} {r['variant']:<15}{r['probe_runs']:>11}{r['ns_per_run'] or '-':>8}"
              f"{r['bpf_ns_per_call']:>12}{r['added_us_per_call']:>10}{r['attach_s']:>9}{r['detach_s']:>9}"
              f"{r.get('missed_per_call', '-'):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the Prometheus metrics cost: scrape time for 1,000 traced functions, and agent CPU per traced call.

(a) Scrape time (default mode; runs anywhere, no tracing needed):

    .venv/bin/python -m bench.metrics_cost [--funcs 1000] [--buckets 40] [--runs 21] [--kernel-maps]

The runtime's kernel-families collector over synthetic stats for --funcs functions (every third one with one to five
error types, --buckets log2 duration buckets, 10 entry functions with exemplars in four buckets, two
BPF programs with bpf_stats) is rendered with prometheus_client's generate_latest, in the Prometheus
text format and in OpenMetrics; the table gives the median of --runs scrapes, the series count and
the body size. This is the user-space formatting cost of one scrape. --kernel-maps adds the real
map reads: the BPF object is loaded into the running kernel sized for --funcs functions (nothing is
attached, so any kernel that loads BPF programs will do; root needed), its maps are filled with the
same numbers from user space, and whole scrapes (per-CPU map lookups + formatting) are timed.

(b) Agent CPU per traced call, metrics only (--agent-cpu; needs a kernel that allows tracing):

    tests/vm/run --kernel 6.12 -- python -m bench.metrics_cost --agent-cpu

How the claim "with metrics only, the user-space cost per traced call is zero" is measured:
1. The agent runs as its own process (`python -m retsnoop_otel agent --config TMP`) with one probe
   set (entry *sys_bpf; allow array_map_alloc_check, map_create) configured so that nothing but
   metrics leaves the kernel: `mode: metrics` and `exporter: {otlp: null}`. The kernel still counts
   every call and session in its
   per-CPU maps, but drops each session before the ring buffer, so no record, session or trace
   ever reaches user space. The scrape shows it: retsnoop_sessions_reported_total stays 0.
2. The agent's CPU time is utime + stime from /proc/<agent pid>/stat (what the agent sees as
   /proc/self/stat: all its threads), read before and after each workload run.
3. The workload is `python -m retsnoop_otel simfail bpf-bad-map-max-entries-array --repeat N
   --delay-ms D` (one failing bpf(BPF_MAP_CREATE) per repetition: an error session through the
   traced functions) at two call rates (--delays, the same N calls each).
4. The agent's idle CPU rate (capture loop waking every 100 ms, no workload) is measured first over
   --idle-s seconds; "net" subtracts idle rate x wall time. The claim holds when the net agent CPU
   per 1,000 calls is about zero at both rates (within clock-tick resolution, 10 ms), i.e. the
   agent's CPU does not grow with the call count; retsnoop_sessions_total confirms the calls were
   traced. --control repeats the runs with mode: stack (every error session goes to user
   space and is rendered to the console), showing the per-call cost the metrics-only setup avoids.
   With kernel.bpf_stats_enabled switched on for the run (restored afterwards), the kernel-side cost
   per call comes from retsnoop_bpf_program_run_seconds_total / retsnoop_sessions_total.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import CollectorRegistry

from bench.harness import (
    ROOT,
    bpf_stats_enabled,
    cpu_seconds,
    free_port,
    growth,
    scrape,
    settle_cpu,
    stop,
    wait_healthy,
)
from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import (
    CaptureStats,
    FuncStats,
    ProgramStats,
    RetKind,
    SessionStats,
    TracedFunc,
)
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.metrics.exemplars import ExemplarStore
from retsnoop_otel.metrics.kernel_families import KernelCollector

ERRNOS = {"EINVAL": 22, "ENOMEM": 12, "EPERM": 1, "ENOENT": 2, "EFAULT": 14, "E2BIG": 7}
ENTRY_FUNCS = 10
SIMFAIL_CASE = "bpf-bad-map-max-entries-array"


# ---- (a) scrape time ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Synthetic kernel aggregates for one probe set, shaped like a busy real one."""

    funcs: list[TracedFunc]
    func_stats: list[FuncStats]
    session_stats: list[SessionStats]
    program_stats: list[ProgramStats]
    exemplars: ExemplarStore


def _histogram(rng: random.Random, calls: int, nbuckets: int) -> tuple[int, ...]:
    """Calls spread over about ten neighbouring log2 buckets (hundreds of ns to a few ms)."""
    out = [0] * nbuckets
    centre = rng.randint(8, 18)
    for _ in range(min(calls, 200)):
        out[min(nbuckets - 1, max(0, int(rng.gauss(centre, 2))))] += max(1, calls // 200)
    return tuple(out)


def synthetic(nfuncs: int, nbuckets: int, seed: int = 1) -> Workload:
    rng = random.Random(seed)
    funcs = [TracedFunc(i, f"kfunc_{i:04d}", 0xFFFFFFFF81000000 + 16 * i, RetKind.INT32, i < ENTRY_FUNCS)
             for i in range(nfuncs)]
    stats = []
    for f in funcs:
        calls = rng.randint(1, 1_000_000)
        errs = {} if f.id % 3 else {e: rng.randint(1, calls) for e in rng.sample(sorted(ERRNOS), rng.randint(1, 5))}
        stats.append(FuncStats(f.id, calls, errs, _histogram(rng, calls, nbuckets), calls * 900))
    sessions = []
    store = ExemplarStore(buckets=nbuckets)
    for f in funcs[:ENTRY_FUNCS]:
        n = rng.randint(1000, 100_000)
        sessions.append(SessionStats(f.id, n, n // 10, _histogram(rng, n, nbuckets), n * 20_000))
        for b in rng.sample(range(8, 20), 4):
            store.record("bench", f.name, 2**b + 1, rng.getrandbits(128), 1_700_000_000_000_000_000)
    progs = [ProgramStats("kmulti_entry", 10**9, 10**12), ProgramStats("kmulti_exit", 10**9, 8 * 10**11)]
    return Workload(funcs, stats, sessions, progs, store)


@dataclass
class BenchProbeSet:
    """One probe set as the collector reads it (runtime.probe_set.ProbeSet's face), over given readers."""

    funcs: dict[int, TracedFunc]
    func_stats: Callable[[], list[FuncStats]]
    session_stats: Callable[[], list[SessionStats]]
    capture_stats: Callable[[], CaptureStats]
    program_stats: Callable[[], list[ProgramStats]]
    name: str = "bench"
    mode: str = "kprobe_multi"
    attached: int = 0
    sampled_out: int = 0
    filtered_out: int = 0
    evicted: int = 0
    workload_label: str | None = None  # no per-workload series in this bench

    def workload_totals(self) -> list:
        return []


def collector(w: Workload, func_stats: Callable[[], list[FuncStats]] | None = None,
              session_stats: Callable[[], list[SessionStats]] | None = None,
              capture_stats: Callable[[], CaptureStats] = CaptureStats) -> KernelCollector:
    ps = BenchProbeSet({f.id: f for f in w.funcs}, func_stats or (lambda: w.func_stats),
                       session_stats or (lambda: w.session_stats), capture_stats, lambda: w.program_stats,
                       attached=len(w.funcs))
    return KernelCollector(lambda: [ps], stats_enabled=lambda: True, exemplars=w.exemplars.for_histogram)


def make_registry(coll: KernelCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(coll)
    return registry


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up: imports, caches
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


@dataclass(frozen=True)
class ScrapeRow:
    what: str
    fmt: str
    median_ms: float
    series: int
    body_kb: float


def time_scrapes(what: str, coll: KernelCollector, runs: int) -> list[ScrapeRow]:
    """Whole scrapes in both formats, plus collect() alone (our reads and families, without rendering)."""
    registry = make_registry(coll)
    series = sum(len(f.samples) for f in coll.collect())
    rows = [ScrapeRow(what, "collect only", median_ms(lambda: list(coll.collect()), runs), series, 0.0)]
    for fmt, render in (("text 0.0.4", generate_latest), ("OpenMetrics", generate_openmetrics)):
        body = render(registry)
        rows.append(ScrapeRow(what, fmt, median_ms(lambda r=render: r(registry), runs),
                              series_count(body.decode()), len(body) / 1024))
    return rows


def _fill_maps(tracer: Tracer, w: Workload) -> None:
    """Write the aggregates the BPF programs would have written, all counted on CPU 0."""
    obj, ncpus = tracer._obj, tracer._ncpus  # the bench's own object: it may reach in
    assert obj is not None
    pad = bytes(records.FUNC_STATS.size * (ncpus - 1))
    funcs, entries = obj.map("func_stats"), obj.map("entry_stats")
    for f in w.func_stats:
        head = (f.calls, sum(f.errors.values()), f.duration_sum_ns)
        funcs.update(struct.pack("<I", f.func_id), records.FUNC_STATS.pack(*head, *f.duration_buckets) + pad)
    for e in w.session_stats:
        head = (e.sessions, e.error_sessions, e.duration_sum_ns)
        entries.update(struct.pack("<I", e.entry_func_id), records.FUNC_STATS.pack(*head, *e.duration_buckets) + pad)
    errs = obj.map("err_stats")
    for f in w.func_stats:
        for name, n in f.errors.items():
            errs.update(records.ERR_KEY.pack(f.func_id, ERRNOS[name]), struct.pack(f"<{ncpus}Q", n, *[0] * (ncpus - 1)))


@contextmanager
def kernel_maps(w: Workload) -> Iterator[Tracer]:
    """The real BPF object loaded (not attached) for w.funcs, its stats maps holding w's numbers."""
    tracer = Tracer(w.funcs, CaptureConfig(mode=""))
    tracer.load()
    try:
        _fill_maps(tracer, w)
        yield tracer
    finally:
        tracer.close()


def scrape_table(args: argparse.Namespace) -> int:
    w = synthetic(args.funcs, args.buckets)
    rows = time_scrapes(f"synthetic readers, {args.buckets} buckets", collector(w), args.runs)
    if args.kernel_maps:
        if args.buckets != records.DUR_BUCKETS:
            print(f"--kernel-maps: the kernel keeps {records.DUR_BUCKETS} buckets; using that", file=sys.stderr)
            w = synthetic(args.funcs, records.DUR_BUCKETS)
        with kernel_maps(w) as tracer:
            got = {s.func_id: s for s in tracer.func_stats()}
            assert got[3].errors == w.func_stats[3].errors and got[3].calls == w.func_stats[3].calls
            read_ms = median_ms(lambda: (tracer.func_stats(), tracer.session_stats(), tracer.capture_stats()),
                                args.runs)
            coll = collector(w, tracer.func_stats, tracer.session_stats, tracer.capture_stats)
            rows += time_scrapes("kernel maps read + render", coll, args.runs)
    print(f"\n{args.funcs} traced functions ({ENTRY_FUNCS} entry), median of {args.runs} scrapes, "
          f"Python {sys.version.split()[0]}, kernel {os.uname().release}, {os.cpu_count()} CPUs")
    print(f"{'collector input':<34}{'format':<13}{'ms/scrape':>10}{'series':>9}{'body KiB':>10}")
    for r in rows:
        body = f"{r.body_kb:>10.0f}" if r.body_kb else f"{'-':>10}"
        print(f"{r.what:<34}{r.fmt:<13}{r.median_ms:>10.1f}{r.series:>9}{body}")
    if args.kernel_maps:
        print(f"(of which the map reads alone: {read_ms:.1f} ms)")
    return 0


# ---- (b) agent CPU per traced call ----------------------------------------------------------------


def agent_config(port: int, metrics_only: bool) -> str:
    mode = "metrics" if metrics_only else "stack"
    exporter = "  otlp: null\n" if metrics_only else "  otlp: null\n  console: true\n"
    return f"""\
probe_sets:
  - name: bench
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check, map_create]
    mode: {mode}
exporter:
{exporter}metrics:
  listen: "127.0.0.1:{port}"
logging:
  format: json
  level: warning
"""

@dataclass(frozen=True)
class CpuRow:
    variant: str
    delay_ms: float
    calls: int
    wall_s: float
    cpu_s: float
    net_cpu_s: float
    sessions: int
    reported: int
    kernel_ns_per_session: float | None

    @property
    def net_per_1k(self) -> float:
        return self.net_cpu_s / self.calls * 1000


def run_workload(calls: int, delay_ms: float) -> None:
    subprocess.run([sys.executable, "-m", "retsnoop_otel", "simfail", SIMFAIL_CASE, "--repeat", str(calls),
                    "--delay-ms", str(delay_ms)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def measure_variant(variant: str, metrics_only: bool, args: argparse.Namespace, tmp: Path) -> list[CpuRow]:
    port = free_port()
    cfg = tmp / f"agent-{variant}.yaml"
    cfg.write_text(agent_config(port, metrics_only))
    log = (tmp / f"agent-{variant}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "agent", "--config", str(cfg)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        try:
            wait_healthy(proc, port, args.start_timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; agent log:\n{(tmp / f'agent-{variant}.log').read_text()}") from None
        settle_cpu(proc.pid)  # attach done; wait out the first housekeeping, scrapes and lazy imports
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.idle_s)
        idle_rate = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
        rows = []
        for delay in args.delays:
            before = scrape(port)
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            run_workload(args.calls, delay)
            time.sleep(0.3)  # the last ring-buffer records (control variant) reach the agent
            wall, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - c0
            after = scrape(port)
            sessions = growth(before, after, "retsnoop_sessions_total")
            reported = growth(before, after, "retsnoop_sessions_reported_total")
            run_s = growth(before, after, "retsnoop_bpf_program_run_seconds_total")
            rows.append(CpuRow(variant, delay, args.calls, wall, cpu, cpu - idle_rate * wall, int(sessions),
                               int(reported), run_s / sessions * 1e9 if sessions and run_s else None))
            print(f"{rows[-1]}", file=sys.stderr, flush=True)
        print(f"{variant}: agent idle CPU {idle_rate * 1000:.2f} ms/s", flush=True)
        return rows
    finally:
        stop(proc)
        log.close()


def agent_cpu_table(args: argparse.Namespace) -> int:
    variants = [("metrics only", True)] + ([("sessions to console", False)] if args.control else [])
    with tempfile.TemporaryDirectory(dir=os.environ.get("RETSNOOP_OTEL_RWDIR")) as tmp, bpf_stats_enabled():
        try:
            rows = [r for name, only in variants for r in measure_variant(name, only, args, Path(tmp))]
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"bench.metrics_cost --agent-cpu: {exc}", file=sys.stderr)
            return 1
    print(f"\nagent CPU per traced call; workload: simfail {SIMFAIL_CASE} x {args.calls} per rate; "
          f"kernel {os.uname().release}")
    print(f"{'variant':<21}{'delay ms':>9}{'calls/s':>9}{'agent CPU s':>12}{'net CPU s':>11}{'net ms/1k calls':>16}"
          f"{'sessions':>10}{'to user':>9}{'kernel ns/call':>15}")
    for r in rows:
        kernel = f"{r.kernel_ns_per_session:.0f}" if r.kernel_ns_per_session else "-"
        print(f"{r.variant:<21}{r.delay_ms:>9g}{r.calls / r.wall_s:>9.0f}{r.cpu_s:>12.2f}{r.net_cpu_s:>11.2f}"
              f"{r.net_per_1k * 1000:>16.1f}{r.sessions:>10}{r.reported:>9}{kernel:>15}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--funcs", type=int, default=1000, help="traced functions (scrape mode)")
    p.add_argument("--buckets", type=int, default=records.DUR_BUCKETS,
                   help=f"log2 duration buckets per histogram (the kernel keeps {records.DUR_BUCKETS})")
    p.add_argument("--runs", type=int, default=21, help="scrapes timed per format (median reported)")
    p.add_argument("--kernel-maps", action="store_true", help="also time scrapes reading the real BPF maps (root)")
    p.add_argument("--agent-cpu", action="store_true", help="measure agent CPU per traced call (tracing kernel)")
    p.add_argument("--calls", type=int, default=5000, help="workload calls per rate (--agent-cpu)")
    p.add_argument("--delays", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 2.0],
                   help="simfail --delay-ms per rate, comma-separated (--agent-cpu)")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle baseline (--agent-cpu)")
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds for the agent to attach")
    p.add_argument("--control", action="store_true", help="also run with sessions sent to user space")
    args = p.parse_args(argv)
    return agent_cpu_table(args) if args.agent_cpu else scrape_table(args)


if __name__ == "__main__":
    sys.exit(main())

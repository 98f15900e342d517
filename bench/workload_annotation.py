"""What workload identity adds to a kept session on the capture loop, against encoding the same session.

The runtime's session routing (runtime/routing.py, `SessionRouter.session`) asks the resolver for the
session's workload and executable name before the session is encoded. Once a process and its cgroup were
seen, both answers are dictionary look-ups; this measures that cached path next to `SpanEncoder.encode` of
the same sessions (with the per-workload envelopes), on one thread, in one run:
  annotate  WorkloadResolver.of_session + exe_name over a fixture /proc and cgroupfs tree (20 containers
            in kubepods layouts, 200 processes), every answer cached by a first pass
  encode    the production encoder, for stack-mode sessions (the error chain: 3 spans) and call-mode sessions
            (bench/span_throughput.py's generator: 51 spans)
It also times the first (uncached) answer per process, which reads /proc/PID/cgroup and /proc/PID/exe once.

Run: .venv/bin/python -m bench.workload_annotation [--rounds N] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import OFFSET, make_funcs, make_session
from retsnoop_otel.capture.model import Session, StackEntry
from retsnoop_otel.export.resource import build_resource
from retsnoop_otel.export.span_encoder import SpanEncoder, WorkloadEnvelopes
from retsnoop_otel.workload.pods import ContainerMeta, PodCache, PodMeta
from retsnoop_otel.workload.resolver import WorkloadResolver

CONTAINERS = 20
PROCESSES = 200
EINVAL = (1 << 64) - 22


def fixture_tree(root: Path, rng: random.Random) -> tuple[list[tuple[int, int, str]], PodCache]:
    """(pid, cgroup id, comm) of PROCESSES processes spread over CONTAINERS containers, and their pods' names."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text("30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    pods = PodCache(time.monotonic)
    cgroups = []
    for i in range(CONTAINERS):
        hexes = f"{rng.getrandbits(128):032x}"
        uid = f"{hexes[:8]}-{hexes[8:12]}-4{hexes[13:16]}-a{hexes[17:20]}-{hexes[20:]}"
        cid = f"{rng.getrandbits(256):064x}"
        rel = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/" \
              f"cri-containerd-{cid}.scope"
        (root / "sys/fs/cgroup" / rel).mkdir(parents=True)
        main = ContainerMeta("main", "containerd", "registry.example/bench/main", ("1.0",))
        pods.upsert(PodMeta(uid, f"pod-{i}", "bench", {cid: main}, (("replicaset", f"app{i}-5c9d8b7f4"),
                                                                    ("deployment", f"app{i}"))))
        cgroups.append((rel, os.stat(root / "sys/fs/cgroup" / rel).st_ino))
    procs = []
    for pid in range(1000, 1000 + PROCESSES):
        rel, ident = cgroups[pid % CONTAINERS]
        d = root / "proc" / str(pid)
        d.mkdir()
        (d / "cgroup").write_text(f"0::/{rel}\n")
        (d / "stat").write_text(f"{pid} (server) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid * 7} 1 2\n")
        (d / "exe").symlink_to("/usr/local/bin/server")
        procs.append((pid, ident, "server"))
    return procs, pods


def chain_session(funcs, rng: random.Random) -> Session:
    return Session(tid=1, pid=1, comm="server", proc_comm="server", start_ns=1_000, end_ns=9_000, is_err=True,
                   chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 6_000), StackEntry(2, EINVAL, 1_000)],
                   kstack=[0xFFFFFFFF81000105, 0xFFFFFFFF81000010])


def best_ns(fn, items: list, repeat: int) -> float:
    """Median over `repeat` passes of the per-item time of `fn` over `items`."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for item in items:
            fn(item)
        times.append((time.perf_counter_ns() - t0) / len(items))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20000, help="sessions per pass")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    rng = random.Random(3)
    funcs = make_funcs()
    with tempfile.TemporaryDirectory() as tmp:
        procs, pods = fixture_tree(Path(tmp), rng)
        resolver = WorkloadResolver(tmp, time.monotonic, pods)
        t0 = time.perf_counter_ns()
        for pid, ident, comm in procs:  # first sight of every process: /proc reads, cgroup learned
            resolver.of_session(pid, ident, comm)
            resolver.exe_name(pid, comm)
        first_ns = (time.perf_counter_ns() - t0) / len(procs)
        picks = [procs[rng.randrange(len(procs))] for _ in range(args.rounds)]

        def annotate(proc: tuple[int, int, str]) -> None:
            pid, ident, comm = proc
            resolver.of_session(pid, ident, comm)
            resolver.exe_name(pid, comm)

        annotate_ns = best_ns(annotate, picks, args.repeat)
        resource = build_resource({}, instance_id="bench")
        envelopes = WorkloadEnvelopes(resource.attributes, resource.schema_url)
        enc = SpanEncoder(funcs, envelopes.base, workloads=envelopes, symbolize=lambda a: f"sym+0x{a & 0xff:x}")
        rows = []
        for shape, make in (("stack (3 spans)", lambda: chain_session(funcs, rng)),
                            ("calls (51 spans)", lambda: make_session(rng, funcs, 50))):
            sessions = []
            for pid, ident, comm in picks[:2000]:
                s = make()
                s.pid, s.proc_comm = pid, comm
                s.workload, s.exe_name = resolver.of_session(pid, ident, comm), resolver.exe_name(pid, comm)
                sessions.append(s)
            encode_ns = best_ns(lambda s: enc.encode(s, OFFSET), sessions, args.repeat)
            rows.append((shape, encode_ns))
    print(f"annotation, cached (of_session + exe_name): {annotate_ns:,.0f} ns per session")
    print(f"annotation, first sight of a process (/proc reads): {first_ns:,.0f} ns")
    for shape, encode_ns in rows:
        print(f"encode, {shape}: {encode_ns:,.0f} ns per session; annotation / encode = {annotate_ns / encode_ns:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

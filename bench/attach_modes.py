"""Attach/detach time and in-kernel per-call cost of each attach mode, on the running kernel.

Run as root on a kernel that allows tracing (in the VM: `tests/vm/run --kernel 6.12 -- python
bench/attach_modes.py --sizes 100,1000`). Per mode and function-set size it reports:
- attach and detach wall time of the whole set;
- the in-kernel cost per probe run (kernel.bpf_stats_enabled: run_time_ns / run_cnt summed over
  our programs) while a bpf()-heavy workload runs, and the cost per traced call (entry + exit).
Functions are taken from the BPF subsystem (`*bpf*` names with BTF), so the workload calls them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retsnoop_otel.kernel import features, tracefs  # noqa: E402
from retsnoop_otel.kernel import libbpf_btf as lb  # noqa: E402
from retsnoop_otel.kernel.tracer import CaptureConfig, Tracer  # noqa: E402
from retsnoop_otel.symbols import discovery  # noqa: E402
from retsnoop_otel.symbols.btf import ReturnKinds  # noqa: E402
from retsnoop_otel.symbols.kallsyms import Kallsyms  # noqa: E402

OUR = {"kprobe_entry", "kretprobe_exit", "kmulti_entry", "kmulti_exit", "ksession", "rs_fentry", "rs_fexit"}


def prog_stats() -> tuple[int, int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    progs = [p for p in json.loads(out) if p.get("name") in OUR]
    return sum(p.get("run_time_ns", 0) for p in progs), sum(p.get("run_cnt", 0) for p in progs)


def workload(n: int) -> None:
    """bpf() calls through the map-creation path (create + close an array map)."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 30)(2, 4, 4, 1)
    for _ in range(n):
        fd = libc.syscall(321, 0, attr, ctypes.sizeof(attr))
        if fd >= 0:
            os.close(fd)


def pick(size: int, mode: str, ksyms, available, ret_kinds) -> list:
    disc = discovery.discover(["*sys_bpf"], ["*bpf*"], [], ksyms, available, ret_kinds, mode)
    entries = [f for f in disc.funcs if f.is_entry]
    others = [f for f in disc.funcs if not f.is_entry and ret_kinds.func_id(f.name)][: max(0, size - len(entries))]
    from dataclasses import replace
    return [replace(f, id=i) for i, f in enumerate(entries + others)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000")
    ap.add_argument("--modes", default="fentry,kprobe,kprobe_multi")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    feats = features.detect()
    ksyms = Kallsyms.load()
    available = tracefs.read_available_filter_functions()
    ret_kinds = ReturnKinds(lb.Btf.load_vmlinux())
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for mode in args.modes.split(","):
            try:
                features.require_tracing(feats, mode)
            except features.FeatureError:
                rows.append({"mode": mode, "size": size, "note": "not supported by this kernel"})
                continue
            funcs = pick(size, mode, ksyms, available, ret_kinds)
            tracer = Tracer(funcs, CaptureConfig(mode=mode), btf_func_id=ret_kinds.func_id)
            t0 = time.monotonic()
            tracer.load()
            t1 = time.monotonic()
            report = tracer.attach()
            t2 = time.monotonic()
            ns0, cnt0 = prog_stats()
            workload(args.calls)
            ns1, cnt1 = prog_stats()
            t3 = time.monotonic()
            tracer.close()
            t4 = time.monotonic()
            runs = cnt1 - cnt0
            rows.append({"mode": mode, "size": len(report.attached), "load_s": round(t1 - t0, 2),
                         "attach_s": round(t2 - t1, 2), "detach_s": round(t4 - t3, 2),
                         "probe_runs": runs, "ns_per_run": round((ns1 - ns0) / runs, 1) if runs else None,
                         "failed": len(report.failed)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nkernel {os.uname().release}; workload: {args.calls} x bpf(BPF_MAP_CREATE)")
    print(f"{'mode':<13}{'funcs':>6}{'load s':>8}{'attach s':>10}{'detach s':>10}{'probe runs':>12}{'ns/run':>9}")
    for r in rows:
        if "note" in r:
            print(f"{r['mode']:<13}{r['size']:>6}  {r['note']}")
            continue
        print(f"{r['mode']:<13}{r['size']:>6}{r['load_s']:>8}{r['attach_s']:>10}{r['detach_s']:>10}"
              f"{r['probe_runs']:>12}{r['ns_per_run'] or '-':>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

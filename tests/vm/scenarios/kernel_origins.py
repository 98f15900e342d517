"""Guest side of error origins counted in the kernel (issue 46 point 1); host asserts: tests/vm/test_kernel_origins.py.

A workload makes bpf() fail in two places at known counts (BPF_MAP_CREATE with max_entries 0 fails in
array_map_alloc_check for an array, in htab_map_alloc_check for a hash map: map-type callbacks, traceable on every
kernel) among many successes, sampled at 1%.
The kernel's origin map must count exactly the failing calls made, by origin, and agree with the origins user
space finds in the error chains of the sessions it received; the collector must serve them. Then, in every other
attach mode the kernel has, a smaller run: the verifier accepts the counting in each mode's programs.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

PY = sys.executable
COMM = "origins_wl"
WORKLOAD = """
import ctypes, os, resource, sys
# 5.10 charges BPF maps to the user's locked memory: a tracer in another process can leave root none to create more
resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, b"origins_wl", 0, 0, 0)  # PR_SET_NAME: the tracer follows this comm only
ok, bad_array, bad_hash = (int(a) for a in sys.argv[1:4])
def create(entries, map_type=2):
    attr = (ctypes.c_uint32 * 30)(map_type, 4, 4, entries)  # BPF_MAP_TYPE_ARRAY, key 4, value 4
    return libc.syscall(321, 0, attr, ctypes.sizeof(attr))
out = {"ok": 0, "array_failed": 0, "hash_failed": 0}
for _ in range(ok):
    fd = create(1)
    if fd >= 0:
        out["ok"] += 1
        os.close(fd)
for _ in range(bad_array):
    out["array_failed"] += create(0) < 0
for _ in range(bad_hash):
    out["hash_failed"] += create(0, 1) < 0  # BPF_MAP_TYPE_HASH
print(out)
"""
ENTRY = ["__x64_sys_bpf"]
ALLOW = ["map_create", "array_map_alloc_check", "htab_map_alloc_check"]  # map_create: inlined on 5.10


def scenario_error_origins(ctx) -> dict:
    from retsnoop_otel.kernel import attach_modes, features
    from retsnoop_otel.kernel import libbpf_btf as lb
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms
    from retsnoop_otel.symbols.traceable import Traceable

    feats = features.detect()
    default = features.choose_mode(feats)
    btf = lb.Btf.load_vmlinux()
    kinds = ReturnKinds(btf)
    ksyms, avail = Kallsyms.load(), Traceable.load()
    res: dict = {"mode": default, "modes": {}}
    try:
        res["main"] = _run(ctx, default, kinds, ksyms, avail, (300, 7, 5), metrics=True)
        for mode in attach_modes.NAMES:
            if mode != default and feats.mode(mode).available:
                try:
                    res["modes"][mode] = _run(ctx, mode, kinds, ksyms, avail, (10, 3, 2), metrics=False)
                except Exception as exc:  # noqa: BLE001 - the host test names the mode and the error
                    res["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        btf.free()
    return res


def _run(ctx, mode: str, kinds, ksyms, avail, counts: tuple[int, int, int], metrics: bool) -> dict:
    """One tracer in `mode` around one run of WORKLOAD: kernel counts, user-space origins, loss counters."""
    from retsnoop_otel.capture.origins import error_origin
    from retsnoop_otel.capture.sampling import threshold
    from retsnoop_otel.capture.sessions import SessionAssembler
    from retsnoop_otel.kernel.attach_modes import BY_NAME
    from retsnoop_otel.kernel.capture_config import CaptureConfig
    from retsnoop_otel.kernel.tracer import Tracer
    from retsnoop_otel.render.console import session_json
    from retsnoop_otel.symbols import discovery
    from tests.origin_oracle import origin_from_calls

    disc = discovery.discover(ENTRY, ALLOW, [], ksyms, avail, kinds, mode)
    funcs = {f.id: f for f in disc.funcs}
    cfg = CaptureConfig(mode=mode, emit_calls=True, capture_success=True, success_threshold=threshold(0.01),
                        comms=[COMM])
    tracer = Tracer(disc.funcs, cfg, btf_func_id=kinds.func_id)
    sessions: list = []
    asm = SessionAssembler()

    def on_record(rec) -> None:
        if (s := asm.feed(rec)) is not None:
            sessions.append(s)

    out: dict = {}
    try:
        tracer.load()
        tracer.attach(strict=True)
        tracer.open_ring_buffer(on_record)
        rc, stdout, err = ctx.run([PY, "-c", WORKLOAD, *map(str, counts)], 300)
        out["workload"] = [rc, stdout.strip(), err[-500:]]
        want = counts[1] + counts[2]
        deadline = time.monotonic() + 120
        while BY_NAME[mode].sessions and sum(s.is_err for s in sessions) < want and time.monotonic() < deadline:
            tracer.poll(200)  # the origin counts are the kernel's at once: a mode without sessions sends nothing
        tracer.poll(500)
        out["kernel"] = sorted([funcs[c.entry_func_id].name, funcs[c.origin_func_id].name, c.error, c.count]
                               for c in tracer.origin_counts())
        out["capture_stats"] = tracer.capture_stats()._asdict()
        if metrics:
            out["metrics"] = _exposition(tracer, mode)
    finally:
        tracer.close()
    failing = [s for s in sessions if s.is_err]
    user = Counter()
    for s in failing:
        o = error_origin(s, funcs)
        user[(funcs[s.chain[0].func_id].name, o.name if o else None, o.error if o else None)] += 1
    out["user"] = sorted([*k, n] for k, n in user.items())
    # the kernel's rule replayed over each session's recorded calls names the chain's deepest level too
    out["oracle_mismatch"] = [[funcs[s.chain[-1].func_id].name, origin_from_calls(s.calls, funcs)] for s in failing
                              if origin_from_calls(s.calls, funcs) != s.chain[-1].func_id]
    out["with_calls"] = sum(bool(s.calls) for s in failing)
    out["json_origins"] = sorted(Counter(session_json(s, funcs, 0)["origin"]["function"] for s in failing).items())
    out["reported"] = {"errors": len(failing), "successes": len(sessions) - len(failing)}
    return out


def _exposition(tracer, mode: str) -> list[str]:
    """The retsnoop_error_origins lines of /metrics as the kernel collector renders this tracer's maps."""
    from prometheus_client import CollectorRegistry, generate_latest

    from retsnoop_otel.metrics.kernel_families import KernelCollector

    class Source:
        name, funcs, attached, sampled_out, filtered_out, evicted, workload_label = \
            "origins", tracer.funcs, len(tracer.funcs), 0, 0, 0, None

        def __init__(self) -> None:
            self.mode = mode

        def func_stats(self):
            return tracer.func_stats()

        def workload_totals(self):
            return []

        def session_stats(self):
            return tracer.session_stats()

        def capture_stats(self):
            return tracer.capture_stats()

        def origin_counts(self):
            return tracer.origin_counts()

        def program_stats(self):
            return []

    reg = CollectorRegistry(auto_describe=True)
    reg.register(KernelCollector(lambda: [Source()], stats_enabled=lambda: False))
    return [line for line in generate_latest(reg).decode().splitlines() if line.startswith("retsnoop_error_origins")]


INTERVAL_S = 1
INTERVAL_LINE = r'^\{"start_ns": \d+, "end_ns": \d+, "seconds": [0-9.]+, "origins": \[\{'  # a non-empty interval
ROUNDS = (("0", "3", "2"), ("0", "2", "1"))  # no successes: on 5.10 (memlock accounting) the tracer's own maps can
# leave the user none to create more


def scenario_trace_origin_table(ctx) -> dict:
    """`trace --json -x E2BIG --origins-interval 1`: no session is printed (none fails with E2BIG), yet the tables
    count them all, since they are the kernel's count of every failing session: one per interval, then the run's at
    stop. Two rounds of failing calls, the second started once an interval showed the first's, so they fall in
    different intervals."""
    import json

    from tests.vm.scenarios.filters import json_sessions, start_tracer, stop_tracer

    args = ["-e", ENTRY[0], *[a for f in ALLOW for a in ("-a", f)], "-n", COMM, "-x", "E2BIG", "--json",
            "--origins-interval", str(INTERVAL_S)]
    tracer, attach_s = start_tracer(ctx, args)
    result: dict = {"attach_s": attach_s, "workload": []}
    t0 = time.monotonic()
    try:
        counted, want = 0, 0
        for counts in ROUNDS:
            rc, stdout, err = ctx.run([PY, "-c", WORKLOAD, *counts], 300)
            result["workload"].append([rc, stdout.strip(), err[-500:]])
            want += int(counts[1]) + int(counts[2])
            while counted < want:  # the intervals' tables show every failing call made so far
                counted += sum(o["count"] for o in json.loads(tracer.wait_for_line(INTERVAL_LINE, 120).string)
                               ["origins"])
    finally:
        result["rounds_s"] = round(time.monotonic() - t0, 1)
        result["tracer"] = stop_tracer(ctx, tracer)
    objs = [json.loads(line) for line in result["tracer"]["output"].splitlines() if line.startswith("{")]
    result["session_origins"] = [o["origin"] for o in json_sessions(result["tracer"]["output"]) if "origin" in o]
    result["table"] = [o for o in objs if "origins" in o and "start_ns" not in o]  # the run's, at stop
    result["intervals"] = [o for o in objs if "origins" in o and "start_ns" in o]
    result["tail"] = result["tracer"]["output"][-1500:]
    json.dumps(result)  # the batch stores it as JSON
    return result


def scenario_trace_origins_only(ctx) -> dict:
    """`trace --syscalls --origins-only --json` (the bpf() callbacks allowed too, should the preset's budget leave
    them out): no session printed, the table at stop counts every failing call by origin; on a kernel without
    kprobe.multi, one line saying so and nothing attached."""
    import json

    from tests.vm.scenarios.filters import our_progs, stop_tracer

    args = [PY, "-m", "retsnoop_otel", "trace", "--syscalls", "--origins-only", *[a for f in ALLOW for a in ("-a", f)],
            "-n", COMM, "--json"]
    proc = ctx.spawn(args)
    try:  # the preset's ~1,400 functions: discovered and attached in about a minute under emulation
        started = proc.wait_for_line(r"^(Receiving data\.\.\.|retsnoop-otel: .*)$", timeout=900).group(1)
    except TimeoutError:  # it exited first
        started = ""
    if not started.startswith("Receiving"):
        rc = proc.terminate(timeout=60)
        return {"refused": True, "rc": rc, "output": proc.output(), "progs_after": our_progs(ctx)}
    result: dict = {"refused": False}
    try:
        rc, stdout, err = ctx.run([PY, "-c", WORKLOAD, "20", "3", "2"], 300)
        result["workload"] = [rc, stdout.strip(), err[-500:]]
        time.sleep(1)
    finally:
        result["tracer"] = stop_tracer(ctx, tracer=proc)
    out = result["tracer"]["output"]
    result["lines"] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    result["tail"] = out[-1500:]
    return result

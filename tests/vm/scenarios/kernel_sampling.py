"""Guest side of in-kernel sampling (issue 13, item 6) on real kernels, in the default attach mode.

Drives the Tracer directly (calls mode, successes wanted but with a threshold no randomness reaches):
successful bpf() calls must send nothing at all, and the one failing call its start record, its held
calls as one batch and its end, complete. Then the same with the kernel stack switched off (mode
metrics): the error chain without the stack. Host-side asserts: tests/vm/test_kernel_sampling.py.
"""

from __future__ import annotations

import sys
import time

PY = sys.executable
WORKLOAD = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for entries in [1] * 20 + [0]:  # 20 array maps created and closed, then max_entries 0: -EINVAL
    attr = (ctypes.c_uint32 * 30)(2, 4, 4, entries)
    fd = libc.syscall(321, 0, attr, ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
"""


def scenario_kernel_sampling(ctx) -> dict:
    from retsnoop_otel.capture.sampling import MAX_THRESHOLD
    from retsnoop_otel.kernel import features
    from retsnoop_otel.kernel import libbpf_btf as lb
    from retsnoop_otel.kernel.capture_config import CaptureConfig
    from retsnoop_otel.symbols import discovery
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms
    from retsnoop_otel.symbols.traceable import Traceable

    mode = features.choose_mode(features.detect())
    btf = lb.Btf.load_vmlinux()
    kinds = ReturnKinds(btf)
    disc = discovery.discover(["__x64_sys_bpf"], ["map_create", "array_map_alloc_check"], [], Kallsyms.load(),
                              Traceable.load(), kinds, mode)
    names = {f.id: f.name for f in disc.funcs}
    cfg = CaptureConfig(mode=mode, emit_calls=True, capture_success=True, success_threshold=MAX_THRESHOLD,
                        comms=["python", "python3"])
    res: dict = {"mode": mode}
    try:
        sessions, res["records"], res["capture_stats"], res["workload"] = _capture(ctx, disc.funcs, cfg, kinds)
        # the same failing call with the kernel stack switched off (what mode metrics does)
        bare, _, _, _ = _capture(ctx, disc.funcs, cfg._replace(kernel_stack=False), kinds)
    finally:
        btf.free()
    res["kstack_frames"] = [len(s.kstack) for s in sessions if s.is_err]
    res["kstack_frames_off"] = [len(s.kstack) for s in bare if s.is_err]
    res["chain_off"] = [[names[e.func_id] for e in s.chain] for s in bare if s.is_err]

    def tree(calls) -> list:
        return [[names[c.func_id], c.result, tree(c.children)] for c in calls]

    res["sessions"] = [{"is_err": s.is_err, "sampling": s.kernel_sampling, "dropped": s.dropped_records,
                        "calls": tree(s.calls)} for s in sessions]
    return res


def _capture(ctx, funcs, cfg, kinds) -> tuple[list, dict, dict, tuple]:
    """Sessions, record kinds, capture statistics and the workload's outcome, for one run of WORKLOAD."""
    from retsnoop_otel.kernel.tracer import Tracer
    from tests.record_sink import SessionSink

    tracer = Tracer(funcs, cfg, btf_func_id=kinds.func_id)
    sink = SessionSink()
    try:
        tracer.load()
        tracer.attach(strict=True)
        tracer.open_ring_buffer(sink)
        rc, _, err = ctx.run([PY, "-c", WORKLOAD], 120)
        deadline = time.monotonic() + 60
        while not sink.sessions and time.monotonic() < deadline:
            tracer.poll(200)
        tracer.poll(500)
        stats = tracer.capture_stats()._asdict()
    finally:
        tracer.close()
    return sink.sessions, dict(sink.kinds), stats, (rc, err[-500:])

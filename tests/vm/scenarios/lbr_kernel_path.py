"""Guest side of the --lbr kernel path (issue 4) on a real kernel without LBR (QEMU exposes none).

The CLI refuses --lbr here (bad_input covers that); this drives the Tracer directly with the LBR
perf events left closed, so the BPF side runs exactly as on an LBR machine: each exit calls
bpf_get_branch_snapshot() first, the deepest failing return keeps the snapshot, and it reaches user
space with the session. Without LBR the kernel answers -ENOENT, which is what must arrive, taken at
array_map_alloc_check's exit, in every attach mode the kernel supports.
"""

from __future__ import annotations

import sys
import time

PY = sys.executable


def scenario_lbr_kernel_path(ctx) -> dict:
    from retsnoop_otel.kernel import bpfsys, features
    from retsnoop_otel.kernel import libbpf_btf as lb
    from retsnoop_otel.kernel.capture_config import CaptureConfig
    from retsnoop_otel.kernel.tracer import Tracer
    from retsnoop_otel.render.lbr import render_session_lbr
    from retsnoop_otel.symbols import discovery
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms
    from retsnoop_otel.symbols.symbolize import KallsymsSymbolizer
    from retsnoop_otel.symbols.traceable import Traceable

    feats = features.detect()
    modes = [m for m in ("fentry", "kprobe", "kprobe_multi", "kprobe_session") if feats.mode(m).available]
    ksyms = Kallsyms.load()
    available = Traceable.load()
    btf = lb.Btf.load_vmlinux()
    kinds = ReturnKinds(btf)
    sym = KallsymsSymbolizer(ksyms)
    out: dict = {"modes": {}, "snapshot_feature": feats.branch_snapshot.available}
    for mode in modes:
        disc = discovery.discover(["*sys_bpf"], ["array_map_alloc_check"], [], ksyms, available, kinds, mode)
        funcs = {f.id: f for f in disc.funcs}
        cfg = CaptureConfig(mode=mode, lbr_branch_types=bpfsys.PERF_SAMPLE_BRANCH_KERNEL
                            | bpfsys.PERF_SAMPLE_BRANCH_ANY_RETURN, lbr_perf_events=False)
        res, sessions = _capture(ctx, Tracer(disc.funcs, cfg, btf_func_id=kinds.func_id))
        res["sessions"] = [{
            "chain": [funcs[e.func_id].name for e in s.chain],
            "lbr": None if s.lbr is None else {"func": funcs[s.lbr.func_id].name, "depth": s.lbr.depth,
                                               "error": s.lbr.error, "branches": len(s.lbr.branches),
                                               "at_chain_end": s.lbr.func_id == s.chain[-1].func_id},
            "text": render_session_lbr(s, funcs, sym)} for s in sessions]
        out["modes"][mode] = res
    return out


def _capture(ctx, tracer) -> tuple[dict, list]:
    """Attach, run one failing bpf() call in another process, collect the sessions, detach."""
    from retsnoop_otel.capture.sessions import SessionAssembler
    sessions: list = []
    asm = SessionAssembler()
    res: dict = {}

    def on_record(rec) -> None:
        session = asm.feed(rec)
        if session is not None:
            sessions.append(session)

    try:
        tracer.load()
        tracer.attach(strict=True)
        tracer.open_ring_buffer(on_record)
        rc, _, serr = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 120)
        res["simfail_rc"], res["simfail_err"] = rc, serr[-500:]
        deadline = time.monotonic() + 60
        while not sessions and time.monotonic() < deadline:
            tracer.poll(200)
    finally:
        tracer.close()
    return res, sessions

"""Guest side of the workload and feature-detection checks: what the real kernels answer.

Every simfail case runs (one process for all, plus single-case runs for exit codes), then
`features --json`; bpftool shows whether anything the cases or probes loaded outlived them. Host-side assertions:
tests/vm/test_workload.py.
"""

from __future__ import annotations

import json
import sys

PY = sys.executable
OUR_PROG_PREFIXES = ("simfail_", "rs_probe_")


def _ours(ctx) -> list[str]:
    return [p["name"] for p in ctx.bpf_prog_ids() if p["name"].startswith(OUR_PROG_PREFIXES)]


def scenario_simfail_cases(ctx) -> dict:
    """Every case in one `simfail --json` process (guest Python starts slowly), then exit codes of
    single-case runs: a repeated failing case, the kernel-dependent fentry case, an unknown case."""
    from retsnoop_otel.simfail import CASES

    rc, out, err = ctx.run([PY, "-m", "retsnoop_otel.simfail", "--json", *CASES], timeout=300)
    results = {r["case"]: r for r in (json.loads(x) for x in out.splitlines() if x.startswith("{"))}
    for r in results.values():
        ctx.log(r["message"])
    alone = {}
    for argv in (["-r", "3", "--delay-ms", "10", "bpf-bad-map-max-entries-array"], ["bpf-fentry-unsupp-func"],
                 ["no-such-case"]):
        arc, aout, aerr = ctx.run([PY, "-m", "retsnoop_otel.simfail", *argv], timeout=180)
        alone[argv[-1]] = {"rc": arc, "out": aout, "err": aerr[-2000:]}
    return {"rc": rc, "results": results, "stderr": err[-2000:], "alone": alone, "progs_left": _ours(ctx)}


def scenario_features(ctx) -> dict:
    """`features --json` and the human report; nothing may stay loaded afterwards."""
    rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "features", "--json"], timeout=300)
    text_rc, text, text_err = ctx.run([PY, "-m", "retsnoop_otel", "features"], timeout=300)
    return {"rc": rc, "json": json.loads(out) if rc == 0 else None, "stderr": err[-2000:],
            "text_rc": text_rc, "text": text, "text_stderr": text_err[-2000:], "progs_left": _ours(ctx)}

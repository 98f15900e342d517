"""Guest side of issue 46 points 1-2 on 6.12: sampling.errors drops failing sessions from export, never from the
kernel's origin counts, and each origin series' exemplar leads to a trace the real Jaeger holds. One kernel: the
verifier's view of the sampling code is proven on every kernel by kernel_origins.py (its agent loads the same
object, sampling branch included); this scenario costs 30-40 s of a 6.12 boot under TCG (27 and 38 s with Jaeger
on the host, 42 s with the guest's own receiver it replaced).

The agent exports OTLP/HTTP to a Jaeger on the host (the shipped Collector pipeline keeping every trace it gets,
tests/vm/host_forwards.py), through the guest's forward; what the scenario knows of the exported sessions it reads
from Jaeger's query API, the one its UI reads, through a second forward. Host-side assertions:
tests/vm/test_error_sampling.py.
"""

from __future__ import annotations

import sys
import time

from tests.vm.guest_batch import budget
from tests.vm.host_forwards import JAEGER_OTLP_HTTP, JAEGER_QUERY, guest_url
from tests.vm.scenarios.kernel_origins import ALLOW, COMM, ENTRY, WORKLOAD
from tests.vm.traced_run import agent_outputs

PY = sys.executable


SAMPLED_CONFIG = """
probe_sets:
  - name: origins
    entry: [{entry}]
    allow: [{allow}]  # not map_create: inlined on 5.10, where the agent would refuse the name
    mode: calls
    filters:
      comms: [{comm}]
    sampling:
      success_probability: 0.01
      errors: 0.1
""" + agent_outputs("{otlp}", protocol=None)
SAMPLED_METRICS_PORT = 9473
# 200 failures at 0.1: ~20 exported. Each origin needs an exported session for its exemplar: none of 90 at 0.1 is
# 0.9**90 (1e-4), where the 7 and 5 of kernel_origins.py would leave one without half the time.
SAMPLED_COUNTS = (300, 110, 90)
JAEGER_WAIT_S = 300.0  # the host is loaded: the store holds a trace decision_wait (2 s) after it came, or later


def _get_text(url: str, accept: str = "") -> str:
    import urllib.request

    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read().decode()


def _root(trace: dict) -> dict:
    """What the host test reads of a trace's root span, as Jaeger returns it (tracestate as w3c.tracestate)."""
    from tests.peers.jaeger import spans_of

    spans = spans_of(trace)
    roots = [s for s in spans if not s.parent_id]
    if len(roots) != 1:
        return {"roots": len(roots), "names": sorted(s.name for s in spans)}
    tags = roots[0].tags
    return {"name": roots[0].name, "trace": f"{int(roots[0].trace_id, 16):032x}",  # Jaeger drops leading zeros
            "error": tags.get("error.type", ""), "state": tags.get("w3c.tracestate", ""),
            "origin": tags.get("retsnoop.error.origin", ""), "spans": len(spans)}


@budget(1500, peers=("jaeger",))
def scenario_error_sampling(ctx) -> dict:
    """The agent with sampling.errors 0.1 and 1% success sampling: the kernel counts every failing call by origin,
    exports about one failing session in ten (each with tracestate th), and counts the others as sampled out; each
    origin series' exemplar is the id of a trace Jaeger holds."""
    import json
    import re
    from pathlib import Path

    from tests.peers.jaeger import JaegerApi
    from tests.vm.traced_run import our_progs

    r: dict = {"counts": list(SAMPLED_COUNTS)}
    jaeger = JaegerApi(guest_url(JAEGER_QUERY))
    r["jaeger"] = jaeger.query
    cfg_path = Path(ctx.tmpdir) / "errsample.yaml"
    cfg_path.write_text(SAMPLED_CONFIG.format(entry=ENTRY[0], allow=", ".join(ALLOW[1:]), comm=COMM,
                                              otlp=guest_url(JAEGER_OTLP_HTTP), metrics_port=SAMPLED_METRICS_PORT))
    base = f"http://127.0.0.1:{SAMPLED_METRICS_PORT}/metrics"
    failing = SAMPLED_COUNTS[1] + SAMPLED_COUNTS[2]
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg_path)])
    try:
        agent.wait_for_line(r'"agent started"', timeout=600)
        rc, stdout, err = ctx.run([PY, "-c", WORKLOAD, *map(str, SAMPLED_COUNTS)], 600)
        r["workload"] = [rc, stdout.strip(), err[-500:]]

        def state() -> tuple[list[dict], int]:
            roots = [_root(t) for service in jaeger.services() for t in jaeger.find(service, limit=1000)]
            m = re.search(r'retsnoop_sessions_not_exported_total\{probe_set="origins",reason="sampled_error"\} (\S+)',
                          _get_text(base))
            return roots, int(float(m.group(1))) if m else -1

        deadline = time.monotonic() + JAEGER_WAIT_S  # every failing call either reaches Jaeger or is counted out
        roots, dropped = state()
        while sum(bool(s.get("error")) for s in roots) + dropped < failing and time.monotonic() < deadline:
            time.sleep(3)
            roots, dropped = state()
        time.sleep(5)  # a late trace would show as a count above `failing`
        roots, dropped = state()
        text = _get_text(base)
        r["metrics"] = [line for line in text.splitlines() if line.startswith(("retsnoop_error_origins",
                        "retsnoop_sessions_not_exported", "retsnoop_sessions_dropped", "retsnoop_records_lost"))]
        om = _get_text(base, "application/openmetrics-text; version=1.0.0")
        r["exemplars"] = re.findall(r'^retsnoop_error_origins_total\{[^}]*origin="(\w+)"[^}]*\} \S+ '
                                    r'# \{trace_id="([0-9a-f]{32})"\}', om, re.M)
        r["sampled_error"] = dropped
        r["roots"] = roots
        # each exemplar's trace by its id (/api/traces/<id>, what a dashboard's exemplar link opens)
        r["exemplar_traces"] = {tid: _root(t) if (t := jaeger.wait_trace(tid, JAEGER_WAIT_S)) else None
                                for _, tid in r["exemplars"]}
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        if r["agent_rc"] != 0:
            r["agent_log"] = agent.output()[-6000:]
        time.sleep(1)
        r["progs_after"] = our_progs(ctx)
    json.dumps(r)
    return r

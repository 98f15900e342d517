"""Guest side of issue 46 point 2 on 6.12: sampling.errors drops failing sessions from export, never from the
kernel's origin counts. One kernel: the verifier's view of the sampling code is proven on every kernel by
kernel_origins.py (its agent loads the same object, sampling branch included); this scenario's agent run costs 4-5
minutes of VM time. Host-side assertions: tests/vm/test_error_sampling.py.
"""

from __future__ import annotations

import sys
import time

from tests.vm.guest_batch import budget
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
""" + agent_outputs("http://127.0.0.1:{port}")
SAMPLED_METRICS_PORT = 9473
SAMPLED_COUNTS = (300, 70, 50)  # 120 failures at 0.1: ~12 exported; 7 and 5 would often export none of an origin


def _get_text(url: str, accept: str = "") -> str:
    import urllib.request

    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read().decode()


@budget(1500)
def scenario_error_sampling(ctx) -> dict:
    """The agent with sampling.errors 0.1 and 1% success sampling: the kernel counts every failing call by origin,
    exports about one failing session in ten (each with tracestate th), and counts the others as sampled out."""
    import json
    import re
    from pathlib import Path

    from tests.otlp_json import spans as otlp_spans
    from tests.vm.traced_run import our_progs

    r: dict = {"counts": list(SAMPLED_COUNTS)}
    out_file = Path(ctx.tmpdir) / "otlp_errsample.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY (\d+)", timeout=240).group(1))
    cfg_path = Path(ctx.tmpdir) / "errsample.yaml"
    cfg_path.write_text(SAMPLED_CONFIG.format(entry=ENTRY[0], allow=", ".join(ALLOW[1:]), comm=COMM, port=port,
                                              metrics_port=SAMPLED_METRICS_PORT))
    base = f"http://127.0.0.1:{SAMPLED_METRICS_PORT}/metrics"
    failing = SAMPLED_COUNTS[1] + SAMPLED_COUNTS[2]
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg_path)])
    try:
        agent.wait_for_line(r'"agent started"', timeout=600)
        rc, stdout, err = ctx.run([PY, "-c", WORKLOAD, *map(str, SAMPLED_COUNTS)], 600)
        r["workload"] = [rc, stdout.strip(), err[-500:]]

        def state() -> tuple[list[dict], int]:
            reqs = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip()] if out_file.exists() else []
            roots = [s for s in otlp_spans(reqs) if s["parent"] is None]
            m = re.search(r'retsnoop_sessions_not_exported_total\{probe_set="origins",reason="sampled_error"\} (\S+)',
                          _get_text(base))
            return roots, int(float(m.group(1))) if m else -1

        deadline = time.monotonic() + 300  # every failing call either arrives as a trace or is counted as dropped
        roots, dropped = state()
        while sum(bool(s["attrs"].get("error.type")) for s in roots) + dropped < failing \
                and time.monotonic() < deadline:
            time.sleep(2)
            roots, dropped = state()
        time.sleep(3)  # a late request would show as a count above `failing`
        roots, dropped = state()
        text = _get_text(base)
        r["metrics"] = [line for line in text.splitlines() if line.startswith(("retsnoop_error_origins",
                        "retsnoop_sessions_not_exported", "retsnoop_sessions_dropped", "retsnoop_records_lost"))]
        om = _get_text(base, "application/openmetrics-text; version=1.0.0")
        r["exemplars"] = re.findall(r'^retsnoop_error_origins_total\{[^}]*origin="(\w+)"[^}]*\} \S+ '
                                    r'# \{trace_id="([0-9a-f]{32})"\}', om, re.M)
        r["sampled_error"] = dropped
        r["roots"] = [{"error": s["attrs"].get("error.type", ""), "trace": s["trace"],
                       "state": s.get("traceState", ""), "origin": s["attrs"].get("retsnoop.error.origin", "")}
                      for s in roots]
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        receiver.terminate(timeout=60)
        time.sleep(1)
        r["progs_after"] = our_progs(ctx)
    json.dumps(r)
    return r

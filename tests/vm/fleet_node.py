"""Guest side of the fleet scenario (tests/vm/test_fleet.py): one node of two, booted with a hostname of its own.

    python -m tests.vm.fleet_node ROLE        (in a guest of tests/vm/run with forwards; ROLE: spike or steady)

Runs the agent as a node would: its config (below) names no collector; OTEL_EXPORTER_OTLP_ENDPOINT does, the
host's Jaeger through the guest's forward (RETSNOOP_OTEL_TO_HOST), and /metrics listens on every address for
the host's Prometheus, which reaches it through the host's forward. Once the agent says it started, the node
writes `ready` in the shared folder and fails bpf(BPF_MAP_CREATE) until the host writes `stop` there:
- spike: five times a second an ARRAY map with max_entries 0 (EINVAL in array_map_alloc_check, far above the
  rate of the history the host gave Prometheus), and once a PERCPU_ARRAY of 1 MiB values (E2BIG, an errno
  the node never had);
- steady: the same EINVAL every 20 seconds, its usual rate.
Then it stops the agent (SIGTERM: detach, flush) and writes `result.json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.procs import Proc
from tests.vm.host_forwards import JAEGER_OTLP_HTTP, guest_url

REPO = Path(__file__).resolve().parents[2]
METRICS_PORT = 9464
RUN_LIMIT_S = 1800.0
CONFIG = """
probe_sets:
  - name: maps
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
exporter:
  otlp: {{}}
metrics:
  listen: "0.0.0.0:{port}"
logging:
  format: json
"""


def main(role: str) -> int:
    rw = Path(os.environ["RETSNOOP_OTEL_RWDIR"])
    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    exe = tmp / "map_fail"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(REPO / "tests" / "native" / "map_fail.c")], check=True)
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG.format(port=METRICS_PORT))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": guest_url(JAEGER_OTLP_HTTP)}
    agent = Proc([sys.executable, "-m", "retsnoop_otel", "agent", "--config", str(cfg)], env, str(REPO))
    result: dict = {"role": role, "hostname": os.uname().nodename, "endpoint": env["OTEL_EXPORTER_OTLP_ENDPOINT"],
                    "calls": {"EINVAL": 0, "E2BIG": 0}}
    try:
        agent.wait_for_line(r'"agent started"', timeout=900)
        (rw / "ready").write_text(str(time.time()))
        every = 1.0 if role == "spike" else 20.0
        deadline = time.monotonic() + RUN_LIMIT_S
        next_call = time.monotonic()
        while not (rw / "stop").exists() and time.monotonic() < deadline:
            if time.monotonic() >= next_call:
                burst = 5 if role == "spike" else 1  # one exec per tick: under emulation a start takes a while
                subprocess.run([str(exe), "array", str(burst)], capture_output=True, timeout=60)
                result["calls"]["EINVAL"] += burst
                next_call += every
                if role == "spike" and result["calls"]["E2BIG"] == 0 and result["calls"]["EINVAL"] >= 30:
                    subprocess.run([str(exe), "percpu", "1"], capture_output=True, timeout=60)
                    result["calls"]["E2BIG"] += 1
                (rw / "progress.json").write_text(json.dumps(result["calls"]))
            time.sleep(0.2)
    finally:
        result["agent_rc"] = agent.terminate(timeout=300)
        result["agent_log"] = agent.output()[-6000:]
        (rw / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

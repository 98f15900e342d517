"""Guest side of the agent's config watch (issue 45): a ConfigMap-style directory updated under a running agent.

The agent starts with probe set `first` (entry *sys_bpf); an update swaps `..data` to a config whose set `second`
has other entry functions (*sys_getpid); the agent must reload by itself and attach it; a further update with a
broken file must leave `second` attached and count a failed reload. Metrics-only sets: no exporter needed.
Host-side assertions: tests/vm/test_agent_config_swap.py.
"""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from pathlib import Path

from tests.configmap import configmap_update
from tests.vm.traced_run import our_progs

PY = sys.executable
METRICS_PORT = 9473

CONFIG = """
probe_sets:
  - name: {name}
    entry: ["{entry}"]
    mode: metrics
metrics:
  listen: "127.0.0.1:{port}"
logging:
  format: json
"""
BROKEN = CONFIG.format(name="third", entry="*sys_bpf", port=METRICS_PORT).replace("mode: metrics", "mode: nope")


def _metrics() -> dict[str, float]:
    """The attached functions per probe set and the reloads per result."""
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=60) as resp:
        text = resp.read().decode()
    out = {}
    for m in re.finditer(r'^retsnoop_attached_functions\{[^}]*probe_set="([^"]+)"[^}]*\} (\S+)$', text, re.M):
        out[f"attached:{m.group(1)}"] = float(m.group(2))
    for m in re.finditer(r'^retsnoop_config_reloads_total\{result="(\w+)"\} (\S+)$', text, re.M):
        out[f"reloads:{m.group(1)}"] = float(m.group(2))
    return out


def _update(ctx, agent, mount: Path, text: str, wait_for: str) -> dict:
    """One ConfigMap update; how long until the agent said it reloads (detection) and `wait_for` (the outcome)."""
    t0 = time.monotonic()
    configmap_update(mount, {"agent.yaml": text})
    agent.wait_for_line(r'"reloading config"', timeout=120)
    detect_s = time.monotonic() - t0
    line = agent.wait_for_line(wait_for, timeout=400).group(0)
    r = {"detect_s": round(detect_s, 2), "done_s": round(time.monotonic() - t0, 2), "line": line,
         "metrics": _metrics(), "progs": our_progs(ctx)}
    ctx.log(f"update: reload seen after {detect_s:.1f} s, done after {r['done_s']} s: {r['metrics']}")
    return r


def scenario_agent_config_swap(ctx) -> dict:
    r: dict = {}
    mount = Path(ctx.tmpdir) / "config"
    configmap_update(mount, {"agent.yaml": CONFIG.format(name="first", entry="*sys_bpf", port=METRICS_PORT)})
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(mount / "agent.yaml")])
    try:
        r["started"] = agent.wait_for_line(r'"agent started"', timeout=400).group(0)
        r["start_metrics"] = _metrics()
        r["swap"] = _update(ctx, agent, mount, CONFIG.format(name="second", entry="*sys_getpid", port=METRICS_PORT),
                            r'.*"config reloaded".*')
        r["broken"] = _update(ctx, agent, mount, BROKEN, r'.*"config reload failed.*')
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        r["agent_output"] = agent.output()[-10000:]
    r["progs_after_sigterm"] = our_progs(ctx)
    return r

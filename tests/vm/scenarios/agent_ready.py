"""Guest side of issue 49: "ready" is said only when every failing call from then on is counted and exported.

The agent answered /metrics (and /healthz) while it was still reading the kernel's tables, so the calls a user
made on seeing it were never counted. Here a native workload (tests/native/map_fail.c) waits for the first
connection the agent's port accepts and fails bpf(BPF_MAP_CREATE) within a millisecond: three times itself (a
process born before the agent, HASH with key_size 0, htab_map_alloc_check) and twice in a child it forks then
(born after, ARRAY with max_entries 0, array_map_alloc_check). The agent runs the issue's probe set in the
kernel's default attach mode and one more set per other attach mode the kernel has, all on the same functions:
each counts every call exactly. Then a SIGHUP: right after "config reloaded" the workload runs again, and each
set's counters go on from where they were (no call lost, none counted twice). Last, `trace`: the workload waits
for its "Receiving data..." line. Host-side assertions: tests/vm/test_agent_ready.py.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

from tests.vm.guest_batch import budget

PY = sys.executable
PORT = 29475
MODE_FEATURE = {"fentry": "fentry", "kprobe": "kprobes", "kprobe_multi": "kprobe_multi",
                "kprobe_session": "kprobe_session", "fsession": "fsession", "fsession_multi": "fsession_multi"}
GLOBS = """    entry: ["*sys_bpf"]
    allow: ["htab_map_alloc_check", "array_map_alloc_check"]
"""
WORKLOAD = ["htab", "3", "array", "2"]  # 5 failing sessions per run of the workload


def _config(spans: Path, modes: list[str]) -> str:
    sets = "".join(f"  - name: maps_{m}\n{GLOBS}    attach_mode: {m}\n" for m in modes)
    return (f"probe_sets:\n  - name: maps\n{GLOBS}{sets}exporter:\n  file: {spans}\n"
            f'metrics:\n  listen: "127.0.0.1:{PORT}"\nlogging:\n  format: json\n')


def _build(ctx) -> str:
    exe = Path(ctx.tmpdir) / "map_fail"
    rc, _, err = ctx.run(["gcc", "-O1", "-Wall", "-o", str(exe), str(Path(ctx.cwd) / "tests/native/map_fail.c")],
                         timeout=600)
    if rc != 0:
        raise RuntimeError(f"gcc failed: {err[-2000:]}")
    return str(exe)


def _modes(ctx) -> list[str]:
    rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "features", "--json"], timeout=600)
    if rc != 0:
        raise RuntimeError(f"features --json failed ({rc}): {err[-2000:]}")
    feats = json.loads(out)["features"]
    return [m for m, f in MODE_FEATURE.items() if feats[f]["available"]]


def _scrape() -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=60) as resp:
        return resp.read().decode()


def _healthz() -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/healthz", timeout=60) as resp:
        return {"status": resp.status, "body": json.loads(resp.read())}


def _spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    out.extend(ss["spans"])
    return out


def _wait_spans(path: Path, roots: int, timeout: float) -> list[dict]:
    """Until the file holds `roots` root spans, or `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        spans = _spans(path)
        if sum(1 for s in spans if not s.get("parentSpanId")) >= roots or time.monotonic() > deadline:
            return spans
        time.sleep(1)


def _exported(spans: list[dict]) -> dict:
    """Root spans, and error leaves by function name."""
    leaves: dict[str, int] = {}
    for s in spans:
        if s["name"] in ("htab_map_alloc_check", "array_map_alloc_check"):
            leaves[s["name"]] = leaves.get(s["name"], 0) + 1
    return {"roots": sum(1 for s in spans if not s.get("parentSpanId")), "leaves": leaves}


@budget(700)
def scenario_agent_ready(ctx) -> dict:
    r: dict = {}
    exe = _build(ctx)
    modes = _modes(ctx)
    r["modes"] = modes
    spans_file = Path(ctx.tmpdir) / "spans.jsonl"
    cfg = Path(ctx.tmpdir) / "agent.yaml"
    cfg.write_text(_config(spans_file, modes))
    sets = 1 + len(modes)
    # born before the agent: it connects every millisecond and fails its calls as soon as one is accepted
    waiter = ctx.spawn([exe, "--wait-port", str(PORT), *WORKLOAD])
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg)])
    try:
        waiter.wait_for_line(r"^ready", timeout=900)
        r["first_healthz"] = _healthz()
        waiter.wait(120)
        r["start_workload"] = waiter.output()
        r["start_spans"] = _exported(_wait_spans(spans_file, 5 * sets, timeout=300))
        r["start_metrics"] = _scrape()

        agent.skip_output()
        agent.popen.send_signal(signal.SIGHUP)
        agent.wait_for_line(r"config reloaded", timeout=600)
        rc, out, err = ctx.run([exe, *WORKLOAD], timeout=120)  # born after the reload said it was done
        r["reload_workload"] = {"rc": rc, "out": out, "err": err}
        r["reload_spans"] = _exported(_wait_spans(spans_file, 10 * sets, timeout=300))
        r["reload_metrics"] = _scrape()
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        r["agent_log"] = agent.output()[-20000:]
        if waiter.returncode is None:
            waiter.terminate(timeout=10)

    # trace: "Receiving data..." in its output file is the workload's signal
    out_file = Path(ctx.tmpdir) / "trace.txt"
    waiter = ctx.spawn([exe, "--wait-file", str(out_file), "Receiving data", *WORKLOAD])
    tracer = ctx.spawn(f"exec {PY} -m retsnoop_otel trace -e '*sys_bpf' -a htab_map_alloc_check "
                       f"-a array_map_alloc_check > {out_file} 2>&1")
    try:
        waiter.wait_for_line(r"^ready", timeout=900)
        waiter.wait(120)
        r["trace_workload"] = waiter.output()
        deadline = time.monotonic() + 300
        while out_file.read_text().count("TID/PID") < 5 and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)  # a sixth session would show by now
    finally:
        r["trace_rc"] = tracer.terminate(timeout=300)
        r["trace_output"] = out_file.read_text() if out_file.exists() else ""
        if waiter.returncode is None:
            waiter.terminate(timeout=10)
    return r

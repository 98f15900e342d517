"""Guest side of the agent checks (issue 5): two probe sets exporting to a real OTLP/gRPC receiver.

One agent run does everything that needs a running agent (guest Python start-up costs 30-60 s):
--check, capture of two simfail cases, /healthz and /metrics, a SIGHUP with a broken config (the
old probe sets must keep exporting), SIGTERM (nothing left attached). A second short run is
SIGKILLed to show that the kernel drops the attachments with the process. Host-side assertions:
tests/vm/test_agent.py.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.otlp_json import spans as otlp_spans
from tests.vm.guest_batch import budget
from tests.vm.traced_run import agent_outputs, our_progs

PY = sys.executable
METRICS_PORT = 9471

CONFIG = """
probe_sets:
  - name: bpf_errors
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    mode: stack
    filters:
      deny_errors: [ENOENT]   # bpftool's id walks end with ENOENT
  - name: prog_load
    entry: [bpf_prog_load]
    allow: [bpf_check, "bpf_prog_alloc*", bpf_obj_name_cpy]
    mode: calls
    filters:
      comms: [python]         # simfail, not bpftool's own iterator programs
    sampling:
      success_probability: 1.0
""" + agent_outputs("http://127.0.0.1:{port}") + "{vmlinux}"

BROKEN = CONFIG.replace("    mode: stack\n", "    mode: stack\n    bogus_key: 1\n", 1)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _requests(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _roots(requests: list[dict]) -> list[tuple[str, str]]:
    return [(s["name"], s["attrs"].get("error.type", "")) for s in otlp_spans(requests) if not s["parent"]]


def _wait_roots(path: Path, want: dict[tuple[str, str], int], timeout: float) -> list[dict]:
    """Wait until the received root spans include at least `want` (name, error.type) -> count."""
    deadline = time.monotonic() + timeout
    while True:
        reqs = _requests(path)
        roots = _roots(reqs)
        if all(roots.count(k) >= n for k, n in want.items()) or time.monotonic() > deadline:
            return reqs
        time.sleep(1)


def _wait_no_progs(ctx, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = our_progs(ctx)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(2)


def _simfail_mix(ctx, out_file: Path) -> tuple[dict, list[tuple[str, str]]]:
    """One failing map creation and one successful program load; waits for both traces to arrive."""
    t0 = time.time_ns()
    rc, sout, serr = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array",
                              "bpf-simple-obj"], 180)
    run = {"rc": rc, "out": sout, "err": serr, "start_ns": t0, "end_ns": time.time_ns()}
    reqs = _wait_roots(out_file, {("__x64_sys_bpf", "EINVAL"): 1, ("bpf_prog_load", ""): 1}, timeout=240)
    return run, _roots(reqs)


@budget(500)
def scenario_agent_two_probe_sets(ctx) -> dict:
    r: dict = {}
    out_file = Path(ctx.tmpdir) / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY (\d+)", timeout=240).group(1))
    cfg_path = Path(ctx.tmpdir) / "agent.yaml"
    # with the kernel's DWARF (6.1), spans also carry code.file.path / code.line.number
    vmlinux = f"vmlinux: {ctx.vmlinux}\n" if ctx.vmlinux else ""
    cfg_text = CONFIG.format(port=port, metrics_port=METRICS_PORT, vmlinux=vmlinux)
    cfg_path.write_text(cfg_text)

    rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "agent", "--check", str(cfg_path)], timeout=600)
    r["check"] = {"rc": rc, "out": out, "err": err}
    ctx.log(f"--check rc {rc}")

    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg_path)])
    try:
        agent.wait_for_line(r'"agent started"', timeout=400)
        r["progs_while_attached"] = our_progs(ctx)
        r["healthz"] = _get(f"http://127.0.0.1:{METRICS_PORT}/healthz")
        r["simfail1"], r["roots_after_simfail1"] = _simfail_mix(ctx, out_file)
        ctx.log(f"roots after simfail 1: {r['roots_after_simfail1']}")
        r["metrics"] = _get(f"http://127.0.0.1:{METRICS_PORT}/metrics")
        req = urllib.request.Request(f"http://127.0.0.1:{METRICS_PORT}/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            r["openmetrics"] = [resp.headers.get("Content-Type"), resp.read().decode()[-3000:]]

        # a broken config on SIGHUP: reported, the running probe sets keep exporting
        cfg_path.write_text(BROKEN.format(port=port, metrics_port=METRICS_PORT, vmlinux=vmlinux))
        agent.popen.send_signal(signal.SIGHUP)
        agent.wait_for_line(r'"config reload failed', timeout=120)
        rc, sout, serr = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 180)
        r["simfail2"] = {"rc": rc, "out": sout, "err": serr}
        reqs = _wait_roots(out_file, {("__x64_sys_bpf", "EINVAL"): 2}, timeout=240)
        r["roots_after_reload"] = _roots(reqs)
        _, r["metrics_after_reload"] = _get(f"http://127.0.0.1:{METRICS_PORT}/metrics")
        r["progs_after_reload"] = our_progs(ctx)
    finally:
        t0 = time.monotonic()
        r["agent_rc"] = agent.terminate(timeout=300)
        r["stop_s"] = time.monotonic() - t0
        r["agent_output"] = agent.output()[-20000:]
    r["progs_after_sigterm"] = _wait_no_progs(ctx, 30)
    r["otlp"] = _requests(out_file)
    receiver.terminate(timeout=30)

    # second, short run: SIGKILL must not leave anything attached either
    cfg_path.write_text(cfg_text)
    agent2 = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg_path)])
    try:
        agent2.wait_for_line(r'"agent started"', timeout=400)
        r["progs_before_sigkill"] = our_progs(ctx)
    finally:
        r["sigkill_rc"] = agent2.kill()
    r["progs_after_sigkill"] = _wait_no_progs(ctx, 60)
    r["http"] = _http_run(ctx, vmlinux)
    return r


def _http_run(ctx, vmlinux: str) -> dict:
    """The same two probe sets exporting over OTLP/HTTP (protobuf) to the receiver's HTTP port."""
    r: dict = {}
    out_file = Path(ctx.tmpdir) / "otlp-http.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)])
    http_port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=240).group(1))
    cfg = CONFIG.format(port=http_port, metrics_port=METRICS_PORT + 1, vmlinux=vmlinux)
    cfg = cfg.replace("protocol: grpc", "protocol: http/protobuf")
    cfg_path = Path(ctx.tmpdir) / "agent-http.yaml"
    cfg_path.write_text(cfg)
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg_path)])
    try:
        agent.wait_for_line(r'"agent started"', timeout=400)
        r["simfail"], r["roots"] = _simfail_mix(ctx, out_file)
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        r["agent_output"] = agent.output()[-10000:]
    r["progs_after_sigterm"] = _wait_no_progs(ctx, 30)
    r["otlp"] = _requests(out_file)
    receiver.terminate(timeout=30)
    return r

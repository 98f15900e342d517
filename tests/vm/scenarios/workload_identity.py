"""Guest side of the workload identity checks (issue 12, item 1): which container and pod each session ran in.

Real cgroup v2 directories in each supported layout (containerd, CRI-O, Docker, Podman; systemd and
cgroupfs drivers; a Guaranteed pod; a conmon scope that is not the container), with container and pod ids
of the real formats (those of tests/fixtures/k8s), plus a named cgroup v1 hierarchy for the v1 fallback.
The bundled workload runs in each (`sh` writes its pid into cgroup.procs, then execs `python -m
retsnoop_otel simfail bpf-bad-map-max-entries-array`). One agent exports to a real OTLP receiver (OTLP/HTTP,
the default protocol), with the pod metadata watch pointed at tests/fake_apiserver.py over HTTPS (a CA made
here, a bearer token file) serving the recorded pod list and watch events. Host-side assertions:
tests/vm/test_workload_identity.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from tests.fake_apiserver import FIXTURES, make_test_ca
from tests.otlp_json import spans as otlp_spans
from tests.procs import remove_cgroups
from tests.vm.scenarios.filters import CGROUP_ROOT, _cgroup_mount

PY = sys.executable
METRICS_PORT = 9491
CHECKOUT_UID = "6f1b6c5e-2a4d-4a8e-9c3b-0f2e1d4c5b6a"  # pods_list.json: shop/checkout, container app
APP_ID = "3a8f1c4b2d9e7f6051a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8"
COREDNS_UID = "b8e4c2a1-7f3d-4e6b-a9c5-d1f0e2b3c4a5"  # kube-system/coredns (CRI-O), deleted by the watch events
COREDNS_ID = "5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d"
WEB_UID = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"  # shop/web: known only from the watch (ADDED, then MODIFIED)
WEB_ID = "7f6e5d4c3b2a19080f7e6d5c4b3a29180e4b0f6b9d3c1a2f8e7d6c5b4a392817"
DOCKER_ID = "9f4e2c7b1a8d3e6f0c5b2a9d8e7f6c5b4a3d2e1f0c9b8a7d6e5f4c3b2a1d0e9f"
DOCKERFS_ID = "0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e"
PODMAN_ID = "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2"
ROOTLESS_ID = "b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3"
CONMON_ID = "c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4"
V1_ID = "d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5"


def _slice(uid: str, qos: str = "burstable") -> str:
    pod = f"kubepods-{qos}-pod{uid.replace('-', '_')}.slice" if qos else f"kubepods-pod{uid.replace('-', '_')}.slice"
    return f"kubepods.slice/kubepods-{qos}.slice/{pod}" if qos else f"kubepods.slice/{pod}"


# layout -> cgroup v2 path (below the mount)
LAYOUTS = {
    "containerd_systemd": f"{_slice(CHECKOUT_UID)}/cri-containerd-{APP_ID}.scope",
    "crio_systemd_guaranteed": f"{_slice(COREDNS_UID, '')}/crio-{COREDNS_ID}.scope",
    "containerd_cgroupfs": f"kubepods/besteffort/pod{WEB_UID}/{WEB_ID}",
    "crio_conmon": f"{_slice(CHECKOUT_UID)}/crio-conmon-{CONMON_ID}.scope",
    "docker_systemd": f"system.slice/docker-{DOCKER_ID}.scope",
    "docker_cgroupfs": f"docker/{DOCKERFS_ID}",
    "podman_rootful_nested": f"machine.slice/libpod-{PODMAN_ID}.scope/container",
    "podman_rootless": f"user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ROOTLESS_ID}.scope",
}
V1_NAME = "retsnoop_test"  # a named cgroup v1 hierarchy (no controllers)
V1_PATH = f"docker/{V1_ID}"

CONFIG = """
probe_sets:
  - name: workloads
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    app_context: false
    filters:
      comms: [python]
  - name: per_namespace  # the same calls counted in the kernel per cgroup, exposed per namespace
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    mode: metrics
    workload_label: namespace
    filters:
      comms: [python]
exporter:
  otlp:
    endpoint: http://127.0.0.1:{port}
metrics:
  listen: "127.0.0.1:{metrics_port}"
kubernetes:
  metadata: true
  node_name: node-a
  api_server: https://127.0.0.1:{api_port}
  token_file: {token}
  ca_file: {ca}
logging:
  format: json
"""


def _roots(path: Path) -> list[dict]:
    """Root spans of everything received: their resource, pid and executable name."""
    if not path.exists():
        return []
    requests = [json.loads(line) for line in path.read_text().splitlines()]
    return [{"name": s["name"], "pid": int(s["attrs"].get("process.pid", 0)),
             "exe": s["attrs"].get("process.executable.name"), "error": s["attrs"].get("error.type"),
             "resource": s["resource"]} for s in otlp_spans(requests) if not s["parent"]]


def _mount_v1(ctx, where: Path) -> str:
    where.mkdir(parents=True, exist_ok=True)
    rc, _, err = ctx.run(["mount", "-t", "cgroup", "-o", f"none,name={V1_NAME}", "cgroup", str(where)], timeout=60)
    return "ok" if rc == 0 else f"mount failed ({rc}): {err.strip()}"


def _run_in(ctx, procs_files: list[Path], *after: str) -> tuple[int, int, str]:
    """The workload in the given cgroups (their cgroup.procs files): (pid, rc, output)."""
    joins = "".join(f"echo $$ > {f} && " for f in procs_files)
    proc = ctx.spawn(f"{joins}exec {PY} -m retsnoop_otel simfail bpf-bad-map-max-entries-array {' '.join(after)}")
    deadline = time.monotonic() + 180
    while proc.returncode is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc.pid, proc.returncode if proc.returncode is not None else -999, proc.output()[-500:]


def scenario_workload_identity(ctx) -> dict:
    t0 = time.monotonic()
    r: dict = {"cgroup_mount": _cgroup_mount(ctx), "layouts": LAYOUTS}
    tmp = Path(ctx.tmpdir)
    made: list[Path] = []
    for rel in LAYOUTS.values():
        d = CGROUP_ROOT
        for part in rel.split("/"):
            d = d / part
            if not d.exists():
                d.mkdir()
                made.append(d)
    v1_root = tmp / "v1"
    r["v1_mount"] = _mount_v1(ctx, v1_root)
    if r["v1_mount"] == "ok":
        (v1_root / V1_PATH).mkdir(parents=True)

    certs = make_test_ca(tmp)
    token = tmp / "token"
    token.write_text("eyJhbGciOiJSUzI1NiIsImtpZCI6InZtIn0.workload-identity\n")
    api = ctx.spawn([PY, "-m", "tests.fake_apiserver", "--port", "0", "--list", str(FIXTURES / "pods_list.json"),
                     "--watch", str(FIXTURES / "watch_events.jsonl"), "--token-file", str(token),
                     "--cert", certs["server.pem"], "--key", certs["server.key"]])
    out_file = tmp / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)])
    api_port = int(api.wait_for_line(r"READY (\d+)", timeout=240).group(1))
    port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=240).group(1))  # the default: OTLP/HTTP
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG.format(port=port, metrics_port=METRICS_PORT, api_port=api_port, token=token,
                                 ca=certs["ca.pem"]))
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg)], env={"K8S_NODE_NAME": "node-a"})
    try:
        agent.wait_for_line(r'"agent started"', timeout=400)
        # the watch is current once it listed and its first watch (from the list's version) got the events
        api.wait_for_line(r"REQUEST list", timeout=300)
        api.wait_for_line(r"REQUEST watch 1000", timeout=300)
        time.sleep(2)  # the four recorded events are applied as they are read
        r["agent_start_s"] = round(time.monotonic() - t0, 1)
        runs = {}
        for name, rel in LAYOUTS.items():
            runs[name] = _run_in(ctx, [CGROUP_ROOT / rel / "cgroup.procs"])
        if r["v1_mount"] == "ok":  # the process's v2 cgroup names nothing: only its v1 line does, which the agent
            # reads from the live process (a v2 cgroup is also found after its process exited): it stays a second
            runs["v1_named_docker"] = _run_in(ctx, [v1_root / V1_PATH / "cgroup.procs"], "syscall-long-sleep")
        r["runs"] = {n: {"pid": p, "rc": rc, "out": out} for n, (p, rc, out) in runs.items()}
        pids = {p for p, _, _ in runs.values()}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            roots = _roots(out_file)
            if pids <= {x["pid"] for x in roots if x["error"] == "EINVAL"}:
                break
            time.sleep(1)
        r["roots"] = _roots(out_file)
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=60) as resp:
            text = resp.read().decode().splitlines()
        r["metrics"] = [x for x in text if x.startswith("retsnoop_k8s")]
        r["workload_metrics"] = [x for x in text if 'probe_set="per_namespace"' in x and x.startswith(
            ("retsnoop_function_errors_total{", "retsnoop_sessions_total{", "retsnoop_workload_counts_dropped"))]
    finally:
        r["agent_rc"] = agent.terminate(timeout=120)
        r["agent_log"] = [x for x in agent.output().splitlines() if "pod metadata" in x or '"level": "error"' in x]
        api.terminate(timeout=30)
        receiver.terminate(timeout=30)
        remove_cgroups(list(reversed(made)))
        if r["v1_mount"] == "ok":
            (v1_root / V1_PATH).rmdir()
            (v1_root / "docker").rmdir()
            ctx.run(["umount", str(v1_root)], timeout=60)
    r["guest_seconds"] = round(time.monotonic() - t0, 1)
    r["proc_self_cgroup"] = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    return r

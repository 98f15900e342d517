"""Guest side of issue 33 point 6: processes started after the agent join their traces from their first request.

One agent run (thread context read, no user stacks: nothing slow on its loop) with a real OTLP/gRPC receiver and a
comm filter; started after it:
- a C writer whose TLSDESC library (linked at start) holds the variable (tests/native/ctx_writer.c -DCTX_LIB):
  the scenario waits until the agent says it located the process from its exec (its debug log), then the writer's
  two threads make their first failing call;
- the same program under a name the filter leaves out (`bystander`): its exec must not be watched;
- a Python service with the OTel SDK and the publisher (tests/otel_service.py), which loads the publisher's library
  while it imports (well after its exec) and makes its first failing request as soon as its SDK is set up: nothing
  waits for the agent there.
Host-side assertions: tests/vm/test_app_exec.py.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path

from tests.vm.guest_batch import budget
from tests.vm.traced_run import our_progs

PY = sys.executable  # comm "python": the filter names it
METRICS_PORT = 9482
REQUESTS = 3
CONFIG = """
probe_sets:
  - name: app
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    app_context: true
    filters:
      comms: [writer_lib, python]
exporter:
  otlp:
    endpoint: http://127.0.0.1:{port}
    protocol: grpc  # the receiver's gRPC port (http/protobuf is the default)
metrics:
  listen: "127.0.0.1:{metrics_port}"
logging:
  format: json
  level: debug
"""
# prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, addr, len, "OTEL_CTX"): the other way a process context is published (the
# kernel may refuse the name, CONFIG_ANON_VMA_NAME; the hook sees the call at its entry either way)
VMA_NAMER = """
import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
m = mmap.mmap(-1, 4096)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
rc = libc.prctl(0x53564D41, 0, ctypes.c_ulong(addr), ctypes.c_ulong(4096), ctypes.c_char_p(b"OTEL_CTX"))
print(f"named pid={os.getpid()} rc={rc} errno={ctypes.get_errno()}", flush=True)
time.sleep(3)
"""
WATCHED = "exec'd process watched for thread context"
PUBLISHED = "process published its process context"  # appctx/watch.py PUBLISHED


def build(ctx, out: Path) -> dict[str, str]:
    """The writer of tests/native with its TLSDESC library, and a copy under another name; gcc is the host's."""
    src = Path(ctx.cwd) / "tests" / "native"
    cc = ["gcc", "-O1", "-g", "-Wall"]
    steps = [
        [*cc, "-shared", "-fPIC", "-mtls-dialect=gnu2", "-o", str(out / "libctxlib.so"), str(src / "ctxlib.c")],
        [*cc, "-DCTX_LIB", "-o", str(out / "writer_lib"), str(src / "ctx_writer.c"), f"-L{out}", "-lctxlib",
         f"-Wl,-rpath,{out}", "-lpthread", "-ldl"],
        ["cp", str(out / "writer_lib"), str(out / "bystander")],
    ]
    for cmd in steps:
        rc, _, err = ctx.run(cmd, timeout=600)
        if rc != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {err[-2000:]}")
    return {"writer": str(out / "writer_lib"), "bystander": str(out / "bystander")}


def watches(agent_output: str, what: str = WATCHED) -> list[dict]:
    """The agent's debug lines that end an exec watch (pid, outcome, checks, after_exec_s), or another kind."""
    out = []
    for line in agent_output.splitlines():
        if what in line and line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _wait_watch(agent, pid: int, timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [w for w in watches(agent.output()) if w.get("pid") == pid]
        if found:
            return found[0]
        time.sleep(0.5)
    return None


def _kernel_roots(path: Path) -> int:
    return path.read_text().count('"name": "__x64_sys_bpf"') if path.exists() else 0


def _wait_roots(path: Path, want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _kernel_roots(path) < want:
        time.sleep(2)
    return _kernel_roots(path)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return resp.read().decode()


@budget(500)
def scenario_app_exec(ctx) -> dict:
    r: dict = {}
    tmp = Path(ctx.tmpdir)
    t0 = time.monotonic()
    bins = build(ctx, tmp)
    out_file = tmp / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY (\d+)", timeout=240).group(1))
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG.format(port=port, metrics_port=METRICS_PORT))
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg)])
    writer = bystander = None
    try:
        agent.wait_for_line(r'"agent started"', timeout=400)
        ctx.log(f"agent started at {time.monotonic() - t0:.0f} s")
        # how the publish hooks attached: kprobes where the kernel has kprobe.multi, syscall tracepoints elsewhere
        r["publish_prog_types"] = sorted({p["type"] for p in ctx.bpf_prog_ids() if p["name"].startswith("app_pub")})

        writer = ctx.spawn([bins["writer"], "valid", "2", "bpf"], stdin=True)
        ready = writer.wait_for_line(r"^ready pid=(\d+)", timeout=120)
        r["writer_pid"] = int(ready.group(1))
        # no session of the writer has run: only its exec can have brought it to the agent
        r["writer_watch"] = _wait_watch(agent, r["writer_pid"], timeout=180)
        ctx.log(f"writer watch: {r['writer_watch']}")
        writer.send("go")
        writer.wait_for_line(r"^done 1$", timeout=300)
        r["writer_rounds"] = [x for x in writer.output().splitlines() if x.startswith("round 1 ")]

        bystander = ctx.spawn([bins["bystander"], "valid", "1", "bpf"], stdin=True)
        r["bystander_pid"] = int(bystander.wait_for_line(r"^ready pid=(\d+)", timeout=120).group(1))

        namer = ctx.spawn([PY, "-c", VMA_NAMER])
        r["vma_namer_pid"] = int(namer.wait_for_line(r"^named pid=(\d+)", timeout=120).group(1))
        namer.popen.wait(120)

        svc_env = {"OTEL_PYTHON_CONTEXT": "retsnoop_thread_ctx", "OTEL_SERVICE_NAME": "orders-service",
                   "RETSNOOP_OTEL_THREAD_ATTRIBUTES": "user.id"}
        svc = ctx.spawn([PY, "-m", "tests.otel_service", "--endpoint", f"127.0.0.1:{port}", "--requests",
                         str(REQUESTS), "--interval", "1"], env=svc_env)
        r["service_rc"] = svc.popen.wait(900)
        time.sleep(1)
        r["service_output"] = svc.output()
        info = next((json.loads(x) for x in r["service_output"].splitlines() if x.startswith('{"pid"')), {})
        r["service_pid"] = info.get("pid")
        r["service_watch"] = _wait_watch(agent, r["service_pid"], timeout=5) if r["service_pid"] else None
        r["kernel_roots"] = _wait_roots(out_file, 2 + REQUESTS, timeout=300)
        r["metrics"] = _metrics(METRICS_PORT)
        ctx.log(f"{r['kernel_roots']} kernel root spans received at {time.monotonic() - t0:.0f} s")
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        r["agent_output"] = agent.output()[-200000:]
        for p in (writer, bystander):
            if p is not None:
                p.terminate(timeout=10)
    r["watches"] = watches(r["agent_output"])
    r["published"] = watches(r["agent_output"], PUBLISHED)
    r["progs_after_stop"] = our_progs(ctx)
    receiver.terminate(timeout=30)
    r["otlp"] = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip()] if out_file.exists() else []
    r["exec_watch_metric"] = re.findall(r"^retsnoop_app_context_exec_watches_total\{.*$", r.get("metrics", ""), re.M)
    return r

"""Guest side of the thread-context checks (issue 11): kernel sessions inside the application's trace.

One agent run exporting to a real OTLP receiver over OTLP/HTTP (the default protocol); its probe set `app`
(user stacks on) sees:
- C writers (tests/native/ctx_writer.c) started before the agent: TLS in the executable (-rdynamic) with
  two threads, and the unusable cases (valid = 0, NULL pointer, unmapped pointer, record paged out,
  corrupt attrs-data-size in a TLSDESC library);
- a TLSDESC-library writer started after the agent (its first round is linked if the agent located it from
  its exec in time, else it only makes the agent look: tests/vm/scenarios/app_exec.py waits for that);
- short-lived writers that exit right after their call (gone before the agent can look);
- a Python service with the OTel SDK and the publisher, exporting its own spans to the same
  receiver over gRPC.
Three more probe sets of the same run see only `cost_writer` (a copy of the writer) and measure the kernel
side's cost with bpf_stats, side by side: no context read, the read, the read plus user stacks.
Host-side assertions: tests/vm/test_app_context.py.
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

PY = sys.executable  # comm "python": the comm filter below names it
METRICS_PORT = 9481
BEFORE = {"two": ("exe", "valid", 2), "invalid": ("exe", "invalid", 1), "null": ("exe", "null", 1),
          "badptr": ("exe", "badptr", 1), "pagedout": ("exe", "pagedout", 1), "bigsize": ("lib", "bigsize", 1)}
COST_ROUNDS = 200

COST_SETS = (("plain", "false", "false"), ("context", "true", "false"), ("context_ustack", "true", "true"))
CONFIG = """
probe_sets:
  - name: app
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    user_stacks: true
    filters:
      comms: [writer_exe, writer_lib, python]
""" + "".join(f"""  - name: {name}
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    app_context: {ctx}
    user_stacks: {stacks}
    filters:
      comms: [cost_writer]
""" for name, ctx, stacks in COST_SETS) + """exporter:
  otlp:
    endpoint: http://127.0.0.1:{port}
metrics:
  listen: "127.0.0.1:{metrics_port}"
limits:
  user_stack_wait_s: 60
logging:
  format: json
  level: debug
"""


def build_writers(ctx, out: Path) -> dict[str, str]:
    """The C writers of tests/native, built here: gcc is in the guest's (the host's) root."""
    src = Path(ctx.cwd) / "tests" / "native"
    cc = ["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall"]
    steps = [  # the cost writer: the same program under another name (comm), for the cost probe sets
        [*cc, "-shared", "-fPIC", "-mtls-dialect=gnu2", "-o", str(out / "libctxlib.so"), str(src / "ctxlib.c")],
        [*cc, "-rdynamic", "-o", str(out / "writer_exe"), str(src / "ctx_writer.c"), "-lpthread", "-ldl"],
        [*cc, "-DCTX_LIB", "-o", str(out / "writer_lib"), str(src / "ctx_writer.c"), f"-L{out}", "-lctxlib",
         f"-Wl,-rpath,{out}", "-lpthread", "-ldl"],
        ["cp", str(out / "writer_exe"), str(out / "cost_writer")],
    ]
    for cmd in steps:
        rc, _, err = ctx.run(cmd, timeout=600)
        if rc != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {err[-2000:]}")
    return {"exe": str(out / "writer_exe"), "lib": str(out / "writer_lib"), "cost": str(out / "cost_writer")}


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return resp.read().decode()


def _counter(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_metric(port: int, name: str, at_least: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = _counter(_metrics(port), name)
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(2)


def _round(writer, n: int) -> list[str]:
    """Send one round to a writer; its per-thread lines."""
    writer.send("go")
    m = writer.wait_for_line(rf"^done {n}$", timeout=300)
    lines = [x for x in writer.output().splitlines() if x.startswith(f"round {n} ")]
    return lines if m else []


def _kernel_roots(path: Path) -> int:
    n = 0
    if path.exists():
        for line in path.read_text().splitlines():
            n += line.count('"name": "__x64_sys_bpf"')
    return n


def _wait_roots(path: Path, want: int, timeout: float, settle: float = 90) -> int:
    """Until `want` kernel root spans arrived, or none arrived for `settle` seconds (or `timeout`)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = _kernel_roots(path)
        if n >= want:
            return n
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > settle:
            break
        time.sleep(2)
    return _kernel_roots(path)


@budget(900)
def scenario_app_context(ctx) -> dict:
    r: dict = {}
    tmp = Path(ctx.tmpdir)
    t0 = time.monotonic()
    bins = build_writers(ctx, tmp)
    ctx.log(f"writers built in {time.monotonic() - t0:.0f} s")
    out_file = tmp / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)])
    ready = receiver.wait_for_line(r"READY (\d+) HTTP (\d+)", timeout=240)
    port, http_port = int(ready.group(1)), int(ready.group(2))  # the service's SDK: gRPC; the agent: OTLP/HTTP
    before = {}
    for name, (variant, mode, threads) in BEFORE.items():
        before[name] = ctx.spawn([bins[variant], mode, str(threads), "bpf"], stdin=True)
        before[name].wait_for_line(r"^ready pid=", timeout=120)
    cost_writer = ctx.spawn([bins["cost"], "valid", "1", "bpf"], stdin=True)
    cost_writer.wait_for_line(r"^ready pid=", timeout=120)
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG.format(port=http_port, metrics_port=METRICS_PORT))
    sysctl = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = sysctl.read_text().strip()
    sysctl.write_text("1")
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg)])
    try:
        agent.wait_for_line(r'"agent started"', timeout=400)
        ctx.log(f"agent started at {time.monotonic() - t0:.0f} s")
        # the processes running at start are checked in the background: the six writers and the cost writer
        r["publishing_at_start"] = _wait_metric(METRICS_PORT, "retsnoop_app_context_processes_publishing_total",
                                                len(BEFORE) + 1, timeout=300)
        r["before"] = {name: {"pid": w.pid, "rounds": _round(w, 1)} for name, w in before.items()}
        ctx.log(f"writers running at start: {r['publishing_at_start']} publishing; one round each done")

        after = ctx.spawn([bins["lib"], "valid", "2", "bpf"], stdin=True)
        after.wait_for_line(r"^ready pid=", timeout=120)
        r["after"] = {"pid": after.pid, "round1": _round(after, 1)}
        r["publishing_after"] = _wait_metric(METRICS_PORT, "retsnoop_app_context_processes_publishing_total",
                                             len(BEFORE) + 2, timeout=300)
        r["after"]["round2"] = _round(after, 2)

        r["short_lived"] = []
        for _ in range(3):
            rc, out, err = ctx.run([bins["exe"], "valid", "1", "bpf", "1"], timeout=120)
            r["short_lived"].append({"rc": rc, "out": out, "err": err})
        for n in range(1, COST_ROUNDS + 1):
            cost_writer.send("go")
            cost_writer.wait_for_line(rf"^done {n}$", timeout=120)
        ctx.log(f"short-lived and cost rounds done at {time.monotonic() - t0:.0f} s")

        # a Python service born now, once the agent has caught up (under TCG, symbolizing the writers'
        # first user stacks takes tens of seconds: sessions wait for them, limits.user_stack_wait_s above)
        _wait_roots(out_file, sum(t for _, _, t in BEFORE.values()) + 2 + 2 + 3 + 3 * COST_ROUNDS, timeout=300)
        svc_env = {"OTEL_PYTHON_CONTEXT": "retsnoop_thread_ctx", "OTEL_SERVICE_NAME": "users-service",
                   "RETSNOOP_OTEL_THREAD_ATTRIBUTES": "user.id"}
        svc = ctx.spawn([PY, "-m", "tests.otel_service", "--endpoint", f"127.0.0.1:{port}", "--requests", "4",
                         "--interval", "3"], env=svc_env)

        r["service_rc"] = svc.popen.wait(900)
        time.sleep(1)
        r["service_output"] = svc.output()
        app_sessions = sum(t for _, _, t in BEFORE.values()) + 2 + 2 + 3 + 4
        r["kernel_roots"] = _wait_roots(out_file, app_sessions + 3 * COST_ROUNDS, timeout=300)
        r["metrics"] = _metrics(METRICS_PORT)
        ctx.log(f"{r['kernel_roots']} kernel root spans received at {time.monotonic() - t0:.0f} s")
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        r["agent_output"] = agent.output()[-30000:]
        sysctl.write_text(stats_before)
        for w in [*before.values(), cost_writer]:
            w.terminate(timeout=10)
    r["progs_after_stop"] = our_progs(ctx)
    receiver.terminate(timeout=30)
    r["otlp"] = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip()] if out_file.exists() else []
    r["cost_rounds"] = COST_ROUNDS
    return r

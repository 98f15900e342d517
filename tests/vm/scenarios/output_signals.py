"""Guest side of issue 47 point 2 on a real kernel: outputs and signals end `trace` the way Unix tools end.

- `head`: stdout's reader leaves once "Receiving data..." was read, then bpf() calls fail: exit 141, quiet, detached;
- `full`: stdout is /dev/full: one line on stderr, exit 1, detached;
- `sigint_attach`: Ctrl-C while about 1,700 functions load and attach: exit 130, nothing left attached;
- `sighup_running`: SIGHUP on a trace that captured a session: detach, flush ("DONE"), exit 0;
- `agent_sighup`: the agent still reloads on SIGHUP, then stops on SIGTERM with nothing left attached;
- `signal_before_wait`: a stop signal handled just before the capture loop's wait still ends that wait at once.
Host-side assertions: tests/vm/test_output_signals.py.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.vm.traced_run import our_progs, traced_run

PY = sys.executable
TRACE = [PY, "-m", "retsnoop_otel", "trace"]
SMALL = ["-e", "*sys_bpf", "-a", "array_map_alloc_check"]
# about 1,700 functions of the network stack: they barely fire in an idle guest while they load and attach
LARGE = ["-e", "*sys_bpf", "-a", "tcp_*", "-a", "ip*", "-a", "sock_*", "-a", "udp_*", "-a", "inet_*"]
WORKLOAD = [PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"]


def _read_line(stream, timeout: float) -> str:
    """One line of a pipe within `timeout` ('' at its end or when none came)."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = stream.fileno()
    while time.monotonic() < deadline and not buf.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace")


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int | None, float]:
    """(exit code or None when it had to be killed, seconds it took)."""
    t0 = time.monotonic()
    try:
        return proc.wait(timeout), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, time.monotonic() - t0


def scenario_streams_head(ctx) -> dict:
    """`trace ... | head -1`: the reader takes "Receiving data..." and leaves; bpf() calls then fail."""
    err_path = Path(ctx.tmpdir) / "err.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([*TRACE, *SMALL], stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                cwd=ctx.cwd)
    r: dict = {}
    try:
        r["first_line"] = _read_line(proc.stdout, timeout=400)
        r["progs_while_attached"] = our_progs(ctx)
    finally:
        proc.stdout.close()  # head has read its line and exited
    rc, out, werr = ctx.run(WORKLOAD, timeout=120)
    r["workload"] = {"rc": rc, "out": out, "err": werr}
    r["rc"], r["exit_s"] = _wait(proc, 400)
    r["stderr"] = err_path.read_text(errors="replace")
    time.sleep(1)
    r["progs_after"] = our_progs(ctx)
    return r


def scenario_streams_full(ctx) -> dict:
    """stdout is /dev/full: "Receiving data..." cannot be written; the run detaches and says so in one line."""
    with open("/dev/full", "wb") as full:
        proc = subprocess.Popen([*TRACE, *SMALL, "-v"], stdout=full, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, cwd=ctx.cwd)
    try:
        _, err = proc.communicate(timeout=600)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        rc = None
    time.sleep(1)
    return {"rc": rc, "stderr": err.decode(errors="replace"), "progs_after": our_progs(ctx)}


def scenario_streams_sigint_attach(ctx) -> dict:
    """Ctrl-C once about 1,700 functions were found, while they load and attach."""
    proc = ctx.spawn([*TRACE, *LARGE, "-v"])
    r: dict = {}
    # the list of functions is printed at once, just before the BPF object's load and the attach (seconds under
    # TCG): the signal is sent at once (a 2 s wait after it was past them on a quiet host)
    proc.wait_for_line(r"would attach \d+|retsnoop-otel: ", timeout=600)
    t0 = time.monotonic()
    r["rc"] = proc.terminate(timeout=600, sig=signal.SIGINT)
    r["exit_s"] = time.monotonic() - t0
    m = re.search(r"would attach (\d+)", proc.output())
    r["functions"] = int(m.group(1)) if m else 0
    r["output"] = proc.output()[-6000:]
    r["received"] = "Receiving data" in proc.output()
    r["attached"] = "Successfully attached" in proc.output()
    time.sleep(1)
    r["progs_after"] = our_progs(ctx)
    return r


def scenario_streams_sighup_running(ctx) -> dict:
    """SIGHUP on a trace that captured the failing call: a stop like SIGTERM's."""
    return traced_run(ctx, [*TRACE, *SMALL], WORKLOAD, r"array_map_alloc_check", settle_s=3, stop=signal.SIGHUP,
                      progs_while_attached=True)


AGENT_CONFIG = """\
probe_sets:
  - name: errs
    entry: ['*sys_bpf']
    allow: [array_map_alloc_check]
    mode: metrics
metrics:
  listen: 127.0.0.1:0
"""


def scenario_streams_agent_sighup(ctx) -> dict:
    """The agent reloads on SIGHUP (trace's stop is not the agent's), then stops on SIGTERM."""
    cfg = Path(ctx.tmpdir) / "agent.yaml"
    cfg.write_text(AGENT_CONFIG)
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg), "--no-watch-config"])
    r: dict = {}
    try:
        agent.wait_for_line(r"agent started|cannot start|invalid config", timeout=600)
        agent.popen.send_signal(signal.SIGHUP)
        r["reload_line"] = agent.wait_for_line(r"config reloaded|config reload failed", timeout=600).group(0)
        r["running_after_sighup"] = agent.popen.poll() is None
    finally:
        r["rc"] = agent.terminate(timeout=600)
        r["output"] = agent.output()[-6000:]
    time.sleep(1)
    r["progs_after"] = our_progs(ctx)
    return r


SIGNAL_BEFORE_WAIT = """
import json, os, signal, time
from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel.libbpf_ringbuf import RingBuffer
from retsnoop_otel.runtime.requests import Requests
rb = RingBuffer(bpfsys.map_create(27, 0, 0, 4096), lambda b: None)  # BPF_MAP_TYPE_RINGBUF, nothing writes to it
requests = Requests().install(reload=False)
os.kill(os.getpid(), signal.SIGTERM)  # handled here, in Python, before the wait: nothing left to interrupt it
t0 = time.monotonic(); rb.poll(30_000, requests.wake_fd); returned = time.monotonic() - t0
try:
    drained = not os.read(requests.wake_fd, 1)
except BlockingIOError:
    drained = True
t0 = time.monotonic(); rb.poll(300, requests.wake_fd); control = time.monotonic() - t0  # no signal: the full wait
print(json.dumps({"stop": requests.stop, "returned_s": returned, "drained": drained, "control_s": control}))
"""


def scenario_streams_signal_before_wait(ctx) -> dict:
    """The race the wakeup fd closes (runtime/requests.py): a SIGTERM whose handler ran before libbpf's epoll_wait
    interrupted nothing, and the stop waited out the poll's whole timeout."""
    proc = subprocess.run([PY, "-c", SIGNAL_BEFORE_WAIT], capture_output=True, text=True, timeout=240)
    found = json.loads(proc.stdout) if proc.returncode == 0 else {}
    return {"rc": proc.returncode, "err": proc.stderr[-3000:], **found}

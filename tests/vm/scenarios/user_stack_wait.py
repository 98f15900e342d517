"""Guest side of the user-stack wait (issue 33 point 5): the first user stack of a large binary does not hold up
the sessions behind it by more than limits.user_stack_wait_s.

One agent (user stacks on, a real OTLP/gRPC receiver in this process that notes when each request arrives) sees
two Python processes make failing bpf() calls: `ustk_small` (nothing loaded) and `ustk_large`, which loads
the largest libLLVM it finds (tens of thousands of dynamic symbols to parse: seconds under TCG). First the small
one calls until its stacks arrive symbolized (its ELF files parsed, llvm-symbolizer started): their export
delays (arrival minus the span's end) are the baseline. Then the large one calls once, and right after it the
small one four times: their delays are what the bound keeps in check. The large one then calls every few
seconds until its stack arrives symbolized, which says how long its first stack took.
Host-side assertions: tests/vm/test_user_stack_wait.py.
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import time
from pathlib import Path

from tests.otlp_json import spans as otlp_spans
from tests.vm.guest_batch import budget

PY = sys.executable
WAIT_S = 1.0
METRICS_PORT = 9483
AFTER = 4  # small-process calls right behind the large one's first
CONFIG = """
probe_sets:
  - name: ustacks
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    app_context: false
    user_stacks: true
    filters:
      comms: [ustk_small, ustk_large]
exporter:
  otlp:
    endpoint: http://127.0.0.1:{port}
    protocol: grpc  # the receiver's gRPC port (http/protobuf is the default)
metrics:
  listen: "127.0.0.1:{metrics_port}"
limits:
  user_stack_wait_s: {wait}
logging:
  format: json
"""
# a failing bpf(BPF_MAP_CREATE) (an array map with max_entries 0: -EINVAL in array_map_alloc_check) per line read
APP = r"""
import ctypes, os, sys
for lib in sys.argv[2:]:
    ctypes.CDLL(lib)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, sys.argv[1].encode(), 0, 0, 0)  # PR_SET_NAME: the comm the probe set filters on
attr = (ctypes.c_uint32 * 5)(2, 4, 4, 0, 0)
nr = {"x86_64": 321, "aarch64": 280}[os.uname().machine]
print("ready", os.getpid(), flush=True)
for n, _ in enumerate(sys.stdin, 1):
    rc = libc.syscall(nr, 0, attr, ctypes.sizeof(attr))
    print(f"done {n} rc={rc} errno={ctypes.get_errno()}", flush=True)
"""


def large_library() -> str:
    libs = glob.glob("/usr/lib/*/libLLVM-*.so*") + glob.glob("/usr/lib/*/libLLVM.so*")
    if not libs:
        raise RuntimeError("no libLLVM to load: install llvm (it also brings llvm-symbolizer)")
    return max(libs, key=os.path.getsize)


class Arrivals:
    """A receiver in this process that keeps each trace request with the wall-clock time it arrived."""

    def __init__(self) -> None:
        from google.protobuf.json_format import MessageToDict

        from tests.otlp_receiver import start_receiver
        self._to_dict = MessageToDict
        self.receiver = start_receiver(0)
        self.stamped: list[tuple[int, object]] = []
        self._lock = threading.Lock()
        store = self.receiver.store

        def stamped(request, headers=None):
            with self._lock:
                self.stamped.append((time.time_ns(), request))
            store(request, headers)
        self.receiver.store = stamped  # type: ignore[method-assign]

    def roots(self, comm: str) -> list[dict]:
        """Root spans of `comm`'s sessions in arrival order, each with `arrived_ns` and `delay_s`."""
        with self._lock:
            stamped = list(self.stamped)
        out = []
        for t, request in stamped:
            for s in otlp_spans([self._to_dict(request)]):
                if s["parent"] is None and s["attrs"].get("thread.name") == comm:
                    s["delay_s"] = (t - int(s["endTimeUnixNano"])) / 1e9
                    out.append(s)
        return out

    def wait_roots(self, comm: str, count: int, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(roots := self.roots(comm)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(roots)} of {count} sessions of {comm} arrived within {timeout:g} s")
            time.sleep(0.2)
        return roots


def _call(app, n: int) -> None:
    app.send("go")
    m = app.wait_for_line(rf"^done {n} rc=(-?\d+) errno=(\d+)$", timeout=120)
    if (m[1], m[2]) != ("-1", "22"):
        raise RuntimeError(f"call {n} did not fail with EINVAL: {m[0]}")


def _brief(s: dict) -> dict:
    return {"delay_s": round(s["delay_s"], 3), "unsymbolized": s["attrs"].get("retsnoop.user_stack_unsymbolized"),
            "stack": s["attrs"].get("retsnoop.user_stacktrace", "")}


@budget(400)
def scenario_user_stack_wait(ctx) -> dict:
    r: dict = {"wait_s": WAIT_S}
    tmp = Path(ctx.tmpdir)
    t0 = time.monotonic()
    arrivals = Arrivals()
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG.format(port=arrivals.receiver.port, metrics_port=METRICS_PORT, wait=WAIT_S))
    # spans leave at once rather than every 5 s: the delay measured is the agent's, not the batching's
    agent = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(cfg)], env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
    try:
        agent.wait_for_line(r'"agent started"', timeout=400)
        ctx.log(f"agent started at {time.monotonic() - t0:.0f} s")
        small = ctx.spawn([PY, "-c", APP, "ustk_small"], stdin=True)
        small.wait_for_line(r"^ready ", timeout=120)
        n, warm, since = 0, [], time.monotonic()
        # until three in a row came symbolized: its files are parsed, llvm-symbolizer runs (the worker may first
        # finish snapshots of the processes that ran at the agent's start)
        while len(warm) < 3:
            if time.monotonic() - since > 600:
                raise RuntimeError(f"the small process's stacks never came symbolized: {r.get('small_first')}")
            n += 1
            _call(small, n)
            last = arrivals.wait_roots("ustk_small", n, timeout=300)[-1]
            r.setdefault("small_first", _brief(last))
            warm = warm + [last] if "retsnoop.user_stack_unsymbolized" not in last["attrs"] else []
            time.sleep(1)
        r["baseline"] = [_brief(s) for s in warm]
        ctx.log(f"small process warm after {n} calls at {time.monotonic() - t0:.0f} s")

        r["large_library"] = large_library()
        large = ctx.spawn([PY, "-c", APP, "ustk_large", r["large_library"]], stdin=True)
        large.wait_for_line(r"^ready ", timeout=300)
        first_call = time.monotonic()
        _call(large, 1)
        for k in range(1, AFTER + 1):
            _call(small, n + k)
            time.sleep(0.5)
        r["after"] = [_brief(s) for s in arrivals.wait_roots("ustk_small", n + AFTER, timeout=300)[n:]]
        r["large_first"] = _brief(arrivals.wait_roots("ustk_large", 1, timeout=300)[0])
        ctx.log(f"large and small sessions in at {time.monotonic() - t0:.0f} s")

        m = 1
        while True:  # how long its first stack took, within a few seconds: until one of its stacks comes symbolized
            latest = arrivals.wait_roots("ustk_large", m, timeout=300)[-1]
            if "retsnoop.user_stack_unsymbolized" not in latest["attrs"]:
                break
            if time.monotonic() - first_call > 900:
                raise RuntimeError("the large process's stacks never came symbolized")
            time.sleep(3)
            m += 1
            _call(large, m)
        r["large_symbolized"] = _brief(latest)
        r["large_symbolized_within_s"] = round(time.monotonic() - first_call, 1)
        r["large_calls"] = m
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=60) as resp:
            r["metrics"] = [x for x in resp.read().decode().splitlines() if "unsymbolized" in x]
    finally:
        r["agent_rc"] = agent.terminate(timeout=300)
        r["agent_output"] = agent.output()[-20000:]
        arrivals.receiver.stop()
    return r

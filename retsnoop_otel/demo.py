"""`make demo`: the main job against the bundled failure workload, on the kernel this runs on.

Starts a local OTLP receiver (tests/otlp_receiver.py, a real gRPC server), runs
`retsnoop-otel trace` with OTLP export and the metrics endpoint, makes the kernel fail with
`simfail`, then shows what each sink got: the retsnoop-style stack, the trace as a span tree,
and the Prometheus series for the failing function. Meant to run inside the VM (tests/vm/run).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
METRICS_PORT = 9464


class Proc:
    """A child process whose merged output is echoed and kept."""

    def __init__(self, args: list[str], echo: bool = True) -> None:
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                  bufsize=1, start_new_session=True)
        self.lines: list[str] = []
        self.echo = echo

    def pump(self, timeout: float) -> None:
        assert self.p.stdout is not None
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if ready:
            line = self.p.stdout.readline()
            if line:
                self.lines.append(line)
                if self.echo:
                    print(line, end="", flush=True)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                if m := rx.search(line):
                    return m
            seen = len(self.lines)
            if self.p.poll() is not None and not select.select([self.p.stdout], [], [], 0)[0]:
                break
            self.pump(0.5)
        raise RuntimeError(f"timed out waiting for /{pattern}/ from {self.p.args}")

    def settle(self, quiet: float, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = len(self.lines)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet:
            self.pump(0.2)
            if len(self.lines) != last:
                last, quiet_since = len(self.lines), time.monotonic()

    def stop(self) -> int:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 300
        while self.p.poll() is None and time.monotonic() < deadline:
            self.pump(0.2)
        rest = self.p.stdout.read() if self.p.stdout else ""
        if rest:
            self.lines.append(rest)
            if self.echo:
                print(rest, end="", flush=True)
        return self.p.wait()


def _span_tree(requests: list[dict]) -> list[str]:
    spans = []
    for req in requests:
        for rs in req.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                spans.extend(ss.get("spans", []))
    by_parent: dict[str, list[dict]] = {}
    for s in spans:
        by_parent.setdefault(s.get("parentSpanId", ""), []).append(s)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(by_parent.get(parent, []), key=lambda x: int(x.get("startTimeUnixNano", 0))):
            attrs = {a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])}
            dur_us = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1000
            status = s.get("status", {}).get("code", "")
            err = attrs.get("error.type", "")
            lines.append(f"{'    ' * depth}{s['name']:<30} {dur_us:10.3f}us  {status} {err}")
            walk(s.get("spanId", ""), depth + 1)

    walk("", 0)
    return lines


def main() -> int:
    print("== retsnoop-otel demo: kernel", os.uname().release)
    subprocess.run([PY, "-m", "retsnoop_otel", "features"], cwd=ROOT, check=False)
    out_file = Path(tempfile.mkdtemp()) / "otlp.jsonl"
    receiver = Proc([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)], echo=False)
    port = int(receiver.wait_for(r"READY (\d+)", 300).group(1))
    print(f"== OTLP/gRPC receiver listening on 127.0.0.1:{port}")
    cmd = [PY, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "-a", "array_map_alloc_check",
           "--otlp-endpoint", f"http://127.0.0.1:{port}", "--metrics-port", str(METRICS_PORT)]
    print("== $", " ".join(cmd[2:]).replace("retsnoop_otel", "retsnoop-otel"))
    tracer = Proc(cmd)
    try:
        tracer.wait_for(r"Receiving data", 300)
        for case in ("bpf-bad-map-max-entries-array", "bpf-bad-map-val-size-percpu-array"):
            print(f"== $ retsnoop-otel simfail {case}")
            subprocess.run([PY, "-m", "retsnoop_otel", "simfail", case], cwd=ROOT, check=False)
            tracer.wait_for(r"array_map_alloc_check", 120)
            tracer.settle(3, 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=30) as resp:
            metrics = resp.read().decode()
        print(f"== Prometheus metrics (GET :{METRICS_PORT}/metrics), array_map_alloc_check series:")
        for line in metrics.splitlines():
            if "array_map_alloc_check" in line and ("_total" in line or "_count" in line):
                print("  ", line)
    finally:
        rc = tracer.stop()
    deadline = time.monotonic() + 60
    requests: list[dict] = []
    while time.monotonic() < deadline:
        if out_file.exists():
            requests = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip()]
            if len(_span_tree(requests)) >= 4:
                break
        time.sleep(0.5)
    receiver.stop()
    print("== traces received by the OTLP receiver (span tree, duration, status, error.type):")
    for line in _span_tree(requests):
        print("  ", line)
    leftover = subprocess.run(["bpftool", "prog", "list"], capture_output=True, text=True).stdout
    ours = [n for n in ("kprobe_entry", "kretprobe_exit", "kmulti_entry", "kmulti_exit", "rs_fentry", "rs_fexit")
            if n in leftover]
    print("== BPF programs left after detach:", ours or "none")
    return 0 if rc == 0 and not ours else 1


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: the main job against the bundled failure workload, on the kernel this runs on.

    python -m tests.demo          (from the repo root; `make demo` runs it in a 6.12 VM via tests/vm/run)

Starts a local OTLP receiver (tests/otlp_receiver.py, a real OTLP/HTTP and OTLP/gRPC server), runs
`retsnoop-otel trace` with OTLP export (OTLP/HTTP, the default protocol) and the metrics endpoint (its output
is echoed live), makes the kernel fail with `simfail`, then with a small Python service instrumented with the
OpenTelemetry SDK (tests/otel_service.py, publishing its thread context through retsnoop_otel.publisher and
exporting its own spans to the same receiver over gRPC), then shows what each sink got: the retsnoop-style
stacks, the Prometheus series for the failing function and the traces as span trees, the service's request
span with the kernel chain nested under it; last, that no BPF program of ours stays loaded. Exit code 0 only
when the tracer exited 0, all of that was seen and nothing stayed attached; otherwise 1, with a one-line
reason on stderr. Meant to run as root on a kernel that allows tracing (inside the VM);
tests/vm/scenarios/demo.py runs it the same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from retsnoop_otel.kernel.tracer import PROGRAM_NAMES
from tests.procs import Proc

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
METRICS_PORT = 9464
FUNC = "array_map_alloc_check"
CASES = ("bpf-bad-map-max-entries-array", "bpf-bad-map-val-size-percpu-array")
OUR_PROGS = PROGRAM_NAMES  # every name our programs have in the kernel
CHILD_ENV = {"PYTHONUNBUFFERED": "1"}  # children's lines reach us as they print them
STACK_RX = rf"\[-E[A-Z0-9]+\]\s+{FUNC}\b"  # the failing frame of a session's stack: `!  12us [-EINVAL] func`
CALLS_RX = rf'^retsnoop_function_calls_total\{{[^}}]*function="{FUNC}"'
ERRORS_RX = rf'^retsnoop_function_errors_total\{{[^}}]*function="{FUNC}"'
SLOW = 300.0  # seconds: guest Python under TCG is ~30x slower than the host
SERVICE = [PY, "-m", "tests.otel_service", "--requests", "4", "--interval", "3"]
SERVICE_ENV = {"OTEL_PYTHON_CONTEXT": "retsnoop_thread_ctx", "OTEL_SERVICE_NAME": "users-service",
               "RETSNOOP_OTEL_THREAD_ATTRIBUTES": "user.id"}

_out = threading.Lock()  # the tracer's echo (reader thread) and our own lines: whole lines, never mixed


def emit(text: str) -> None:
    with _out:
        sys.stdout.write(text)
        sys.stdout.flush()


def say(*parts: object) -> None:
    emit(" ".join(str(p) for p in parts) + "\n")


def run_shown(args: list[str], timeout: float = SLOW) -> int:
    """Run a command to completion, echoing its merged output live; return its exit code."""
    proc = Proc(args, CHILD_ENV, str(ROOT), echo=emit)
    try:
        proc.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        say(f"   ({' '.join(args[2:])} did not finish within {timeout:g} s)")
    return proc.terminate(timeout=30)  # reaps it and waits for its last lines to be echoed


def span_tree(requests: list[dict]) -> list[str]:
    """Spans of OTLP JSON requests as an indented tree: name, duration, status code, error.type."""
    spans = []
    for req in requests:
        for rs in req.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                spans.extend(ss.get("spans", []))
    by_parent: dict[str, list[dict]] = {}
    for s in spans:
        by_parent.setdefault(s.get("parentSpanId", ""), []).append(s)
    lines: list[str] = []
    ids = {s.get("spanId", "") for s in spans}
    roots = [p for p in by_parent if p not in ids]  # "" and the parents outside these requests

    def walk(parent: str, depth: int) -> None:
        for s in sorted(by_parent.get(parent, []), key=lambda x: int(x.get("startTimeUnixNano", 0))):
            attrs = {a["key"]: next(iter(a["value"].values()), "") for a in s.get("attributes", [])}
            dur_us = (int(s.get("endTimeUnixNano", 0)) - int(s.get("startTimeUnixNano", 0))) / 1000
            status = s.get("status", {}).get("code", "")
            err = attrs.get("error.type", "")
            lines.append(f"{'    ' * depth + s['name']:<42} {dur_us:10.3f}us  {status} {err}".rstrip())
            walk(s.get("spanId", ""), depth + 1)

    for root in roots:
        walk(root, 0)
    return lines


def nested_under_service(tree: list[str]) -> int:
    """Kernel chains (the entry function's span) printed right under the service's `load_user` span."""
    return sum(1 for above, line in zip(tree, tree[1:], strict=False)
               if above.split()[0] == "load_user" and line.split()[0] == "__x64_sys_bpf"
               and len(line) - len(line.lstrip()) > len(above) - len(above.lstrip()))


def service_requests(tree: list[str]) -> int:
    """The service's `load_user` spans received (one per request)."""
    return sum(1 for line in tree if line.split()[0] == "load_user")


def failed_func_spans(tree: list[str]) -> int:
    """How many spans of FUNC (not roots) ended with an error status and an error.type."""
    return sum(1 for line in tree
               if line.startswith(" ") and line.split()[0] == FUNC and re.search(r"ERROR \S+$", line))


def series_lines(metrics: str) -> list[str]:
    """The Prometheus text lines of FUNC's counters and histogram count."""
    return [line for line in metrics.splitlines()
            if FUNC in line and not line.startswith("#") and ("_total" in line or "_count" in line)]


def scrape(timeout: float) -> list[str]:
    """FUNC's series, scraped until both the calls and the errors counter show up (or `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=30) as resp:
                lines = series_lines(resp.read().decode())
        except OSError:
            lines = []
        text = "\n".join(lines)
        if (re.search(CALLS_RX, text, re.M) and re.search(ERRORS_RX, text, re.M)) or time.monotonic() > deadline:
            return lines
        time.sleep(1)


def read_requests(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def our_progs_left(timeout: float = 10) -> list[str] | None:
    """Our programs still loaded (polled a little: freeing is deferred); None if bpftool fails."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            res = subprocess.run(["bpftool", "-j", "prog", "list"], capture_output=True, text=True, timeout=120)
            names = [p.get("name", "") for p in json.loads(res.stdout or "[]")] if res.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            names = None
        if names is None:
            return None
        ours = [n for n in names if n in OUR_PROGS]
        if not ours or time.monotonic() > deadline:
            return ours
        time.sleep(0.5)


def first_line(exc: BaseException) -> str:
    """A one-line reason: the message's first line, without the command and output tail Proc adds (echoed)."""
    line = (str(exc).splitlines() or [""])[0]
    line = re.sub(r" from \[.*$", "", line).removesuffix("; output tail:")
    return line if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {line}"


def main() -> int:
    failures: list[str] = []
    say("== retsnoop-otel demo: kernel", os.uname().release)
    run_shown([PY, "-m", "retsnoop_otel", "features"])
    tmp = Path(tempfile.mkdtemp(prefix="retsnoop-otel-demo-"))
    out_file = tmp / "otlp.jsonl"
    receiver = Proc([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)],
                    CHILD_ENV, str(ROOT))
    tracer: Proc | None = None
    tracer_rc: int | None = None
    stacks = 0
    series: list[str] = []
    tree: list[str] = []
    try:
        try:
            ready = receiver.wait_for_line(r"READY (\d+) HTTP (\d+)", SLOW)
            port, http_port = int(ready.group(1)), int(ready.group(2))
            say(f"== OTLP receiver listening on 127.0.0.1:{http_port} (OTLP/HTTP) and 127.0.0.1:{port} (OTLP/gRPC)")
            cmd = [PY, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "-a", FUNC,
                   "--otlp-endpoint", f"http://127.0.0.1:{http_port}", "--metrics-port", str(METRICS_PORT)]
            say("== $", " ".join(cmd[2:]).replace("retsnoop_otel", "retsnoop-otel"))
            tracer = Proc(cmd, CHILD_ENV, str(ROOT), echo=emit)
            tracer.wait_for_line(r"Receiving data", SLOW)
            for case in CASES:
                tracer.skip_output()  # this case's stack, not a line left from the previous session
                say(f"== $ retsnoop-otel simfail {case}")
                if (rc := run_shown([PY, "-m", "retsnoop_otel", "simfail", case])) != 0:
                    failures.append(f"simfail {case} exited {rc}")
                try:
                    tracer.wait_for_line(STACK_RX, 120)
                    stacks += 1
                except TimeoutError as exc:
                    failures.append(f"no stack of {FUNC} for {case} ({first_line(exc)})")
                tracer.wait_output_settled(3, 60)  # symbolizing under TCG takes a while
            say("== $ OTEL_PYTHON_CONTEXT=retsnoop_thread_ctx python -m tests.otel_service "
                f"--endpoint 127.0.0.1:{port} (a service with OTel SDK spans, its requests fail in the kernel)")
            service = Proc([*SERVICE, "--endpoint", f"127.0.0.1:{port}"], {**CHILD_ENV, **SERVICE_ENV}, str(ROOT),
                           echo=emit)
            service.popen.wait(3 * SLOW)
            if (rc := service.terminate(timeout=30)) != 0:
                failures.append(f"the service exited {rc}")
            tracer.wait_output_settled(3, 60)
            series = scrape(60)
            say(f"== Prometheus metrics (GET :{METRICS_PORT}/metrics), {FUNC} series:")
            for line in series:
                say("  ", line)
            text = "\n".join(series)
            if not (re.search(CALLS_RX, text, re.M) and re.search(ERRORS_RX, text, re.M)):
                failures.append(f"no retsnoop_function_calls_total/errors_total series of {FUNC}")
        except Exception as exc:  # still stop the children, then report it as the reason
            failures.append(first_line(exc))
        finally:
            if tracer is not None:
                tracer_rc = tracer.terminate(timeout=SLOW)
        deadline = time.monotonic() + 60  # the tracer flushes its last spans when it stops
        while tracer is not None and time.monotonic() < deadline and receiver.returncode is None:
            tree = span_tree(read_requests(out_file))
            if failed_func_spans(tree) >= len(CASES) + 4 and nested_under_service(tree):
                break
            time.sleep(0.5)
    finally:
        receiver.terminate(timeout=30)
    say("== traces received by the OTLP receiver (span tree, duration, status, error.type):")
    for line in tree:
        say("  ", line)
    if tracer is not None and (got := failed_func_spans(tree)) < len(CASES):
        failures.append(f"{got} of {len(CASES)} failing {FUNC} spans received")
    if tracer is not None and not (nested := nested_under_service(tree)):
        failures.append("no kernel chain nested under the service's load_user span")
    elif tracer is not None:
        say(f"== {nested} of the service's requests have their kernel chain under their load_user span"
            + ("; a process born after the tracer is looked at when its first reported session ends, so that "
               "session stays a trace of its own" if service_requests(tree) > nested else ""))
    if tracer is not None and tracer_rc != 0:
        failures.insert(0, f"tracer exited {tracer_rc}")
    ours = our_progs_left()
    say("== BPF programs left after detach:", "unknown (bpftool -j prog list failed)" if ours is None
        else ", ".join(ours) or "none")
    if ours is None:
        failures.append("bpftool -j prog list failed")
    elif ours:
        failures.append(f"BPF programs left loaded: {', '.join(ours)}")
    shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"demo: FAILED: {'; '.join(failures)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

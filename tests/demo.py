"""`make demo`: the main job against the bundled failure workload, on the kernel this runs on.

    python -m tests.demo          (from the repo root; `make demo` runs it in a 6.12 VM via tests/vm/run)

Starts Jaeger v2 with the shipped Collector pipeline (config/collector.yaml: OTLP in, tail sampling that keeps
every trace with an error, the in-memory store; tests/peers/jaeger.py), runs `retsnoop-otel trace` exporting
OTLP/HTTP to it with the metrics endpoint on (its output is echoed live), makes the kernel fail with `simfail`,
then with a small Python service instrumented with the OpenTelemetry SDK (tests/otel_service.py, publishing its
thread context through retsnoop_otel.publisher and exporting its own spans to the same Jaeger over gRPC), then
shows what each sink got: the retsnoop-style stacks, the Prometheus series for the failing function, and the
traces as Jaeger holds them, found through its query API by service and by the tag error.type=EINVAL: a kernel
trace, and the service's request with the kernel chain nested under it; last, that no BPF program of ours stays
loaded. Exit code 0 only when the tracer exited 0, all of that was seen and nothing stayed attached; otherwise 1,
with a one-line reason on stderr. Meant to run as root on a kernel that allows tracing (inside the VM);
tests/vm/scenarios/demo.py runs it the same way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from retsnoop_otel.kernel.tracer import PROGRAM_NAMES
from tests.otlp_json import PYTHON_EXE
from tests.peers.jaeger import VERSION as JAEGER_VERSION
from tests.peers.jaeger import Jaeger, Span, spans_of, tree_lines
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
SERVICE_REQUESTS = 4
SERVICE = [PY, "-m", "tests.otel_service", "--requests", str(SERVICE_REQUESTS), "--interval", "3"]
SERVICE_NAME = "users-service"
SERVICE_ENV = {"OTEL_PYTHON_CONTEXT": "retsnoop_thread_ctx", "OTEL_SERVICE_NAME": SERVICE_NAME,
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


def nested_under_service(spans: list[Span]) -> int:
    """The service's `load_user` spans with the kernel chain (its entry function's span) as a child."""
    kernel_parents = {s.parent_id for s in spans if s.name == "__x64_sys_bpf"}
    return sum(1 for s in spans if s.name == "load_user" and s.span_id in kernel_parents)


def failed_func_spans(spans: list[Span]) -> int:
    """FUNC's spans (not roots) that ended with an error and an error.type."""
    return sum(1 for s in spans if s.name == FUNC and s.parent_id and s.tags.get("error") is True
               and s.tags.get("error.type"))


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


def show_found(jaeger: Jaeger, service: str, title: str, want: int = 1) -> list[Span]:
    """Find the failing traces of `service` through Jaeger's API as its UI does (waiting for `want` of them: each
    reaches the store once the tail sampler decided), print the largest one's tree as Jaeger returns it and where
    a user opens it; returns every span found."""
    tags = {"error.type": "EINVAL"}
    found = jaeger.wait_find(service, tags, want, 120)
    say(f"== Jaeger: {title}, found by service {service} and tag error.type=EINVAL:")
    say("   GET", jaeger.search_url(service, tags))
    say(f"   {len(found)} traces; {'the largest, ' if found else ''}as Jaeger holds it (span, duration, service, "
        "error.type):")
    if found:
        shown = max(found, key=lambda t: len(t.get("spans", [])))
        for line in tree_lines(spans_of(shown)):
            say("  ", line)
        say(f"   open in Jaeger's UI: {jaeger.query}/trace/{shown['traceID']}")
    return [span for trace in found for span in spans_of(trace)]


def main() -> int:
    failures: list[str] = []
    say("== retsnoop-otel demo: kernel", os.uname().release)
    run_shown([PY, "-m", "retsnoop_otel", "features"])
    tracer: Proc | None = None
    tracer_rc: int | None = None
    stacks = 0
    series: list[str] = []
    jaeger: Jaeger | None = None
    try:
        try:
            jaeger = Jaeger(decision_wait="5s")
            say(f"== Jaeger {JAEGER_VERSION} with the Collector pipeline of config/collector.yaml (OTLP in, tail "
                f"sampling keeps every trace with an error): OTLP/HTTP {jaeger.otlp_http}, OTLP/gRPC "
                f"{jaeger.otlp_grpc}, query API {jaeger.query}")
            cmd = [PY, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "-a", FUNC,
                   "--otlp-endpoint", jaeger.otlp_http, "--metrics-port", str(METRICS_PORT)]
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
                f"--endpoint {jaeger.otlp_grpc} (a service with OTel SDK spans, its requests fail in the kernel)")
            service = Proc([*SERVICE, "--endpoint", jaeger.otlp_grpc], {**CHILD_ENV, **SERVICE_ENV}, str(ROOT),
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
                tracer_rc = tracer.terminate(timeout=SLOW)  # flushes its last spans
        if tracer is not None and jaeger is not None:
            kernel = show_found(jaeger, PYTHON_EXE, "the kernel traces of simfail")
            if not failed_func_spans(kernel):  # the first case's; the second fails with E2BIG
                failures.append(f"no failing {FUNC} span of simfail found in Jaeger")
            app = show_found(jaeger, SERVICE_NAME, "the service's requests, with the kernel chain under them",
                             want=SERVICE_REQUESTS)
            if not (nested := nested_under_service(app)):
                failures.append("no kernel chain nested under the service's load_user span in Jaeger")
            else:
                say(f"== {nested} of the service's {sum(1 for s in app if s.name == 'load_user')} requests hold "
                    "their kernel chain under their load_user span, in one trace")
    finally:
        if jaeger is not None:
            jaeger.stop()
    if tracer is not None and tracer_rc != 0:
        failures.insert(0, f"tracer exited {tracer_rc}")
    ours = our_progs_left()
    say("== BPF programs left after detach:", "unknown (bpftool -j prog list failed)" if ours is None
        else ", ".join(ours) or "none")
    if ours is None:
        failures.append("bpftool -j prog list failed")
    elif ours:
        failures.append(f"BPF programs left loaded: {', '.join(ours)}")
    if failures:
        print(f"demo: FAILED: {'; '.join(failures)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

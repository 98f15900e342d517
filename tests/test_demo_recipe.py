"""`make demo` without a VM: the Makefile recipe and the VM scenario run the same command, and the
demo's output collection (tests/procs.py) sees lines that arrive in one burst.

The demo itself runs on a real kernel: tests/vm/test_demo.py (scenario tests/vm/scenarios/demo.py).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from tests import demo
from tests.peers.jaeger import spans_of, tree_lines
from tests.procs import Proc
from tests.vm.scenarios import demo as demo_scenario

REPO = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> list[str]:
    """The recipe lines (tab-indented, comments included) of a Makefile target."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split(":")[0] == target and ":" in line
                 and not line.startswith((".", "\t")))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line[1:])
    return recipe


def test_make_demo_recipe() -> None:
    assert _recipe("demo") == ["tests/vm/run --kernel 6.12 -- python -m tests.demo"]


def test_vm_scenario_runs_the_make_demo_command() -> None:
    assert demo_scenario.DEMO_COMMAND == "python -m tests.demo"
    assert _recipe("demo") == [f"tests/vm/run --kernel {demo_scenario.DEMO_KERNEL} -- {demo_scenario.DEMO_COMMAND}"]


def test_demo_is_not_in_the_package() -> None:
    assert not (REPO / "retsnoop_otel" / "demo.py").exists()
    assert Path(demo.__file__).resolve() == REPO / "tests" / "demo.py"


def test_proc_sees_lines_that_arrive_in_one_burst(tmp_path: Path) -> None:
    """The race that broke `make demo`: 3 lines in one write, then silence; the 3rd must be seen at once."""
    script = "import sys, time\nsys.stdout.write('one\\ntwo\\nthree\\n'); sys.stdout.flush()\ntime.sleep(60)\n"
    echoed: list[str] = []
    proc = Proc([sys.executable, "-c", script], None, str(tmp_path), echo=echoed.append)
    try:
        assert proc.wait_for_line(r"^one$", timeout=20)
        t0 = time.monotonic()
        assert proc.wait_for_line(r"^three$", timeout=5)  # already read along with 'one'
        assert time.monotonic() - t0 < 1
        assert echoed == ["one\n", "two\n", "three\n"]  # echoed before the waits could see them
        assert proc.output() == "one\ntwo\nthree\n"
    finally:
        assert proc.terminate(timeout=10) == -signal.SIGTERM


def test_proc_skip_output(tmp_path: Path) -> None:
    script = ("import time\nprint('start\\nhit 1', flush=True)\ntime.sleep(3)\n"
              "print('hit 2', flush=True)\ntime.sleep(60)\n")
    proc = Proc([sys.executable, "-c", script], None, str(tmp_path))
    try:
        assert proc.wait_for_line(r"start", timeout=20)
        assert proc.wait_output_settled(0.5, timeout=20)
        proc.skip_output()  # 'hit 1' was printed before: the next wait must not return it
        assert proc.wait_for_line(r"hit (\d)", timeout=20).group(1) == "2"
    finally:
        proc.terminate(timeout=10)


def test_demo_reads_jaegers_span_tree_and_the_series() -> None:
    """The demo's helpers over a trace as Jaeger's query API returns it (legacy JSON, recorded shape)."""
    def span(name: str, sid: str, parent: str, start: int, proc: str, err: str = "") -> dict:
        tags = [{"key": "error.type", "type": "string", "value": err}, {"key": "error", "type": "bool", "value": True}]
        return {"traceID": "t1", "spanID": sid, "operationName": name, "startTime": start, "duration": 5,
                "references": [{"refType": "CHILD_OF", "traceID": "t1", "spanID": parent}] if parent else [],
                "tags": tags if err else [], "logs": [], "processID": proc}

    trace = {"traceID": "t1", "spans": [
        span("array_map_alloc_check", "c", "b", 1002, "p2", "EINVAL"),
        span("GET /users/{id}", "r", "", 1000, "p1"),
        span("load_user", "a", "r", 1001, "p1", "EINVAL"),
        span("__x64_sys_bpf", "b", "a", 1001, "p2", "EINVAL"),
    ], "processes": {"p1": {"serviceName": "users-service", "tags": []},
                     "p2": {"serviceName": "users-service",
                            "tags": [{"key": "telemetry.sdk.name", "type": "string", "value": "retsnoop-otel"}]}}}
    spans = spans_of(trace)
    assert [line.split() for line in tree_lines(spans)] == [
        ["GET", "/users/{id}", "5us", "users-service"], ["load_user", "5us", "users-service", "EINVAL"],
        ["__x64_sys_bpf", "5us", "users-service", "EINVAL"],
        ["array_map_alloc_check", "5us", "users-service", "EINVAL"]]
    assert tree_lines(spans)[3].startswith(" " * 12 + "array_map_alloc_check")
    assert demo.failed_func_spans(spans) == 1 and demo.nested_under_service(spans) == 1
    assert spans[3].resource == {"telemetry.sdk.name": "retsnoop-otel"}
    metrics = ('# HELP retsnoop_function_calls_total Calls\n'
               'retsnoop_function_calls_total{function="array_map_alloc_check",probe_set="default"} 2.0\n'
               'retsnoop_function_calls_total{function="map_create",probe_set="default"} 2.0\n'
               'retsnoop_function_errors_total{error_type="EINVAL",function="array_map_alloc_check",'
               'probe_set="default"} 1.0\n')
    assert demo.series_lines(metrics) == metrics.splitlines()[1::2]

"""`make demo` on a real 6.12 kernel: it exits 0 and prints every section a user is shown.

Guest side: tests/vm/scenarios/demo.py runs `python -m tests.demo` (the Makefile's command line) in the
batch's 6.12 boot.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def demo(vm_batch_612) -> dict:
    return vm_batch_612["demo"]


def _section(out: str, title: str) -> list[str]:
    """The lines after the `== <title>...` line, up to the next `== ` line."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"== {title}")), None)
    assert start is not None, f"no '== {title}' section in:\n{out}"
    rest = lines[start + 1:]
    end = next((i for i, line in enumerate(rest) if line.startswith("== ")), len(rest))
    return rest[:end]


def test_demo_exits_0(demo) -> None:
    assert demo["command"] == "python -m tests.demo"
    assert not demo["timed_out"], demo["output"][-4000:]
    assert demo["rc"] == 0, demo["output"][-4000:]
    assert "demo: FAILED" not in demo["output"]


def test_demo_prints_features_and_command_line(demo) -> None:
    out = demo["output"]
    assert re.search(r"^== retsnoop-otel demo: kernel 6\.12\.", out, re.M), out
    assert re.search(r"^\s+fentry\s+yes\b", out, re.M), out
    assert re.search(r"^== \$ retsnoop-otel trace -e \*sys_bpf -a array_map_alloc_check "
                     r"--otlp-endpoint http://127\.0\.0\.1:\d+ --metrics-port \d+$", out, re.M), out
    assert "Receiving data..." in out


def test_demo_prints_the_stack_of_each_failure(demo) -> None:
    out = demo["output"]
    headers = re.findall(r"^\d\d:\d\d:\d\d\.\d{6} -> \d\d:\d\d:\d\d\.\d{6} TID/PID \d+/\d+ \(python/python\):$",
                         out, re.M)
    assert len(headers) >= 2, out
    assert re.search(r"^\s+\d+us \[-EINVAL\]\s+__x64_sys_bpf\+0x[0-9a-f]+$", out, re.M), out
    assert re.search(r"^!\s+\d+us \[-EINVAL\]\s+array_map_alloc_check$", out, re.M), out
    assert re.search(r"^!\s+\d+us \[-E2BIG\]\s+array_map_alloc_check$", out, re.M), out


def test_demo_prints_the_prometheus_series(demo) -> None:
    series = _section(demo["output"], "Prometheus metrics")
    assert any(re.fullmatch(r'\s+retsnoop_function_calls_total\{[^}]*function="array_map_alloc_check"[^}]*\} '
                            r'[0-9.e+]+', line) for line in series), series
    assert any(re.fullmatch(r'\s+retsnoop_function_errors_total\{[^}]*error_type="EINVAL"[^}]*'
                            r'function="array_map_alloc_check"[^}]*\} [0-9.e+]+', line)
               or re.fullmatch(r'\s+retsnoop_function_errors_total\{[^}]*function="array_map_alloc_check"[^}]*'
                               r'error_type="EINVAL"[^}]*\} [0-9.e+]+', line) for line in series), series


def test_demo_starts_jaeger_with_the_collector_pipeline(demo) -> None:
    out = demo["output"]
    assert re.search(r"^== Jaeger v1\.75\.0 with the Collector pipeline of config/collector\.yaml .* OTLP/HTTP "
                     r"http://127\.0\.0\.1:\d+, OTLP/gRPC 127\.0\.0\.1:\d+, query API http://127\.0\.0\.1:\d+$",
                     out, re.M), out[:3000]
    assert re.search(r"^== \$ retsnoop-otel trace .* --otlp-endpoint http://127\.0\.0\.1:\d+ ", out, re.M)


def test_demo_finds_the_kernel_trace_in_jaeger(demo) -> None:
    """Found through Jaeger's query API by service and error.type, printed as Jaeger holds it, with the URL."""
    section = _section(demo["output"], "Jaeger: the kernel traces of simfail")
    assert re.fullmatch(r"   GET http://127\.0\.0\.1:\d+/api/traces\?service=python3\.\d+&lookback=1h&limit=100&"
                        r"tags=%7B%22error\.type%22%3A%22EINVAL%22%7D", section[0]), section
    assert re.fullmatch(r"   [1-9] traces; the largest, as Jaeger holds it .*", section[1]), section
    tree = section[2:-1]
    assert re.match(r"^   __x64_sys_bpf\s+\d+us\s+python3\.\d+\s+EINVAL$", tree[0]), tree
    assert any(re.match(r"^ {7,}array_map_alloc_check\s+\d+us\s+python3\.\d+\s+(EINVAL|E2BIG)$", line)
               for line in tree), tree
    assert re.fullmatch(r"   open in Jaeger's UI: http://127\.0\.0\.1:\d+/trace/[0-9a-f]{32}", section[-1]), section


def test_demo_leaves_no_bpf_program(demo) -> None:
    assert "== BPF programs left after detach: none" in demo["output"].splitlines(), demo["output"][-2000:]


def test_demo_shows_the_kernel_chain_inside_the_services_trace(demo) -> None:
    """The service's request span, its load_user span, and under it the kernel's chain, as Jaeger holds them."""
    tree = _section(demo["output"], "Jaeger: the service's requests")[2:-1]
    chain = [r"GET /users/\{id\}", "load_user", "__x64_sys_bpf", "__sys_bpf", "array_map_alloc_check"]
    found = any(all(re.match(rf"^ {{3}}{' ' * 4 * d}{name}(?!\S)", tree[i + d]) for d, name in enumerate(chain))
                for i in range(len(tree) - len(chain) + 1))
    assert found, "\n".join(tree)
    assert re.search(r"^== [1-4] of the service's [1-4] requests hold their kernel chain under their load_user span, "
                     r"in one trace$", demo["output"], re.M), demo["output"][-4000:]
    # the tracer's own text names the application's ids in the session header
    assert re.search(r"TID/PID \d+/\d+ \(python/python\) trace_id=[0-9a-f]{32} span_id=[0-9a-f]{16}:$",
                     demo["output"], re.M), demo["output"][-4000:]

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


def test_demo_prints_the_span_tree(demo) -> None:
    tree = _section(demo["output"], "traces received by the OTLP receiver")
    roots = [i for i, line in enumerate(tree) if re.match(r"^ {3}\S", line)]
    assert roots, tree
    found = False
    for n, i in enumerate(roots):
        if tree[i].split()[0] != "__x64_sys_bpf":
            continue
        below = tree[i + 1:roots[n + 1] if n + 1 < len(roots) else len(tree)]
        found |= any(line.split()[0] == "array_map_alloc_check" and re.search(r"ERROR EINVAL$", line)
                     and line.startswith("       ") for line in below)
    assert found, "\n".join(tree)


def test_demo_leaves_no_bpf_program(demo) -> None:
    assert "== BPF programs left after detach: none" in demo["output"].splitlines(), demo["output"][-2000:]


def test_demo_shows_the_kernel_chain_inside_the_services_trace(demo) -> None:
    """The service's request span, its load_user span, and under it the kernel's chain, as received."""
    tree = _section(demo["output"], "traces received by the OTLP receiver")
    chain = [r"GET /users/\{id\}", "load_user", "__x64_sys_bpf", "__sys_bpf", "array_map_alloc_check"]
    found = any(all(re.match(rf"^ {{3}}{' ' * 4 * d}{name}(?!\S)", tree[i + d]) for d, name in enumerate(chain))
                for i in range(len(tree) - len(chain) + 1))
    assert found, "\n".join(tree)
    # the tracer's own text names the application's ids in the session header
    assert re.search(r"TID/PID \d+/\d+ \(python/python\) trace_id=[0-9a-f]{32} span_id=[0-9a-f]{16}:$",
                     demo["output"], re.M), demo["output"][-4000:]

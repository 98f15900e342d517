"""What /metrics and the OTLP push need is imported beside the kernel's load (runtime/prefetch.py), not in inputs."""

from __future__ import annotations

import subprocess
import sys

from retsnoop_otel.runtime.metrics_view import RuntimeMetrics
from retsnoop_otel.runtime.prefetch import prefetch
from retsnoop_otel.runtime.settings import run_settings
from retsnoop_otel.trace.flags import parse


def test_prefetch_imports_every_module_it_can_in_its_own_thread() -> None:
    """In a fresh interpreter: the modules are new there, and one that fails does not stop the others."""
    code = ("import sys, threading\n"
            "from retsnoop_otel.runtime.prefetch import prefetch\n"
            "t = prefetch(['colorsys', 'no_such_module_here', 'retsnoop_otel.metrics.http_app'])\n"
            "assert t is not None and t.daemon and t is not threading.current_thread()\n"
            "t.join(120)\n"
            "print(sorted(m for m in ('colorsys', 'retsnoop_otel.metrics.http_app', 'prometheus_client') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split("\n")[0] == "['colorsys', 'prometheus_client', 'retsnoop_otel.metrics.http_app']"
    assert prefetch([]) is None


def _settings(argv: list[str]):
    env: dict[str, str] = {}
    return run_settings(parse(argv, environ=env).config, env, "/", lambda _s, _n: None)


def test_the_modules_are_those_of_the_outputs_the_run_has() -> None:
    assert RuntimeMetrics.modules(_settings(["-e", "map_create"])) == []
    served = RuntimeMetrics.modules(_settings(["-e", "map_create", "--metrics-port", "9464"]))
    assert served[0] == "retsnoop_otel.metrics.http_app" and "retsnoop_otel.metrics.kernel_families" in served


def test_metrics_binds_without_its_http_app_and_serves_once_started() -> None:
    """The inputs phase binds /metrics with the socket module alone; what serves it is imported at start()."""
    code = ("import sys, socket, urllib.request\n"
            "from retsnoop_otel.metrics.server import MetricsServer\n"
            "made = []\n"
            "def registry():\n"
            "    from prometheus_client import CollectorRegistry\n"
            "    made.append(1)\n"
            "    return CollectorRegistry()\n"
            "s = MetricsServer('127.0.0.1', 0, registry, lambda: (True, {'status': 'ok'}))\n"
            "print(sorted(m for m in ('prometheus_client', 'wsgiref', 'retsnoop_otel.metrics.http_app') "
            "if m in sys.modules), made)\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', s.port), timeout=30).close()\n"
            "    print('answered before start')\n"
            "except ConnectionRefusedError:\n"
            "    print('refused before start')\n"
            "s.start()\n"
            "with urllib.request.urlopen(f'http://127.0.0.1:{s.port}/healthz', timeout=60) as r:\n"
            "    print(r.status, made)\n"
            "s.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.splitlines() == ["[] []", "refused before start", "200 [1]"], out.stdout + out.stderr

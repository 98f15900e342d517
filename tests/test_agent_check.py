"""`agent --check` is the run minus the kernel: on this host (which cannot trace kernel functions) every example
config passes, and each error the run refuses is refused by the check with the run's exit code and message.

Both commands run as subprocesses of this checkout (`python -m retsnoop_otel`). The run reaches its input and
output checks before the kernel step (runtime.py `_steps`), so on this host a broken config is refused by the run
exactly as on a host that can trace; a valid one ends at the kernel step (exit 1, or 0 for --check).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for p in (REPO / "config").glob("agent*.yaml"))
BASE = "probe_sets:\n  - name: k\n    entry: ['*sys_bpf']\n"


def _agent(*args: str, cwd: Path, timeout: float = 30, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "retsnoop_otel", "agent", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def _daemonset_config() -> str:
    docs = yaml.safe_load_all((REPO / "config" / "k8s" / "base" / "daemonset.yaml").read_text())
    return next(d for d in docs if d and d.get("kind") == "ConfigMap")["data"]["agent.yaml"]


@pytest.mark.parametrize("path", [*EXAMPLES, "daemonset"], ids=lambda p: getattr(p, "name", p))
def test_every_example_config_passes_here(path: Path | str, tmp_path: Path) -> None:
    pod = {}
    if path == "daemonset":  # with what the pod's environment gives it (the downward API, the service variables)
        cfg = yaml.safe_load(_daemonset_config())
        (tmp_path / "token").write_text("x\n")  # the service account's mounted files
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=check CA"],
                       cwd=tmp_path, check=True, capture_output=True, timeout=60)
        cfg.setdefault("kubernetes", {}).update(token_file=str(tmp_path / "token"), ca_file=str(tmp_path / "ca.crt"))
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(cfg))
        pod = {"K8S_NODE_NAME": "node-a", "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    out = _agent("--check", str(path), cwd=tmp_path, **pod)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("probe sets; kernel checks skipped)"), out.stdout  # this host cannot trace
    assert "kernel checks skipped (" in out.stdout and out.stderr == ""


def test_no_kernel_skips_the_kernel_even_where_it_could_trace(tmp_path: Path) -> None:
    out = _agent("--check", str(REPO / "config" / "agent-minimal.yaml"), "--no-kernel", cwd=tmp_path)
    assert out.returncode == 0 and "kernel checks skipped (--no-kernel was given)" in out.stdout, out
    assert _agent("--config", "x.yaml", "--no-kernel", cwd=tmp_path).returncode == 2


def _broken(tmp: Path) -> dict[str, str]:
    """Each error class the run refuses before the kernel step, as config text."""
    os.mkfifo(tmp / "fifo")
    (tmp / "dir").mkdir()
    (tmp / "web.yaml").write_text("tls_server_config: [\n")
    return {
        "unknown key": BASE + "bogus: 1\n",
        "bad glob syntax": "probe_sets:\n  - name: k\n    entry: ['[']\n",
        "bad value": BASE + "    filters:\n      min_duration_ms: -1\n",
        "file a directory": BASE + f"exporter:\n  file: {tmp}/dir\n",
        "file empty": BASE + "exporter:\n  file: ''\n",
        "file a FIFO": BASE + f"exporter:\n  file: {tmp}/fifo\n",
        "file /dev/full": BASE + "exporter:\n  file: /dev/full\n",
        "file in a missing directory": BASE + f"exporter:\n  file: {tmp}/no/such/out.jsonl\n",
        "listen not here": BASE + "metrics:\n  listen: 1.2.3.4:80\n",
        "listen no address": BASE + "metrics:\n  listen: 999.1.1.1:1\n",
        "missing u: binary": "probe_sets:\n  - name: u\n    entry: ['u:/nonexistent/bin:foo']\n",
        "missing TLS file": BASE + f"exporter:\n  otlp:\n    endpoint: https://127.0.0.1:4317\n"
                                   f"    certificate: {tmp}/no-ca.pem\n",
        "bad web config": BASE + f"metrics:\n  listen: 127.0.0.1:0\n  web_config_file: {tmp}/web.yaml\n",
    }


def _first_error(stderr: str) -> str:
    """The refusal's text, from --check's plain line or the run's log line (error="...")."""
    line = next(x for x in stderr.splitlines() if "warning" not in x)
    return line.split('error="', 1)[1].rstrip('"') if 'error="' in line else line.split(": ", 1)[1]


def test_broken_configs_fail_the_check_as_they_fail_the_run(tmp_path: Path) -> None:
    wrong = []
    for why, text in _broken(tmp_path).items():
        cfg = tmp_path / "a.yaml"
        cfg.write_text(text)
        check, run = _agent("--check", str(cfg), cwd=tmp_path), _agent("--config", str(cfg), cwd=tmp_path, timeout=10)
        if run.returncode not in (1, 2) or check.returncode != run.returncode or check.stdout \
                or _first_error(check.stderr) != _first_error(run.stderr).replace('\\"', '"'):
            wrong.append(f"{why}: check {check.returncode} {check.stderr.strip()[:200]!r} / "
                         f"run {run.returncode} {run.stderr.strip()[:200]!r}")
    assert not wrong, "\n".join(wrong)


def test_the_check_creates_nothing_and_holds_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:  # an agent already holding the port: --check before its reload passes
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "a.yaml"
        cfg.write_text(BASE + f"exporter:\n  file: {tmp_path}/out.jsonl\nmetrics:\n  listen: 127.0.0.1:{port}\n")
        out = _agent("--check", str(cfg), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "out.jsonl").exists()


def _fuzz_configs() -> list:
    """The agent configs of the subprocess fuzz corpus (tests/fixtures/fuzz_corpus.jsonl), each a Case."""
    from tests.command_runs import load_corpus
    return [c for c in load_corpus() if c.argv[:2] == ("agent", "--check") and not c.stdout and not c.stderr]


def test_every_fuzz_config_is_checked_as_it_runs() -> None:
    """Issue 47's acceptance: for every fuzz config, `agent --check` exits 0 exactly when the run gets past its input
    checks (here: to this host's refusal of kernel tracing), and otherwise with the run's own exit code. Each config
    runs both ways through the installed command, without capabilities (tests/command_runs.py)."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from tests.command_runs import TIMEOUT_S, TRACING_REFUSED, run_case

    def one(case: object) -> str:
        with tempfile.TemporaryDirectory(prefix="agree-") as a, tempfile.TemporaryDirectory(prefix="agree-") as b:
            check = run_case(case, Path(a), TIMEOUT_S)
            run = run_case(replace(case, argv=("agent", "--config", *case.argv[2:])), Path(b), TIMEOUT_S)
        past_input = run.code == 1 and any(r in run.stderr for r in TRACING_REFUSED)
        agree = past_input if check.code == 0 else check.code is not None and check.code == run.code
        return "" if agree else (f"{case.why}: check {check.code} {check.stderr.strip()[-160:]!r} / run {run.code} "
                                 f"{run.stderr.strip()[-160:]!r}")
    cases = _fuzz_configs()
    with ThreadPoolExecutor(max_workers=2) as pool:
        wrong = [w for w in pool.map(one, cases) if w]
    assert len(cases) >= 50 and not wrong, "\n".join(wrong)

"""Prometheus and Alertmanager as Debian packages them, for the fleet scenario: real servers on loopback ports of their
own, a history written into Prometheus' storage before it starts (promtool's backfill), and a webhook receiver that
keeps every notification Alertmanager sends.

The shipped alert rules compare the last minutes with the hour or the day before: a Prometheus that starts empty
has no such history, so the scenario gives it one (the rate at which each node failed before), in the series the
agents' scrapes then continue.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from tests.peers.jaeger import free_port
from tests.procs import Proc

STARTUP_S = 120.0


class History(NamedTuple):
    """A counter that grew at `per_s` from `since_s` seconds ago until `until_s` seconds ago."""

    name: str
    labels: dict[str, str]
    per_s: float
    since_s: int = 26 * 3600
    until_s: int = 120


def backfill(histories: Iterable[History], data_dir: Path, step_s: int = 60) -> None:
    """Write the counters' past into `data_dir` (OpenMetrics, then `promtool tsdb create-blocks-from openmetrics`)."""
    now = int(time.time())
    lines: list[str] = []
    by_family: dict[str, list[History]] = {}
    for h in histories:
        by_family.setdefault(h.name.removesuffix("_total"), []).append(h)
    for family, hs in by_family.items():
        lines.append(f"# TYPE {family} counter")
        for h in hs:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(h.labels.items()))
            value = 0.0
            for t in range(now - h.since_s, now - h.until_s, step_s):
                value += h.per_s * step_s
                lines.append(f"{family}_total{{{labels}}} {value:g} {t}")
    lines.append("# EOF")
    src = data_dir.parent / "history.om"
    src.write_text("\n".join(lines) + "\n")
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(src), str(data_dir)],
                   check=True, capture_output=True, text=True, timeout=600)


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}") | {"http_status": exc.code}


def _wait_ready(url: str, proc: Proc, what: str) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{proc.output()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready within {STARTUP_S:g} s:\n{proc.output()[-3000:]}")


class Prometheus:
    """`prometheus` with `config` (a dict, written as YAML) and its storage in `data_dir` (backfilled or empty)."""

    def __init__(self, config: dict, workdir: Path, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc = Proc(["prometheus", f"--config.file={self.config_file}", f"--storage.tsdb.path={data_dir}",
                          f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                          # alerts that fire before Alertmanager is discovered are dropped: send again soon
                          "--rules.alert.resend-delay=5s"])
        _wait_ready(f"{self.url}/-/ready", self.proc, "prometheus")

    def query(self, expr: str) -> dict:
        return _get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")

    def alerts(self) -> list[dict]:
        return _get_json(f"{self.url}/api/v1/alerts").get("data", {}).get("alerts", [])

    def stop(self) -> int:
        return self.proc.terminate(timeout=60)


class Webhook:
    """An HTTP server that keeps the JSON bodies posted to it: the notifications Alertmanager sends."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        received, lock = self.received, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    received.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict]:
        """Every alert of every notification, firing ones with their labels and annotations."""
        return [a for n in list(self.received) for a in n.get("alerts", [])]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Alertmanager:
    """`prometheus-alertmanager` routing every alert to `webhook` at once (group_wait 1 s)."""

    def __init__(self, workdir: Path, webhook: Webhook) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"route": {"receiver": "test", "group_by": ["alertname", "instance", "function", "error_type"],
                            "group_wait": "1s", "group_interval": "5s", "repeat_interval": "1h"},
                  "receivers": [{"name": "test", "webhook_configs": [{"url": webhook.url, "send_resolved": False}]}]}
        cfg = workdir / "alertmanager.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        (workdir / "alertmanager").mkdir(exist_ok=True)
        self.proc = Proc(["prometheus-alertmanager", f"--config.file={cfg}",
                          f"--storage.path={workdir / 'alertmanager'}", f"--web.listen-address=127.0.0.1:{self.port}",
                          "--cluster.listen-address=", "--log.level=warn"])  # no peers: no gossip port
        _wait_ready(f"{self.url}/-/ready", self.proc, "alertmanager")

    def stop(self) -> int:
        return self.proc.terminate(timeout=60)

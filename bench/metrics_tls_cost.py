"""What TLS and basic auth add to a scrape of /metrics (runs anywhere, no tracing needed):

    .venv/bin/python -m bench.metrics_tls_cost [--runs 200] [--cost 10]

The real metrics server (metrics/server.py) on loopback with a small registry, scraped by http.client
with a new connection per scrape (as Prometheus does against a server that closes after each
response): plain HTTP, HTTPS (EC P-256 certificate made with openssl), HTTPS with basic auth whose
verified credentials are cached, and the first check of a password (one bcrypt at --cost). Medians of
--runs scrapes, in milliseconds.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import ssl
import statistics
import tempfile
import time
from pathlib import Path

import bcrypt
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from retsnoop_otel.metrics.basic_auth import BasicAuth
from retsnoop_otel.metrics.server import MetricsServer
from retsnoop_otel.metrics.web_tls import WebWatcher, load_web_config
from tests.tls_certs import make_pki


class _Families:
    def collect(self):
        for i in range(50):
            yield GaugeMetricFamily(f"retsnoop_bench_{i}", "A bench gauge.", value=i)


def _scrape_ms(port: int, ctx: ssl.SSLContext | None, auth: str | None) -> float:
    t0 = time.perf_counter()
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=30) if ctx else \
        http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Basic {auth}"} if auth else {})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200, resp.status
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--cost", type=int, default=10)
    args = p.parse_args()
    d = Path(tempfile.mkdtemp(prefix="tls-bench-"))
    pki = make_pki(d)
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(args.cost)).decode()
    auth = base64.b64encode(b"prometheus:pw").decode()
    (d / "tls.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    (d / "auth.yml").write_text((d / "tls.yml").read_text() + f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    registry = CollectorRegistry()
    registry.register(_Families())
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    rows = []
    for name, web, client, creds in (("plain HTTP", None, None, None), ("HTTPS", "tls.yml", ctx, None),
                                     ("HTTPS + basic auth (cached)", "auth.yml", ctx, auth)):
        watcher = WebWatcher(load_web_config(str(d / web))) if web else None
        server = MetricsServer("127.0.0.1", 0, registry, lambda: (True, {}), web=watcher).start()
        try:
            times = [_scrape_ms(server.port, client, creds) for _ in range(args.runs)]
        finally:
            server.close()
        rows.append((name, statistics.median(times)))
    checker = BasicAuth()
    t0 = time.perf_counter()
    assert checker.allowed(f"Basic {auth}", {"prometheus": hashed})
    rows.append((f"first check of a password (bcrypt cost {args.cost})", (time.perf_counter() - t0) * 1000))
    print("| scrape | ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()

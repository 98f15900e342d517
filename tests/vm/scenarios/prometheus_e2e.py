"""Guest side of the Prometheus e2e check (issue 6): a real Prometheus server scrapes the agent.

The Prometheus configuration is config/prometheus-scrape.yml itself (relabeling and rule file
included), with a 5 s interval and the local agent as the only target; the agent runs one probe set
with the metrics series bounds on and exports its traces to an OTLP-JSON file. After three runs of the
bpf-bad-map-max-entries-array workload, every dashboard and alert expression is evaluated through
the HTTP API.

The scrape goes over HTTPS with basic auth (issue 12): the agent has a web config file (a certificate
of a CA made here with openssl, a bcrypt hash of cost 10), Prometheus `scheme: https`, `tls_config.ca_file`
and `basic_auth` with a password file. The scrape timeout is 5 s: under emulation beside other guests, a
1 s timeout lost 98% of the scrapes of one CI run (TLS handshake and collection take seconds there). Plain
HTTP, no credentials and a wrong password are refused. Host-side assertions: tests/vm/test_prometheus_e2e.py.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bcrypt
import yaml

from tests.dashboard_files import ALERTS, SCRAPE_CONFIG, all_expressions
from tests.tls_certs import leaf, make_ca
from tests.vm.guest_batch import budget

PY = sys.executable
METRICS_PORT = 9464
PROM_ADDR = "127.0.0.1:9090"
SIMFAIL_RUNS = 3
EINVAL_QUERY = 'retsnoop_function_errors_total{function="array_map_alloc_check",error_type="EINVAL"}'
UP_QUERY = 'up{job="retsnoop-otel"}'
ORIGIN_QUERY = 'retsnoop_error_origins_total{origin="array_map_alloc_check"}'  # issue 46: where the errors started
COUNT_QUERY = 'sum(retsnoop_function_duration_seconds_count{function="array_map_alloc_check"})'
SCRAPER, PASSWORD = "prometheus", "scrape-s3cret"


AGENT_CONFIG = """
probe_sets:
  - name: bpf_errors
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    mode: stack
exporter:
  otlp: null
  file: {traces}
metrics:
  listen: "127.0.0.1:{port}"
  max_error_types: 3
  web_config_file: {web}
logging:
  format: json
"""


def web_config(tmpdir: Path) -> Path:
    """The agent's web config: its certificate (IP SAN 127.0.0.1) from a CA made here, and one user."""
    make_ca(tmpdir, "ca")
    leaf(tmpdir, "agent", "ca", "IP:127.0.0.1")
    (tmpdir / "password").write_text(PASSWORD)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    path = tmpdir / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: agent.crt\n  key_file: agent.key\n"
                    f"basic_auth_users:\n  {SCRAPER}: '{hashed}'\n")
    return path


def prometheus_config(tmpdir: Path) -> Path:
    """The shipped scrape config, pointed at the local tracer over HTTPS with basic auth, every second."""
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    cfg["global"].update(scrape_interval="5s", evaluation_interval="5s")
    cfg["rule_files"] = [str(ALERTS)]
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "retsnoop-otel")
    job.update(scrape_interval="5s", scrape_timeout="5s", static_configs=[{"targets": [f"127.0.0.1:{METRICS_PORT}"]}],
               scheme="https", tls_config={"ca_file": str(tmpdir / "ca.crt")},
               basic_auth={"username": SCRAPER, "password_file": str(tmpdir / "password")})
    path = tmpdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def api(path: str, **params: str) -> dict:
    """GET a Prometheus API endpoint; error responses (400/422) are returned as their JSON body."""
    url = f"http://{PROM_ADDR}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}") | {"http_status": exc.code}


def query(expr: str) -> dict:
    return api("/api/v1/query", query=expr)


def target_up() -> list:
    """The `up` sample of the agent's target if its latest scrape made it in time, else empty."""
    return query(f"{UP_QUERY} == 1")["data"]["result"]


def query_fresh(expr: str, tries: int = 4) -> dict:
    """`query(expr)`, asked again while it comes back empty right after a scrape that timed out.

    Under TCG beside other guests a scrape may still time out, which marks every series of the target stale
    until the next good one; another may fail between the check of `up` and the query, so ask a few
    times. Expressions that are truly empty stay empty."""
    res = query(expr)
    for _ in range(tries - 1):
        if res.get("status") != "success" or res["data"].get("result"):
            break
        wait_until(target_up, timeout=60)
        res = query(expr)
    return res


def scalar_sum(res: dict) -> float:
    return sum(float(s["value"][1]) for s in res.get("data", {}).get("result", []))


def wait_until(check, timeout: float, step: float = 1.0):
    """Poll `check()` until it returns a truthy value or `timeout` passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (OSError, ValueError):
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def agent_get(tmp: Path, path: str = "/metrics", auth: str | None = None, tls: bool = True) -> tuple[int, str, str]:
    """(status, WWW-Authenticate, body) of a request to the agent, as a client other than Prometheus."""
    conn: http.client.HTTPConnection
    if tls:
        ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        conn = http.client.HTTPSConnection("127.0.0.1", METRICS_PORT, context=ctx, timeout=120)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", METRICS_PORT, timeout=120)
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("WWW-Authenticate") or "", resp.read().decode(errors="replace")
    finally:
        conn.close()


@budget(400)
def scenario_prometheus_e2e(ctx) -> dict:
    r: dict = {}
    tmp = Path(ctx.tmpdir)
    web = web_config(tmp)
    cfg = prometheus_config(tmp)
    r["prometheus_config"] = cfg.read_text()
    prom = ctx.spawn(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                      f"--web.listen-address={PROM_ADDR}", "--log.level=warn"])
    agent_cfg = tmp / "agent.yaml"
    agent_cfg.write_text(AGENT_CONFIG.format(traces=tmp / "traces.jsonl", port=METRICS_PORT, web=web))
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "agent", "--config", str(agent_cfg)])
    try:
        tracer.wait_for_line(r'"agent started"', timeout=600)
        ready = wait_until(lambda: urllib.request.urlopen(f"http://{PROM_ADDR}/-/ready", timeout=10).status == 200,
                           timeout=180)
        r["prometheus_ready"] = bool(ready)
        ctx.log(f"agent attached, prometheus ready: {bool(ready)}")
        # the first scrape of the tracer, so the counters' rise from their first value is recorded
        r["first_up"] = wait_until(target_up, timeout=120)

        r["simfail"] = []
        for run in range(1, SIMFAIL_RUNS + 1):
            rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 180)
            r["simfail"].append({"rc": rc, "out": out[-2000:], "err": err[-2000:]})
            # a scrape that sees each run's error, so the server records the counter's rise (increase()
            # over the dashboards' range is 0 if scrapes that timed out hid every value before the last)
            wait_until(lambda n=run: scalar_sum(query(EINVAL_QUERY)) >= n, timeout=120)
        r["einval"] = wait_until(lambda: scalar_sum(query(EINVAL_QUERY)) >= SIMFAIL_RUNS and query(EINVAL_QUERY),
                                 timeout=180)
        ctx.log(f"EINVAL series: {r['einval']}")
        r["duration_count"] = query_fresh(COUNT_QUERY)
        r["origins"] = wait_until(lambda: scalar_sum(query(ORIGIN_QUERY)) >= SIMFAIL_RUNS and query(ORIGIN_QUERY),
                                  timeout=180) or query(ORIGIN_QUERY)
        def up_now() -> dict | None:
            """`up` as the server stores it (relabeled), once a scrape made it in time."""
            res = query(UP_QUERY)
            return res if scalar_sum(res) == 1 else None

        r["up"] = wait_until(up_now, timeout=120) or query(UP_QUERY)
        r["queries"] = []
        for where, expr in all_expressions():
            res = query_fresh(expr)
            data = res.get("data", {})
            r["queries"].append({"where": where, "expr": expr, "status": res.get("status"),
                                 "error": res.get("error"), "result_type": data.get("resultType"),
                                 "result_count": len(data.get("result", []))})
        bad = [q["where"] for q in r["queries"] if q["status"] != "success"]
        ctx.log(f"{len(r['queries'])} expressions evaluated, failing: {bad or 'none'}")
        # the alert rules, loaded by the real server from the rule_files entry, evaluate without errors
        wait_until(lambda: all(not rule.get("lastEvaluation", "0001").startswith("0001")  # 0001-01-01: never
                               for g in api("/api/v1/rules")["data"]["groups"] for rule in g["rules"]), timeout=120)
        r["rules"] = [{"name": rule["name"], "health": rule["health"], "lastError": rule.get("lastError", "")}
                      for g in api("/api/v1/rules")["data"]["groups"] for rule in g["rules"]]
        r["refusals"] = {"plain_http": agent_get(tmp, tls=False), "no_credentials": agent_get(tmp),
                         "wrong_password": agent_get(tmp, auth=f"{SCRAPER}:wrong"),
                         "healthz_no_credentials": agent_get(tmp, "/healthz")}
        status, _, text = agent_get(tmp, auth=f"{SCRAPER}:{PASSWORD}")
        r["metrics_status"], r["metrics_text"] = status, text[-6000:]
        def targets() -> list[dict]:
            return [{k: t.get(k) for k in ("scrapeUrl", "health", "lastError")}
                    for t in api("/api/v1/targets")["data"]["activeTargets"]]

        def all_up() -> list[dict] | None:
            """The targets if every one is up; one read, so a scrape failing between two reads cannot slip in."""
            ts = targets()
            return ts if all(t["health"] == "up" for t in ts) else None

        # a scrape that timed out under TCG leaves the target down until the next one: wait for a good one
        r["target"] = wait_until(all_up, timeout=180) or targets()
        # how often a scrape made it in time under emulation, for the log when the target is down
        r["up_ratio"] = scalar_sum(query(f"avg_over_time({UP_QUERY}[1h])"))
        r["scrape_seconds"] = scalar_sum(query('max_over_time(scrape_duration_seconds{job="retsnoop-otel"}[1h])'))
        ctx.log(f"targets {r['target']}, share of scrapes up {r['up_ratio']:.2f}, "
                f"longest scrape {r['scrape_seconds']:.2f} s")
    finally:
        r["tracer_rc"] = tracer.terminate(timeout=240)
        r["tracer_output"] = tracer.output()[-6000:]
        r["prometheus_rc"] = prom.terminate(timeout=60)
        r["prometheus_output"] = prom.output()[-4000:]
    return r

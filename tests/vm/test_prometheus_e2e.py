"""Issue 6 on real kernels: a real Prometheus server scrapes `retsnoop-otel agent`.

Guest side: tests/vm/scenarios/prometheus_e2e.py (scenario prometheus_e2e). It uses the shipped
config/prometheus-scrape.yml and dashboards/alerts.yml, and evaluates every dashboard and alert
expression (tests/dashboard_files.py extracts them) through the Prometheus HTTP API. The scrape is
HTTPS with basic auth (issue 12): the agent has a web config file, Prometheus a CA and a password.
"""

from __future__ import annotations

import pytest

from tests.dashboard_files import EXPECTED_ALERTS, all_expressions, metric_names

pytestmark = pytest.mark.vm


def _samples(res: dict) -> list[tuple[dict, float]]:
    assert res["status"] == "success", res
    return [(s["metric"], float(s["value"][1])) for s in res["data"]["result"]]


def test_prometheus_scrapes_the_agent_with_the_shipped_config(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    assert r["prometheus_ready"], r["prometheus_output"]
    assert [s["rc"] for s in r["simfail"]] == [0, 0, 0], r["simfail"]
    ups = _samples(r["up"])
    assert ups == [({"__name__": "up", "instance": "127.0.0.1", "job": "retsnoop-otel"}, 1.0)]  # relabeled


def test_the_scrape_is_https_with_basic_auth(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    assert "scheme: https" in r["prometheus_config"] and "password_file:" in r["prometheus_config"]
    (target,) = r["target"]
    assert target == {"scrapeUrl": "https://127.0.0.1:9464/metrics", "health": "up", "lastError": ""}, \
        (target, f"share of scrapes up {r['up_ratio']:.2f}, longest {r['scrape_seconds']:.2f} s")
    assert r["metrics_status"] == 200 and "retsnoop_build_info" in r["metrics_text"]


def test_plain_http_and_missing_or_wrong_credentials_are_refused(vm_batch) -> None:
    refusals = vm_batch["prometheus_e2e"]["refusals"]
    assert refusals["plain_http"] == [400, "", "Client sent an HTTP request to an HTTPS server.\n"]
    for case in ("no_credentials", "wrong_password", "healthz_no_credentials"):
        status, challenge, body = refusals[case]
        assert (status, challenge) == (401, 'Basic realm="retsnoop-otel", charset="UTF-8"'), case
        assert "retsnoop_" not in body and "probe_sets" not in body, case


def test_einval_count_of_array_map_alloc_check(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    assert r["einval"], r["tracer_output"]
    (labels, value), = _samples(r["einval"])
    assert value >= 3, r["metrics_text"]
    assert labels["function"] == "array_map_alloc_check" and labels["error_type"] == "EINVAL"
    assert labels["probe_set"] == "bpf_errors" and labels["instance"] == "127.0.0.1"


def test_the_origin_series_counts_each_failing_call_once(vm_batch) -> None:
    """Issue 46: one series where the error started (retsnoop_function_errors_total counts the passing-up callers
    too), with every simfail run's failing bpf() call in it."""
    r = vm_batch["prometheus_e2e"]
    (labels, value), = _samples(r["origins"])
    assert value == len(r["simfail"]), r["metrics_text"]
    assert (labels["entry"], labels["origin"], labels["error_type"], labels["probe_set"]) == \
        ("__x64_sys_bpf", "array_map_alloc_check", "EINVAL", "bpf_errors"), labels


def test_duration_histogram_is_not_empty(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    (_, count), = _samples(r["duration_count"])
    assert count >= 3


def test_every_dashboard_and_alert_expression_evaluates(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    queries = r["queries"]
    assert [(q["where"], q["expr"]) for q in queries] == all_expressions()  # the guest saw the same files
    failed = [(q["where"], q["error"]) for q in queries if q["status"] != "success"]
    assert not failed, failed
    # dashboard expressions over families the agent always has (or has after the workload) have data
    always = {"retsnoop_build_info", "retsnoop_attached_functions", "retsnoop_config_reloads_total",
              "retsnoop_sessions_started_total", "retsnoop_sessions_reported_total", "retsnoop_spans_exported_total",
              "retsnoop_sessions_total", "process_cpu_seconds_total", "process_resident_memory_bytes"}
    empty = [q["where"] for q in queries
             if not q["where"].startswith("alerts.yml") and not q["expr"].startswith("absent(")  # empty while up
             and all(n.startswith(("retsnoop_function_", "retsnoop_session_duration_seconds")) or n in always
                     for n in metric_names(q["expr"]))
             and q["result_count"] == 0]
    assert not empty, empty


def test_alert_rules_load_and_evaluate_on_the_real_server(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    rules = {x["name"]: x for x in r["rules"]}
    assert set(rules) == EXPECTED_ALERTS  # every rule of dashboards/alerts.yml, loaded by the real server
    assert all(x["health"] == "ok" and not x["lastError"] for x in rules.values()), r["rules"]


def test_tracer_stops_cleanly(vm_batch) -> None:
    r = vm_batch["prometheus_e2e"]
    assert r["tracer_rc"] == 0, r["tracer_output"]

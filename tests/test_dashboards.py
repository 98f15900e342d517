"""Checks of dashboards/ (Grafana JSON, alert rules) and config/prometheus-scrape.yml with promtool.

promtool (Debian package `prometheus`) checks and unit-tests the alert rules and the scrape config.
Every PromQL expression of the dashboards and rules must parse (promtool parses them as recording
rules) and may name only series that retsnoop-otel really exposes: the names come from the
exposition of the real collectors fed with fake data, plus the few families still to be added
(PLANNED_SERIES). The VM test tests/vm/test_prometheus_e2e.py evaluates the same expressions on a
real Prometheus scraping the tracer (tests/dashboard_files.py: what both read).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from tests.dashboard_files import (
    ALERTS,
    ALERTS_TEST,
    DASHBOARDS,
    EXPECTED_ALERTS,
    PROMETHEUS_SERIES,
    REPO,
    SCOPE_VARIABLES,
    SCRAPE_CONFIG,
    TRACE_DATASOURCES,
    alert_rules,
    all_expressions,
    exposed_series,
    iter_panels,
    load_dashboards,
    metric_names,
    promtool,
    substitute_grafana_vars,
)

RUNBOOK = DASHBOARDS / "RUNBOOK.md"
REQUIRED_VARIABLES = ("datasource", *SCOPE_VARIABLES, "probe_set", *TRACE_DATASOURCES)
DATASOURCE_REF = "${datasource}"

# Families the dashboards and alerts use before the code exposes them (issue 6, self-metrics).
# Keep this the only such list; remove a name once the collectors expose it
# (test_planned_series_are_not_exposed_yet says when).
PLANNED_SERIES: frozenset[str] = frozenset()


# ---- promtool ------------------------------------------------------------------------------------


def _ok(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, f"{' '.join(res.args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"


def test_promtool_check_rules() -> None:
    res = promtool("check", "rules", ALERTS)
    _ok(res)
    assert f"SUCCESS: {len(alert_rules())} rules found" in res.stdout


def test_promtool_test_rules() -> None:
    _ok(promtool("test", "rules", ALERTS_TEST))


def test_promtool_check_scrape_config() -> None:
    res = promtool("check", "config", SCRAPE_CONFIG)
    _ok(res)
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "retsnoop-otel")
    assert job["static_configs"][0]["targets"][0].endswith(":9464")
    relabel = job["relabel_configs"][0]
    assert relabel["target_label"] == "instance"
    assert re.fullmatch(relabel["regex"], "node-a.example.com:9464")
    assert (SCRAPE_CONFIG.parent / cfg["rule_files"][0]).resolve() == ALERTS


# ---- alert rules ---------------------------------------------------------------------------------


# runbook_url: this repository's dashboards/RUNBOOK.md as GitHub shows it, with the alert's section anchor
RUNBOOK_URL = "https://github.com/retsnoop-otel/retsnoop-otel/blob/main/dashboards/RUNBOOK.md"


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+\s+(.+)$", markdown, re.M)}


def test_alerts_have_severity_for_and_runbook_sections() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    assert RUNBOOK_URL.endswith("/" + RUNBOOK.relative_to(REPO).as_posix())
    anchors = _anchors(RUNBOOK.read_text())
    dashboards = {d["uid"]: d for d in load_dashboards().values()}
    for r in rules:
        assert "for" in r, r["alert"]
        assert r["labels"]["severity"] in {"info", "warning", "critical"}
        ann = r["annotations"]
        # the kernel error alerts also link to the failing traces (their promtool tests expand the link)
        traces = {"traces_url"} if r["alert"].startswith(("KernelError", "KernelNew")) else set()
        assert set(ann) == {"summary", "description", "runbook_url", "dashboard_url", *traces}, r["alert"]
        assert ann["summary"] and ann["description"], r["alert"]
        page, _, anchor = ann["runbook_url"].partition("#")
        assert page == RUNBOOK_URL and anchor == r["alert"].lower() and anchor in anchors, (r["alert"], anchor)
        # /d/<uid>?var-<variable>={{ $labels.<same name> }}: a dashboard that exists, variables it has
        url = urlsplit(re.sub(r"\{\{ (?:if|end)\b[^}]*\}\}", "", ann["dashboard_url"]))
        uid = url.path.removeprefix("/d/")
        assert url.path.startswith("/d/") and uid in dashboards, (r["alert"], ann["dashboard_url"])
        variables = {v["name"] for v in dashboards[uid]["templating"]["list"]}
        for param in filter(None, url.query.split("&")):
            m = re.fullmatch(r"var-(\w+)=\{\{ \$labels\.(\w+) \}\}", param)
            assert m and m.group(1) == m.group(2) and m.group(1) in variables, (r["alert"], param)


def test_every_alert_has_firing_and_quiet_unit_tests() -> None:
    cases = [c for t in yaml.safe_load(ALERTS_TEST.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    for alert in EXPECTED_ALERTS:
        mine = [c for c in cases if c["alertname"] == alert]
        firing = [c for c in mine if c.get("exp_alerts")]
        assert firing and any(not c.get("exp_alerts") for c in mine), alert
        for case in firing:
            for exp in case["exp_alerts"]:
                assert exp.get("exp_labels") and exp.get("exp_annotations"), (alert, case["eval_time"])


# ---- dashboards ----------------------------------------------------------------------------------


def test_dashboards_use_the_classic_model() -> None:
    dashboards = load_dashboards()
    assert set(dashboards) == {"retsnoop-kernel-errors.json", "retsnoop-latency.json", "retsnoop-agent-health.json"}
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids)
    for name, d in dashboards.items():
        assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, name
        assert d["title"] and "retsnoop-otel" in d["tags"] and d["time"]["from"].startswith("now-"), name
        variables = {v["name"]: v for v in d["templating"]["list"]}
        for required in REQUIRED_VARIABLES:
            assert required in variables, (name, required)
        for ds_name, plugin in {"datasource": "prometheus", **TRACE_DATASOURCES}.items():
            ds = variables[ds_name]
            assert ds["type"] == "datasource" and ds["query"] == plugin, (name, ds_name)
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == DATASOURCE_REF, (name, v["name"])
        ids = [p["id"] for p in iter_panels(d["panels"])]
        assert len(set(ids)) == len(ids), name
        kinds = set()
        for panel in iter_panels(d["panels"]):
            kinds.add(panel["type"])
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == DATASOURCE_REF, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            for t in panel["targets"]:
                assert t["datasource"]["uid"] == DATASOURCE_REF, (name, panel["title"], t["refId"])
                assert t["expr"].strip(), (name, panel["title"])
            pos = panel["gridPos"]
            assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, (name, panel["title"])
        assert {"timeseries", "stat", "table"} <= kinds or {"timeseries", "heatmap"} <= kinds, (name, kinds)


def test_dashboards_cover_the_issue() -> None:
    exprs = "\n".join(e for _, e in all_expressions())
    assert re.search(r"sum by \(function, error_type\) \(rate\(retsnoop_function_errors_total\{[^}]*\}\[5m\]\)\)",
                     exprs)
    assert "topk(20, sum by (function, error_type) (increase(retsnoop_function_errors_total" in exprs
    # issue 46: the top error origins by rate, each origin once per entry function and errno
    assert "topk(10, sum by (entry, origin, error_type) (rate(retsnoop_error_origins_total{" in exprs
    for family in ("retsnoop_session_duration_seconds_bucket", "retsnoop_function_duration_seconds_bucket"):
        assert re.search(rf"histogram_quantile\(0\.99, sum by \(\w+, le\) \(rate\({family}", exprs), family
    for health in ("up{", "retsnoop_spans_dropped_total", "retsnoop_records_lost_total", "retsnoop_export_errors_total",
                   "retsnoop_config_reloads_total", "retsnoop_bpf_program_run_seconds_total",
                   "rate(process_cpu_seconds_total{", "process_resident_memory_bytes{"):
        assert health in exprs, health


# ---- every expression: parses, and names only real series ------------------------------------------


def test_substitution_and_name_extraction() -> None:
    expr = substitute_grafana_vars('sum by (function, le) (rate(a_total{instance=~"$instance",x=~"${probe_set:regex}",'
                                   'b="by(c)"}[$__rate_interval] offset 1h)) / on (le) group_left b:rec '
                                   'and 1e-9 > bool 0.5 or label_replace(c, "d", "$1", "e", "(.*)")')
    assert 'instance=~".*"' in expr and 'x=~".*"' in expr and "[5m]" in expr
    assert metric_names(expr) == {"a_total", "b:rec", "c"}


def test_every_expression_parses(tmp_path: Path) -> None:
    exprs = all_expressions()
    assert len(exprs) >= 40
    rules = [{"record": f"check:expr_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}, sort_keys=False))
    res = promtool("check", "rules", path)
    index = "\n".join(f"expr_{i}: {where}" for i, (where, _) in enumerate(exprs))
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\nrule index -> source:\n{index}"


def test_every_expression_names_real_series() -> None:
    exposed = exposed_series()
    known = exposed | PLANNED_SERIES | PROMETHEUS_SERIES
    unknown = {(where, n) for where, e in all_expressions() for n in metric_names(e) if n not in known}
    assert not unknown, f"series not exposed by retsnoop-otel: {sorted(unknown)}\nexposed: {sorted(exposed)}"


def test_planned_series_are_not_exposed_yet() -> None:
    done = PLANNED_SERIES & exposed_series()
    assert not done, f"now exposed by the collectors, remove from PLANNED_SERIES: {sorted(done)}"


def test_collector_names_cover_the_issue() -> None:
    """The names the dashboards are built on, read from the real exposition."""
    exposed = exposed_series()
    for name in ("retsnoop_function_calls_total", "retsnoop_function_errors_total",
                 "retsnoop_function_duration_seconds_bucket", "retsnoop_session_duration_seconds_bucket",
                 "retsnoop_sessions_total", "retsnoop_records_lost_total", "retsnoop_spans_dropped_total",
                 "retsnoop_config_reloads_total", "retsnoop_agent_up", "retsnoop_attached_functions"):
        assert name in exposed, name

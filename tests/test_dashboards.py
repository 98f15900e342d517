"""Checks of dashboards/ (Grafana JSON, alert rules) and config/prometheus-scrape.yml with promtool.

promtool (Debian package `prometheus`) checks and unit-tests the alert rules and the scrape config.
Every PromQL expression of the dashboards and rules must parse (promtool parses them as recording
rules) and may name only series that retsnoop-otel really exposes: the names come from the
exposition of the real collectors fed with fake data, plus the few families still to be added
(PLANNED_SERIES). The VM test tests/vm/test_prometheus_e2e.py evaluates the same expressions on a
real Prometheus scraping the tracer (the helpers here are shared with its guest side).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "dashboards"
ALERTS = DASHBOARDS / "alerts.yml"
ALERTS_TEST = DASHBOARDS / "alerts_test.yml"
RUNBOOK = DASHBOARDS / "RUNBOOK.md"
SCRAPE_CONFIG = REPO / "config" / "prometheus-scrape.yml"
# every panel's selectors match these (Grafana's All: ".*", which a series without the label matches too)
SCOPE_VARIABLES = ("cluster", "namespace", "job", "instance")
TRACE_DATASOURCES = {"tempo": "tempo", "jaeger": "jaeger"}  # datasource variable -> Grafana plugin id
REQUIRED_VARIABLES = ("datasource", *SCOPE_VARIABLES, "probe_set", *TRACE_DATASOURCES)
DATASOURCE_REF = "${datasource}"

# Families the dashboards and alerts use before the code exposes them (issue 6, self-metrics).
# Keep this the only such list; remove a name once the collectors expose it
# (test_planned_series_are_not_exposed_yet says when).
PLANNED_SERIES: frozenset[str] = frozenset()
# Series that Prometheus itself adds to every scrape target.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                               "scrape_samples_post_metric_relabeling", "scrape_series_added"})

# Grafana's built-in interval variables -> a concrete duration; any other variable (instance,
# probe_set, ...) is only used in regex label matchers and becomes ".*" (Grafana's "All").
GRAFANA_DURATIONS = {"__rate_interval": "5m", "__range": "5m", "__interval": "1m"}
_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$", re.S)

PROMQL_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
                             "and", "or", "unless", "inf", "nan", "atan2"})


# ---- helpers shared with tests/vm/scenarios/prometheus_e2e.py ------------------------------------


def substitute_grafana_vars(expr: str) -> str:
    """Turn a Grafana query into plain PromQL, as Grafana would with "All" selected."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return GRAFANA_DURATIONS.get(name, ".*")

    return _VAR.sub(repl, expr)


def variable_defaults(dash: dict) -> dict[str, str]:
    """Each query variable's value as a dashboard opens: its `current`, All as its allValue, several values
    as Grafana writes them into a regex matcher."""
    out = {}
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        values = var["current"]["value"]
        values = values if isinstance(values, list) else [values]
        if "$__all" in values:
            out[var["name"]] = var["allValue"]
        else:
            escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", v) for v in values]
            out[var["name"]] = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    return out


def substitute_defaults(expr: str, defaults: dict[str, str]) -> str:
    """A Grafana query as the dashboard runs it when opened (a variable without a default fails)."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return GRAFANA_DURATIONS.get(name) or defaults[name]

    return _VAR.sub(repl, expr)


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def iter_panels(panels: list[dict]) -> Iterator[dict]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def dashboard_expressions(name: str, dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every target and every query variable (its label_values() selector)."""
    out = []
    for panel in iter_panels(dash.get("panels", [])):
        for t in panel.get("targets", []):
            if t.get("expr"):
                out.append((f"{name}: panel {panel['title']!r} {t['refId']}", substitute_grafana_vars(t["expr"])))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.match(q)
        assert m, f"{name}: variable {var['name']}: expected label_values(SELECTOR, LABEL), got {q!r}"
        out.append((f"{name}: variable {var['name']}", substitute_grafana_vars(m.group(1))))
    return out


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def all_expressions() -> list[tuple[str, str]]:
    """Every PromQL expression of the dashboards and alert rules, ready to evaluate."""
    out = []
    for name, dash in load_dashboards().items():
        out += dashboard_expressions(name, dash)
    out += [(f"alerts.yml: {r['alert']}", r["expr"].strip()) for r in alert_rules()]
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (not functions, keywords, labels, strings or durations)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery windows
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        if not m.group(2) and m.group(1).lower() not in PROMQL_KEYWORDS:
            names.add(m.group(1))
    return names


# ---- the series retsnoop-otel really exposes ------------------------------------------------------


def _exposed_names(registry) -> set[str]:
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}


@contextlib.contextmanager
def fake_agent_registry(exemplars: Callable[[str, str], Mapping[int, Any]] | None = None) -> Iterator[Any]:
    """The runtime's /metrics registry (what both commands serve), fed with fake stats whose counters grow
    at every read (a scrape sees rates above zero); `exemplars` as RuntimeMetrics.exemplars gives them."""
    from retsnoop_otel.capture.model import CaptureStats, FuncStats, ProgramStats, RetKind, SessionStats, TracedFunc
    from retsnoop_otel.metrics.runtime_families import RunCounters
    from retsnoop_otel.runtime.config import ProbeSetConfig, RuntimeConfig
    from retsnoop_otel.runtime.runtime import Runtime, RuntimeDeps
    from retsnoop_otel.workload.k8s_watch import WatchCounters
    from tests.unit.test_metrics import FakeProbeSet

    funcs = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.INT32, True),
             1: TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False)}
    reads = itertools.count(1)

    class ProbeSet(FakeProbeSet):
        def program_stats(self):
            return [ProgramStats("kprobe_entry", 4, 4000), ProgramStats("kretprobe_exit", 4, 3000)]

        def func_stats(self):
            n = next(reads)
            return [FuncStats(0, 2 * n, {"EINVAL": n}, (0, n, n), 12 * n),
                    FuncStats(1, 2 * n, {"EINVAL": n}, (n, n), 5 * n)]

        def session_stats(self):
            n = next(reads)
            return [SessionStats(0, 2 * n, n, (0, n, n), 12 * n)]

        def capture_stats(self):
            n = next(reads)
            return CaptureStats(n, n, n, 2 * n, 2 * n)

    probe_set = ProbeSet(name="bpf", funcs=funcs, mode="fentry", attached=2, sampled_out=1, filtered_out=1)
    with tempfile.TemporaryDirectory() as root:  # the run families have samples only while bpf_stats is on
        sysctl = Path(root, "proc/sys/kernel/bpf_stats_enabled")
        sysctl.parent.mkdir(parents=True)
        sysctl.write_text("1\n")
        for entry in ("self", "stat"):  # the process families read this process's real /proc
            Path(root, "proc", entry).symlink_to(Path("/proc", entry))
        runtime = Runtime(RuntimeConfig(probe_sets=(ProbeSetConfig("bpf", ("f",)),)), RuntimeDeps(root=root))
        runtime.probe_sets = [probe_set]  # type: ignore[list-item]
        runtime.metrics.counters = lambda: RunCounters(  # type: ignore[method-assign]
            3 + next(reads), {"queue_full": 1, "export_failed": next(reads)}, next(reads), 0,
            {"success": 1, "failure": 0}, k8s=WatchCounters(current=True))  # the pod watch is on
        if exemplars is not None:
            runtime.metrics.exemplars = exemplars  # type: ignore[method-assign]
        yield runtime.metrics.registry()


def exposed_series() -> set[str]:
    """Series names of the runtime's /metrics registry, fed with fake stats."""
    with fake_agent_registry() as registry:
        return _exposed_names(registry)


# ---- promtool ------------------------------------------------------------------------------------


def promtool(*args: str | Path) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus' (make setup does)")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=REPO)


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
EXPECTED_ALERTS = {"KernelErrorSpike", "KernelNewErrno", "KernelLatencyP99High", "RetsnoopAgentLosingData",
                   "RetsnoopAgentDown", "RetsnoopConfigReloadFailed", "RetsnoopExportFailing",
                   "RetsnoopK8sMetadataStale"}


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
        assert set(ann) == {"summary", "description", "runbook_url", "dashboard_url"}, r["alert"]
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

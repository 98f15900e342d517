"""The dashboards and alert rules as the tests read them: their files, every PromQL expression in them ready to
evaluate, the metric names an expression selects, and promtool. Shared by tests/test_dashboards.py,
tests/test_k8s_manifests.py and the VM's Prometheus test (tests/vm/test_prometheus_e2e.py and its guest side).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "dashboards"
ALERTS = DASHBOARDS / "alerts.yml"
ALERTS_TEST = DASHBOARDS / "alerts_test.yml"
SCRAPE_CONFIG = REPO / "config" / "prometheus-scrape.yml"

# Grafana's built-in interval variables -> a concrete duration; any other variable (instance,
# probe_set, ...) is only used in regex label matchers and becomes ".*" (Grafana's "All").
GRAFANA_DURATIONS = {"__rate_interval": "5m", "__range": "5m", "__interval": "1m"}
_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$", re.S)

PROMQL_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
                             "and", "or", "unless", "inf", "nan", "atan2"})
# Series that Prometheus itself adds to every scrape target.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                               "scrape_samples_post_metric_relabeling", "scrape_series_added"})
# the alert rules dashboards/alerts.yml defines
EXPECTED_ALERTS = {"KernelErrorSpike", "KernelNewErrno", "KernelLatencyP99High", "RetsnoopAgentLosingData",
                   "RetsnoopAgentDown", "RetsnoopConfigReloadFailed", "RetsnoopExportFailing",
                   "RetsnoopK8sMetadataStale"}


def substitute_grafana_vars(expr: str) -> str:
    """Turn a Grafana query into plain PromQL, as Grafana would with "All" selected."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return GRAFANA_DURATIONS.get(name, ".*")

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


def promtool(*args: str | Path) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus' (make setup does)")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=REPO)

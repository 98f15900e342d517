"""The dashboards and alert rules as the tests read them: their files, every PromQL expression in them ready to
evaluate, the metric names an expression selects, and promtool. Shared by tests/test_dashboards.py,
tests/test_k8s_manifests.py and the VM's Prometheus test (tests/vm/test_prometheus_e2e.py and its guest side).
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

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "dashboards"
ALERTS = DASHBOARDS / "alerts.yml"
ALERTS_TEST = DASHBOARDS / "alerts_test.yml"
SCRAPE_CONFIG = REPO / "config" / "prometheus-scrape.yml"
# every panel's selectors match these (Grafana's All: ".*", which a series without the label matches too)
SCOPE_VARIABLES = ("cluster", "namespace", "job", "instance")
TRACE_DATASOURCES = {"tempo": "tempo", "jaeger": "jaeger"}  # datasource variable -> Grafana plugin id

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
EXPECTED_ALERTS = {"KernelErrorSpike", "KernelNewErrno", "KernelErrorOriginSpike", "KernelNewErrorOrigin",
                   "KernelLatencyP99High", "RetsnoopAgentLosingData",
                   "RetsnoopAgentDown", "RetsnoopConfigReloadFailed", "RetsnoopExportFailing",
                   "RetsnoopK8sMetadataStale"}


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


DOC_PAGES = ("README.md", "docs/**/*.md", "dashboards/RUNBOOK.md")
# a query in a code span: functions around a retsnoop_ family with a label matcher, a window or a call; not the
# notation `family{label}`, `family{a, b}` or `{label=...}` that names labels without values
_DOC_QUERY = re.compile(r"`((?:[a-z_]+\()*retsnoop_[a-z_]+(?:\{[^{}`]*\}|\[[^`]*)[^`]*|[a-z_]+\(retsnoop_[^`]*)`")
_NOTATION = re.compile(r"\{\w+(?:,\s*\w+)*\}|=\.\.\.")


def docs_expressions() -> list[tuple[str, str]]:
    """The PromQL queries the documentation shows (code spans), to be run like the dashboards' own."""
    out = []
    for pattern in DOC_PAGES:
        for page in sorted(REPO.glob(pattern)):
            for m in _DOC_QUERY.finditer(page.read_text()):
                if not _NOTATION.search(m.group(1)):
                    out.append((f"{page.relative_to(REPO)}: query", m.group(1)))
    return out


def all_expressions() -> list[tuple[str, str]]:
    """Every PromQL expression of the dashboards, the alert rules and the documentation, ready to evaluate."""
    out = []
    for name, dash in load_dashboards().items():
        out += dashboard_expressions(name, dash)
    out += [(f"alerts.yml: {r['alert']}", r["expr"].strip()) for r in alert_rules()]
    return out + docs_expressions()


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


def _exposed_names(registry) -> set[str]:
    from prometheus_client import generate_latest

    text = generate_latest(registry).decode()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}


@contextlib.contextmanager
def fake_agent_registry(exemplars: Callable[[str, str], Mapping[int, Any]] | None = None,
                        origin_exemplars: Callable[[str], Mapping[tuple[str, str, str], Any]] | None = None,
                        ) -> Iterator[Any]:
    """The runtime's /metrics registry (what both commands serve), fed with fake stats whose counters grow
    at every read (a scrape sees rates above zero); `exemplars` and `origin_exemplars` as RuntimeMetrics's
    methods of those names give them."""
    from retsnoop_otel.capture.model import (
        CaptureStats,
        FuncStats,
        OriginCount,
        ProgramStats,
        RetKind,
        SessionStats,
        TracedFunc,
    )
    from retsnoop_otel.metrics.runtime_families import RunCounters
    from retsnoop_otel.runtime.config import ProbeSetConfig, RuntimeConfig
    from retsnoop_otel.runtime.deps import RuntimeDeps
    from retsnoop_otel.runtime.runtime import Runtime
    from retsnoop_otel.workload.k8s_watch import WatchCounters
    from tests.fakes import FakeProbeSet

    funcs = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.INT32, True),
             1: TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False)}
    reads = itertools.count(1)
    origin_reads = itertools.count(1)

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

        def origin_counts(self):
            return [OriginCount(0, 1, "EINVAL", next(origin_reads))]

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
            3 + next(reads), {"queue_full": 1, "export_failed": next(reads), "rejected": next(reads)}, next(reads), 0,
            {"success": 1, "failure": 0}, k8s=WatchCounters(current=True))  # the pod watch is on
        if exemplars is not None:
            runtime.metrics.exemplars = exemplars  # type: ignore[method-assign]
        if origin_exemplars is not None:
            runtime.metrics.origin_exemplars = origin_exemplars  # type: ignore[method-assign]
        yield runtime.metrics.registry()


def exposed_series() -> set[str]:
    """Series names of the runtime's /metrics registry, fed with fake stats."""
    with fake_agent_registry() as registry:
        return _exposed_names(registry)

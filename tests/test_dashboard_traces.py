"""Dashboards that lead to traces (issue 34 point 5), checked with a real Prometheus server.

- cluster, namespace, job and instance variables scope every query; with their defaults (All, job
  retsnoop-otel) a target without cluster/namespace labels (a plain host) still shows data;
- the Tempo and Jaeger data source variables, and data links on the panels split by function, entry
  function or errno that open Grafana's Explore on the matching trace search;
- exemplars on every panel whose series carry them (the code's OpenMetrics exposition says which: the session
  duration buckets and the error origins counter), and
  dashboards/provisioning/datasources.yml linking their trace_id to Tempo and Jaeger.

The Prometheus server (Debian package `prometheus`) runs the shipped config/prometheus-scrape.yml with
exemplar storage on, scraping the real /metrics server (metrics.server.MetricsServer) that serves the real
collectors fed with fake, growing counts: twice, once as a plain host and once with the labels Kubernetes
discovery and an external `cluster` label give. Grafana itself is not run (no package for it); its link and
provisioning formats are checked field by field.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.dashboard_files import (
    ALERTS,
    DASHBOARDS,
    EXPECTED_ALERTS,
    REPO,
    SCOPE_VARIABLES,
    SCRAPE_CONFIG,
    TRACE_DATASOURCES,
    docs_expressions,
    fake_agent_registry,
    iter_panels,
    load_dashboards,
    metric_names,
    substitute_defaults,
    variable_defaults,
)

PROVISIONING = DASHBOARDS / "provisioning" / "datasources.yml"
ATTRIBUTES_PAGE = REPO / "docs" / "reference" / "attributes.md"
JOB = "retsnoop-otel"  # config/prometheus-scrape.yml's job and the PodMonitor's (tests/test_k8s_manifests.py)
# what Kubernetes discovery (the PodMonitor: namespace) and an external or relabelled `cluster` give a target
K8S_LABELS = {"cluster": "test-cluster", "namespace": "retsnoop-otel"}
TRACE_LABELS = ("function", "entry_function", "entry", "origin", "error_type")  # series labels a trace search can use
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
_SELECTOR = re.compile(r"\b([a-zA-Z_:][\w:]*)\{([^}]*)\}")
_TOKEN = re.compile(r"\$\{([\w.]+)(?::(\w+))?\}")


def _targets(panel: dict) -> list[dict]:
    return [t for t in panel.get("targets", []) if t.get("expr")]


def _panels() -> Iterator[tuple[str, dict, dict]]:
    for name, dash in load_dashboards().items():
        for panel in iter_panels(dash["panels"]):
            if panel["type"] != "row":
                yield name, dash, panel


# ---- the scope variables ---------------------------------------------------------------------------


def test_scope_variables_default_to_all_and_the_shipped_job() -> None:
    job = next(j["job_name"] for j in yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"])
    assert job == JOB
    for name, dash in load_dashboards().items():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        chain: list[str] = []
        for scope in SCOPE_VARIABLES:
            var = variables[scope]
            assert var["type"] == "query" and var["includeAll"] and var["multi"], (name, scope)
            assert var["allValue"] == ".*", (name, scope)  # matches a series without the label
            # each variable lists the values under the ones before it
            selector = re.match(r"label_values\(retsnoop_build_info(?:\{(.*)\})?, (\w+)\)$", var["query"]["query"])
            assert selector and selector.group(2) == scope, (name, scope)
            assert (selector.group(1) or "") == ",".join(f'{c}=~"${c}"' for c in chain), (name, scope)
            chain.append(scope)
        defaults = variable_defaults(dash)
        assert defaults["job"] == JOB, name
        assert all(defaults[v] == ".*" for v in defaults if v != "job"), (name, defaults)


def test_every_selector_is_scoped_by_the_variables() -> None:
    scope = [f'{v}=~"${v}"' for v in SCOPE_VARIABLES]
    for name, _, panel in _panels():
        for t in _targets(panel):
            expr = t["expr"]
            selectors = _SELECTOR.findall(expr)
            # every metric the expression reads is read through a selector
            assert len(selectors) == sum(len(re.findall(rf"\b{n}\b", expr)) for n in metric_names(expr)), \
                (name, panel["title"], expr)
            for _, matchers in selectors:
                parts = matchers.split(",")
                assert parts[:len(scope)] == scope, (name, panel["title"], matchers)
                assert not any(re.match(r"(cluster|namespace|job|instance)\b", p) for p in parts[len(scope):])


def test_series_every_exporter_has_are_kept_to_agents() -> None:
    """With job All, up, scrape_* and process_* would count every target: they are joined with the agents'
    retsnoop_build_info, as RetsnoopAgentDown does."""
    for name, _, panel in _panels():
        for t in _targets(panel):
            shared = {n for n in metric_names(t["expr"]) if not n.startswith("retsnoop_")}
            if shared:
                assert "and on (job, instance)" in t["expr"] and "retsnoop_build_info{" in t["expr"], \
                    (name, panel["title"])


# ---- exemplars -------------------------------------------------------------------------------------


def _exemplar_store() -> Any:
    from retsnoop_otel.metrics.exemplars import ExemplarStore
    store = ExemplarStore()
    store.record("bpf", "__x64_sys_bpf", 5, TRACE_ID, time.time_ns())  # 5 ns: the sessions' slot 2
    # the origin series of the fake registry (tests/dashboard_files.py): __x64_sys_bpf failing in array_map_alloc_check
    store.record_origin("bpf", "__x64_sys_bpf", "array_map_alloc_check", "EINVAL", TRACE_ID, time.time_ns())
    return store


def exemplar_labels() -> dict[str, set[str]]:
    """Series name -> the label names of its exemplars, from the OpenMetrics exposition of the real collectors."""
    from prometheus_client.openmetrics.exposition import generate_latest
    store = _exemplar_store()
    with fake_agent_registry(store.for_histogram, store.for_origins) as registry:
        text = generate_latest(registry).decode()
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if " # {" in line:
            labels = line.split(" # {", 1)[1].split("}", 1)[0]
            out.setdefault(re.split(r"[{ ]", line, maxsplit=1)[0], set()).update(re.findall(r"(\w+)=", labels))
    return out


def test_exemplars_on_every_panel_whose_series_carry_them() -> None:
    carriers = exemplar_labels()
    assert carriers == {"retsnoop_session_duration_seconds_bucket": {"trace_id"},
                        "retsnoop_error_origins_total": {"trace_id"}}
    with_exemplars = 0
    for name, _, panel in _panels():
        targets = _targets(panel)
        reads = [metric_names(t["expr"]) & set(carriers) for t in targets]
        if any(reads):
            assert any(t.get("exemplar") for t, r in zip(targets, reads, strict=True) if r), (name, panel["title"])
            with_exemplars += 1
        for t, r in zip(targets, reads, strict=True):
            assert not t.get("exemplar") or r, f"{name}: {panel['title']}: exemplar on series without any"
    assert with_exemplars >= 3  # the session latency percentiles, the session duration heatmap, the top error origins


def test_provisioning_links_exemplars_to_the_trace_datasources() -> None:
    cfg = yaml.safe_load(PROVISIONING.read_text())
    assert cfg["apiVersion"] == 1
    sources = {ds["type"]: ds for ds in cfg["datasources"]}
    assert len(sources) == len(cfg["datasources"]) and {"prometheus", *TRACE_DATASOURCES.values()} <= set(sources)
    assert len({ds["uid"] for ds in cfg["datasources"]}) == len(cfg["datasources"])
    for ds in cfg["datasources"]:
        assert ds["name"] and urllib.parse.urlsplit(ds["url"]).scheme == "http" and ds["access"] == "proxy"
        assert "$" not in yaml.safe_dump(ds), "Grafana expands ${...} here from its environment"
    destinations = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    (label,) = set.union(*exemplar_labels().values())
    assert {d["name"] for d in destinations} == {label}
    # one internal link per trace backend (datasourceUid; a `url` would make it an external link)
    assert sorted(d["datasourceUid"] for d in destinations) == sorted(
        sources[p]["uid"] for p in TRACE_DATASOURCES.values())
    assert all(set(d) == {"name", "datasourceUid", "urlDisplayLabel"} for d in destinations)


# ---- data links to trace searches -----------------------------------------------------------------

# values as Grafana fills them in; the service needs percent-encoding (no format makes a value safe for both the
# URL and the JSON inside it, so a service name with " or \ would still break the link: none has them)
SAMPLE = {"tempo": "tempo-uid", "jaeger": "jaeger-uid", "__org": "1", "__from": "1700000000000",
          "__to": "1700003600000", "service": "checkout api & co/v2?x=1#y", "function": "array_map_alloc_check",
          "entry_function": "__x64_sys_bpf", "error_type": "EINVAL", "instance": "node-a.example.com|node-b",
          "entry": "__x64_sys_bpf", "origin": "array_map_alloc_check"}


def render_link(url: str, fields: str) -> tuple[dict, list[str]]:
    """A data link as Grafana opens it: variables filled in (`fields`: __field.labels or __data.fields), the
    Explore pane read back; and the series labels it used."""
    used = []

    def repl(m: re.Match) -> str:
        name, fmt = m.group(1), m.group(2)
        if name.startswith(fields + "."):
            name = name.removeprefix(fields + ".")
            used.append(name)
        value = SAMPLE[name]
        assert fmt in (None, "percentencode", "pipe"), fmt
        if fmt is None:  # only values that need no encoding may go in raw
            assert re.fullmatch(r"[\w-]+", value), (name, "needs :percentencode")
        if fmt == "pipe":  # host names joined by |, unescaped: nothing a JSON string or a URL must escape
            assert re.fullmatch(r"[\w.|-]+", value), (name, value)
        return urllib.parse.quote(value, safe="") if fmt == "percentencode" else value

    parts = urllib.parse.urlsplit(_TOKEN.sub(repl, url))
    assert parts.path == "/explore" and not parts.netloc, url
    query = urllib.parse.parse_qs(parts.query, strict_parsing=True)
    assert query["schemaVersion"] == ["1"] and query["orgId"] == ["1"], query
    (pane,) = json.loads(query["panes"][0]).values()
    return pane, used


def _by_labels(panel: dict) -> set[str]:
    """The labels a panel's series carry: its outer aggregation's `by (...)` labels."""
    out = set()
    for t in _targets(panel):
        m = re.match(r"(?:histogram_quantile\([\d.]+, |topk\(\d+, )*\w+ by \(([^)]*)\)", t["expr"])
        out |= {g.strip() for g in m.group(1).split(",")} if m else set()
    return out - {"le"}


def _span_attributes_documented() -> set[str]:
    return set(re.findall(r"`([a-z_.]+)`", ATTRIBUTES_PAGE.read_text()))


def test_panels_split_by_function_or_errno_link_to_tempo_and_jaeger() -> None:
    documented = _span_attributes_documented()
    linked = 0
    for name, dash, panel in _panels():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        labels = _by_labels(panel) & set(TRACE_LABELS)
        links = panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])
        if not labels:
            assert not links, (name, panel["title"])
            continue
        linked += 1
        fields = "__data.fields" if panel["type"] == "table" else "__field.labels"
        assert len(links) == 2 and all(link["targetBlank"] and link["title"] for link in links), (name, panel["title"])
        panes = {}
        for link in links:
            pane, used = render_link(link["url"], fields)
            assert set(used) == labels, (name, panel["title"], used)
            (query,) = pane["queries"]
            plugin = query["datasource"]["type"]
            var = next(v for v, p in TRACE_DATASOURCES.items() if p == plugin)
            assert variables[var]["type"] == "datasource"
            assert pane["datasource"] == query["datasource"]["uid"] == SAMPLE[var], link["url"]
            assert pane["range"] == {"from": SAMPLE["__from"], "to": SAMPLE["__to"]}
            panes[plugin] = query
        # Tempo: a TraceQL search on the span name (the function) and the documented attributes
        traceql = panes["tempo"]
        assert traceql["queryType"] == "traceql" and traceql["limit"] > 0
        for attr in re.findall(r"\bspan\.([\w.]+)", traceql["query"]):
            assert attr in documented, attr
        # only the hosts chosen on the dashboard (host.name is the instance label: config/prometheus-scrape.yml)
        assert f'resource.host.name =~ "{SAMPLE["instance"]}"' in traceql["query"], traceql["query"]
        # Jaeger: a search of the chosen service, operation = span name, tags in logfmt
        jaeger = panes["jaeger"]
        assert jaeger["queryType"] == "search" and jaeger["service"] == SAMPLE["service"]
        assert variables["service"]["type"] == "textbox"
        tags = dict(t.split("=", 1) for t in jaeger["tags"].split()) if jaeger["tags"] else {}
        assert set(tags) <= {"error"} | documented, tags
        for label, attr in (("function", "name"), ("entry_function", "name"), ("entry", "name"),
                            ("origin", "span.retsnoop.error.origin"), ("error_type", "span.error.type")):
            if label in labels:
                assert f'{attr} = "{SAMPLE[label]}"' in traceql["query"], (panel["title"], traceql["query"])
        if "error_type" in labels:
            assert tags["error.type"] == SAMPLE["error_type"]
        if "origin" in labels:  # the root span's attribute, on the entry function's span (the operation)
            assert tags["retsnoop.error.origin"] == SAMPLE["origin"] and "entry" in labels
        entry = next((x for x in ("entry_function", "entry", "function") if x in labels), None)
        if entry is not None:
            assert jaeger["operation"] == SAMPLE[entry]
        if "error" in panel["title"].lower() and "entry_function" in labels:  # error sessions: failing traces
            assert "status = error" in traceql["query"] and tags == {"error": "true"}
    assert linked >= 10


# ---- a real Prometheus server ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prom:
    def __init__(self, addr: str) -> None:
        self.addr = addr

    def api(self, path: str, **params: Any) -> dict:
        url = f"http://{self.addr}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"{}") | {"http_status": exc.code}

    def query(self, expr: str) -> list:
        res = self.api("/api/v1/query", query=expr)
        assert res.get("status") == "success", (expr, res)
        return res["data"]["result"]


def _wait(check, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    """The shipped scrape config with exemplar storage, scraping the real /metrics server twice: as a plain
    host (no cluster, no namespace) and with the labels a Kubernetes scrape has."""
    from retsnoop_otel.metrics.server import MetricsServer

    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus not found: install the Debian package 'prometheus' (make setup does)")
    tmp = tmp_path_factory.mktemp("prometheus")
    store = _exemplar_store()
    with fake_agent_registry(store.for_histogram, store.for_origins) as registry:
        server = MetricsServer("127.0.0.1", 0, registry, lambda: (True, {})).start()
        cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
        cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
        cfg["rule_files"] = [str(ALERTS)]
        (job,) = cfg["scrape_configs"]
        target = f"127.0.0.1:{server.port}"
        job.update(scrape_interval="1s", scrape_timeout="1s",
                   static_configs=[{"targets": [target]}, {"targets": [target], "labels": K8S_LABELS}])
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        addr = f"127.0.0.1:{_free_port()}"
        proc = subprocess.Popen([exe, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address={addr}", "--enable-feature=exemplar-storage",
                                 "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=open(tmp / "log", "w"))
        try:
            p = Prom(addr)
            # both targets scraped at least 4 times, so every rate() has points
            ready = _wait(lambda: len(p.query(f'count_over_time(up{{job="{JOB}"}}[1m]) >= 4')) == 2, timeout=90)
            assert ready, (tmp / "log").read_text()[-3000:]
            yield p
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.close()


def _opened(dash: dict, expr: str) -> str:
    return substitute_defaults(expr, variable_defaults(dash))


def test_the_defaults_show_a_plain_host_and_a_kubernetes_target(prom: Prom) -> None:
    for name, dash in load_dashboards().items():
        scope = ",".join(f'{v}=~"${v}"' for v in SCOPE_VARIABLES)
        found = prom.query(_opened(dash, f"count by (cluster, namespace) (retsnoop_build_info{{{scope}}})"))
        assert sorted(r["metric"].get("cluster", "") for r in found) == ["", K8S_LABELS["cluster"]], name
        # the variables' own queries, as Grafana's label_values() asks them (the label's values under a match)
        for var in dash["templating"]["list"]:
            if var["type"] != "query" or var["name"] not in SCOPE_VARIABLES:
                continue
            selector, label = re.match(r"label_values\((.*), (\w+)\)$", var["query"]["query"]).groups()
            res = prom.api(f"/api/v1/label/{label}/values", **{"match[]": _opened(dash, selector)})
            expected = {"cluster": [K8S_LABELS["cluster"]], "namespace": [K8S_LABELS["namespace"]],
                        "job": [JOB], "instance": ["127.0.0.1"]}[label]
            assert res["data"] == expected, (name, var["name"], res)


def test_every_panel_shows_data_with_the_defaults_even_without_cluster_and_namespace(prom: Prom) -> None:
    """Every query as the dashboard opens returns data; and so does it when only the target without the
    cluster and namespace labels is there (an extra cluster="" matcher leaves the Kubernetes one out)."""
    empty = []
    for name, dash in load_dashboards().items():
        for panel in iter_panels(dash["panels"]):
            for t in _targets(panel):
                expr = _opened(dash, t["expr"])
                plain = expr.replace('cluster=~".*"', 'cluster=~".*",cluster=""')
                assert plain != expr
                for variant, e in (("defaults", expr), ("plain host only", plain)):
                    if not prom.query(e):
                        empty.append(f"{name}: {panel['title']} {t['refId']} ({variant}): {e}")
    assert not empty, "\n".join(empty)


def test_the_queries_the_docs_show_return_data(prom: Prom) -> None:
    """Each query a page of the documentation shows, run by a real Prometheus against the agent's real /metrics:
    it parses, and it returns series (a wrong label value, such as result="failed" where the agent says
    failure, returns nothing). absent() answers nothing while an agent is scraped."""
    queries = docs_expressions()
    assert len(queries) >= 5
    empty = [f"{where}: {expr}" for where, expr in queries
             if not expr.startswith("absent(") and not prom.query(expr)]
    assert not empty, "\n".join(empty)
    absent = [expr for _, expr in queries if expr.startswith("absent(")]
    assert absent and all(prom.query(expr) == [] for expr in absent)


def test_exemplars_reach_the_latency_and_origin_panels_with_the_trace_id(prom: Prom) -> None:
    """The trace id the agent attached reaches Prometheus' exemplar storage through each panel's own query:
    the session duration buckets and the error origins counter (the latest exported trace of an origin)."""
    now = time.time()
    checked = 0
    for name, dash in load_dashboards().items():
        for panel in iter_panels(dash["panels"]):
            for t in _targets(panel):
                if not t.get("exemplar"):
                    continue
                expr = _opened(dash, t["expr"])
                res = _wait(lambda e=expr: prom.api("/api/v1/query_exemplars", query=e, start=now - 600,
                                                    end=now + 600)["data"], timeout=30)
                ids = {ex["labels"].get("trace_id") for series in res or [] for ex in series["exemplars"]}
                assert f"{TRACE_ID:032x}" in ids, (name, panel["title"], res)
                checked += 1
    assert checked >= 3


def test_every_alert_rule_evaluates_on_the_real_server(prom: Prom) -> None:
    """The shipped rules (the origin ones too) loaded by the server that scrapes the agent's real /metrics: each
    one evaluated without error (promtool's unit tests say when they fire; this, that they run on real series)."""
    def evaluated() -> list[dict] | None:
        rules = [r for g in prom.api("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        done = all(r["health"] != "unknown" for r in rules)  # "unknown" until its first evaluation
        return rules if rules and done else None

    rules = _wait(evaluated, timeout=60)
    assert rules, prom.api("/api/v1/rules")
    assert {r["name"] for r in rules} == EXPECTED_ALERTS
    assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), rules

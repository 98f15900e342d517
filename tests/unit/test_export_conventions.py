"""Export conventions: OTLP metric units that the Collector's Prometheus translation turns back into the names
/metrics exposes and the dashboards query; the semantic-conventions schema URL; the metrics protocol variable.

`prometheus_name` is written here from the documented rules of the OpenTelemetry Collector's Prometheus
translation (collector-contrib pkg/translator/prometheus, README "Full normalization", the default; the
same rules in prometheus/otlptranslator for Prometheus' own OTLP receiver):
  - the name is split into words of letters and digits, joined again with `_`;
  - the unit is split at the first `/`; a main unit without curly braces is mapped (s -> seconds,
    By -> bytes, 1 -> nothing, ...; unknown units as written, cleaned up) and appended unless the name
    already has that word; a per-unit likewise as `per_<unit>` (s -> second, ...);
  - a monotonic sum loses any `total` word and ends in `_total`;
  - a gauge of unit "1" loses any `ratio` word and ends in `_ratio`;
  - a name starting with a digit gets a leading `_`.
"""

from __future__ import annotations

import ast
import io
import re
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import generate_latest

from retsnoop_otel.capture.model import (
    AppContext,
    CaptureStats,
    FuncStats,
    OriginCount,
    ProgramStats,
    RetKind,
    SessionStats,
    TracedFunc,
)
from retsnoop_otel.export.metrics_push import metrics_request
from retsnoop_otel.export.resource import build_resource
from retsnoop_otel.export.semconv import SCHEMA_URL, SEMCONV_VERSION
from retsnoop_otel.metrics.otlp_units import OTLP_UNITS
from retsnoop_otel.metrics.runtime_families import RunCounters
from retsnoop_otel.workload.k8s_watch import WatchCounters
from tests.dashboard_files import PROMETHEUS_SERIES, all_expressions, metric_names
from tests.fakes import World

# ---- the Collector's translation, from its documentation -------------------------------------------

_MAIN_UNITS = {"d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
               "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes",
               "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes",
               "GBy": "gigabytes", "TBy": "terabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules",
               "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent"}
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text)


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus metric name the Collector gives an OTLP metric; kind: counter | gauge | histogram."""
    words = _words(name)
    main, _, per = unit.partition("/")
    for text, table, lead in ((main.strip(), _MAIN_UNITS, []), (per.strip(), _PER_UNITS, ["per"])):
        if not text or "{" in text or "}" in text:
            continue
        suffix = "_".join(_words(table.get(text, text)))
        if suffix and suffix not in words:
            words += [*lead, suffix]
    if kind == "counter":
        words = [w for w in words if w != "total"] + ["total"]
    if kind == "gauge" and unit == "1":
        words = [w for w in words if w != "ratio"] + ["ratio"]
    out = "_".join(words)
    return "_" + out if out[:1].isdigit() else out


@pytest.mark.parametrize("name,unit,kind,want", [  # the documentation's own examples
    ("(lambda).function.executions(#)", "", "gauge", "lambda_function_executions"),
    ("system.filesystem.usage", "By", "gauge", "system_filesystem_usage_bytes"),
    ("system.network.dropped", "{packets}", "gauge", "system_network_dropped"),
    ("system.network.dropped", "packets", "gauge", "system_network_dropped_packets"),
    ("system.memory.utilization", "1", "gauge", "system_memory_utilization_ratio"),
    ("storage.filesystem.utilization", "%", "gauge", "storage_filesystem_utilization_percent"),
    ("astro.light.speed", "m/s", "gauge", "astro_light_speed_meters_per_second"),
    ("system.processes.created", "", "counter", "system_processes_created_total"),
    ("http.server.request.duration", "s", "histogram", "http_server_request_duration_seconds"),
    ("requests.count", "1", "counter", "requests_count_total"),  # "1" on a counter: no _ratio
    ("memory.usage", "By", "gauge", "memory_usage_bytes"),
    ("retsnoop_agent_up", "1", "gauge", "retsnoop_agent_up_ratio"),  # why no family uses "1"
])
def test_translation_follows_the_documented_examples(name: str, unit: str, kind: str, want: str) -> None:
    assert prometheus_name(name, unit, kind) == want


# ---- every family, both ways ----------------------------------------------------------------------------

FUNCS = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.INT32, True),
         1: TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False)}


def _runtime(tmp_path: Path):
    """A runtime whose collectors all have samples: probe set stats, BPF statistics on, thread context read."""
    from retsnoop_otel.runtime.config import ProbeSetConfig, RuntimeConfig
    from retsnoop_otel.runtime.deps import RuntimeDeps
    from retsnoop_otel.runtime.runtime import Runtime
    from tests.fakes import FakeProbeSet

    class ProbeSet(FakeProbeSet):
        def program_stats(self):
            return [ProgramStats("kprobe_entry", 4, 4000)]

    ps = ProbeSet(name="bpf", funcs=FUNCS, stats=lambda: [FuncStats(0, 2, {"EINVAL": 1}, (0, 1, 1), 12)],
                  sessions=[SessionStats(0, 2, 1, (0, 1, 1), 12)], capture=CaptureStats(1, 1, 1, 2, 2),
                  origins=[OriginCount(0, 1, "EINVAL", 1)])
    sysctl = tmp_path / "proc/sys/kernel/bpf_stats_enabled"
    sysctl.parent.mkdir(parents=True)
    sysctl.write_text("1\n")
    for entry in ("self", "stat"):
        (tmp_path / "proc" / entry).symlink_to(Path("/proc", entry))
    runtime = Runtime(RuntimeConfig(probe_sets=(ProbeSetConfig("bpf", ("f",)),)), RuntimeDeps(root=str(tmp_path)))
    runtime.probe_sets = [ps]  # type: ignore[list-item]
    runtime.metrics.counters = lambda: RunCounters(3, {"queue_full": 1}, 1, 1, {"success": 1, "failure": 0},
                                           {"linked": 1}, 2, 1, 0, user_stacks_unsymbolized={"timeout": 1},
                                           app_exec_watches={"located": 1},
                                           k8s=WatchCounters(True, {"forbidden": 1}, lists=1, events=2, pods=3),
                                           traces={("bpf", "app", "error"): 2})
    return runtime


def _exposed_families(runtime) -> dict[str, str]:
    """`# TYPE` name -> type of the /metrics exposition."""
    text = generate_latest(runtime.metrics.registry()).decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _pushed(runtime) -> list:
    families = [f for c in runtime.metrics.collectors() for f in c.collect()]
    return list(metrics_request(families, {}, 1, 2, OTLP_UNITS, SCHEMA_URL).resource_metrics[0].scope_metrics[0]
                .metrics)


def _kind(metric) -> str:
    data = metric.WhichOneof("data")
    if data == "sum":
        assert metric.sum.is_monotonic
        return "counter"
    return data


def test_every_family_has_a_unit_and_none_is_a_ratio(tmp_path: Path) -> None:
    pushed = _pushed(_runtime(tmp_path))
    assert {m.name for m in pushed} == set(OTLP_UNITS), "a family without its unit in metrics/otlp_units.py"
    for m in pushed:
        assert m.unit == OTLP_UNITS[m.name] and m.unit != "1", m.name
        if _kind(m) in ("counter", "gauge") and m.unit not in ("s", "By", ""):
            assert re.fullmatch(r"\{[a-z_]+\}", m.unit), (m.name, m.unit)  # counts: {what is counted}


def test_collector_translation_gives_back_the_exposed_names(tmp_path: Path) -> None:
    """Each family pushed over OTLP (name, unit, type), once through the Collector's translation, is the
    family /metrics exposes with the same type; nothing is missing either way."""
    runtime = _runtime(tmp_path)
    translated = {prometheus_name(m.name, m.unit, _kind(m)): _kind(m) for m in _pushed(runtime)}
    assert translated == _exposed_families(runtime)


def test_dashboards_and_alerts_query_only_translated_names(tmp_path: Path) -> None:
    runtime = _runtime(tmp_path)
    series = set()
    for name, kind in ((prometheus_name(m.name, m.unit, _kind(m)), _kind(m)) for m in _pushed(runtime)):
        series |= {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
    used = {n for _, expr in all_expressions() for n in metric_names(expr)} - PROMETHEUS_SERIES
    assert used and used <= series, sorted(used - series)


def test_the_runtime_pushes_units_and_schema_url_with_the_metrics_protocol_variable(tmp_path: Path,
                                                                                    world: World) -> None:
    """metrics.otlp without a protocol: OTEL_EXPORTER_OTLP_METRICS_PROTOCOL decides, the generic one does not;
    the request carries the families' units and the resource's schema URL, and OTEL_RESOURCE_ATTRIBUTES is read
    from the runtime's environment like every other variable."""
    from retsnoop_otel.agent.main import Agent
    from retsnoop_otel.command.logs import EventLog
    from tests.fakes import AGENT_CONFIG

    deps = world.deps()
    deps.environ = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
                    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=staging"}
    deps.make_resource = build_resource
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0).replace(
        'metrics:\n  listen: "127.0.0.1:0"\n',
        'metrics:\n  listen: "127.0.0.1:0"\n  otlp: {endpoint: "http://127.0.0.1:4318"}\n  otlp_interval: 3600\n'))
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    agent.start()
    try:
        assert agent.runtime.metrics_push.push()
    finally:
        agent.runtime.shutdown(1.0)
    settings, body = next((s, b) for s, b in world.requests if s.signal == "metrics")
    assert (settings.protocol, settings.url) == ("http/protobuf", "http://127.0.0.1:4318/v1/metrics")
    (rm,) = ExportMetricsServiceRequest.FromString(body).resource_metrics
    assert rm.schema_url == SCHEMA_URL
    resource = {a.key: a.value.string_value for a in rm.resource.attributes}
    assert resource["deployment.environment.name"] == "staging"  # the injected environment, not the process's
    units = {m.name: m.unit for m in rm.scope_metrics[0].metrics}
    assert units["retsnoop_function_calls"] == "{call}" and units["retsnoop_agent_up"] == "{agent}"
    assert units["retsnoop_function_duration_seconds"] == "s" and units["process_resident_memory_bytes"] == "By"
    assert all(units[name] == OTLP_UNITS[name] for name in units)


# ---- the schema URL ---------------------------------------------------------------------------------------


def _semconv_attributes() -> tuple[dict[str, str], dict[str, str]]:
    """Attribute name -> docstring, stable and incubating, read from the installed semconv package's source."""
    import opentelemetry.semconv as semconv

    root = Path(semconv.__file__).parent

    def read(sub: str) -> dict[str, str]:
        out = {}
        for path in (root / sub).glob("*_attributes.py"):
            body = ast.parse(path.read_text()).body
            for node, after in zip(body, [*body[1:], None], strict=True):
                if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant):
                    doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                        else ""
                    out[str(node.value.value)] = str(doc).strip()
        return out

    return read("attributes"), read("_incubating/attributes")


def _exported_attribute_names() -> set[str]:
    """Standard names of the resources (the agent's, on a Kubernetes node, and a workload's) and of spans of every
    kind (call tree, chain, application context)."""
    from retsnoop_otel.capture.model import Workload
    from retsnoop_otel.export.resource import with_cluster_name
    from retsnoop_otel.export.span_encoder import SpanEncoder, WorkloadEnvelopes, build_request
    from tests.fakes import TREE_FUNCS as CONTENT_FUNCS
    from tests.fakes import tree_session

    resource = with_cluster_name(build_resource(environ={"K8S_NODE_NAME": "node-a"}), "prod")  # cluster_name key
    names = set(resource.attributes)
    app = AppContext("ok", trace_id=1, span_id=2, trace_flags=1, service_name="shop")
    workload = Workload("3a8f1c4b" * 8, "containerd", "6f1b6c5e-2a4d-4a8e-9c3b-0f2e1d4c5b6a", "checkout-0", "shop",
                        "app", owners=(("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout")),
                        image_name="registry.example/shop/checkout", image_tags=("1.4.2",))
    kinds = ("daemonset", "statefulset", "job", "cronjob")
    others = [Workload(f"{i:064x}", owners=((k, k),)) for i, k in enumerate(kinds)]
    sessions = [tree_session(dropped_records=1), tree_session(calls=[]), tree_session(app=app),
                tree_session(workload=workload, exe_name="checkout-server"),
                *(tree_session(workload=w) for w in others)]
    envelopes = WorkloadEnvelopes(resource.attributes, resource.schema_url)
    enc = SpanEncoder(CONTENT_FUNCS, envelopes.base, symbolize=lambda a: "sym+0x1",
                      locate=lambda _a: ("kernel/bpf/syscall.c", 10), workloads=envelopes)
    own = SpanEncoder(CONTENT_FUNCS, envelopes.base, workloads=envelopes, service_per_session=True)  # the default
    request = ExportTraceServiceRequest.FromString(build_request([enc.encode(s, 0) for s in sessions] +
                                                                 [own.encode(s, 0) for s in sessions]))
    for rs in request.resource_spans:
        names |= {kv.key for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                names |= {kv.key for kv in span.attributes}
    return {n for n in names if not n.startswith("retsnoop.")}


def test_schema_url_names_a_version_whose_attributes_we_use_as_current() -> None:
    from opentelemetry.semconv.schemas import Schemas

    assert SCHEMA_URL == f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
    newest = max(tuple(map(int, s.value.rsplit("/", 1)[1].split("."))) for s in Schemas)
    if newest < tuple(map(int, SEMCONV_VERSION.split("."))):  # the lowest-versions venv: an older package
        pytest.skip(f"the installed semantic-conventions package predates schema {SEMCONV_VERSION}")
    assert SCHEMA_URL in {s.value for s in Schemas}  # a published schema the semconv package knows
    stable, incubating = _semconv_attributes()
    used = _exported_attribute_names()
    assert {"code.function.name", "code.file.path", "code.line.number", "error.type", "thread.id",
            "process.pid", "service.name", "host.name", "container.id", "container.runtime.name", "k8s.pod.uid",
            "k8s.pod.name", "k8s.namespace.name", "k8s.container.name", "k8s.node.name", "k8s.cluster.name",
            "service.namespace", "service.instance.id"} <= used
    for name in sorted(used):
        assert name in stable or name in incubating, f"{name}: not a semantic-convention attribute"
        doc = incubating.get(name, "")
        assert name in stable or not doc.startswith("Deprecated"), f"{name}: deprecated ({doc.splitlines()[0]})"


def test_resource_and_scope_carry_the_schema_url() -> None:
    from retsnoop_otel.export.span_encoder import SpanEncoder, build_request, make_envelope
    from tests.fakes import TREE_FUNCS as CONTENT_FUNCS
    from tests.fakes import tree_session

    resource = build_resource(environ={})
    assert resource.schema_url == SCHEMA_URL
    enc = SpanEncoder(CONTENT_FUNCS, make_envelope(resource.attributes, resource.schema_url))
    (rs,) = ExportTraceServiceRequest.FromString(build_request([enc.encode(tree_session(), time.time_ns())])) \
        .resource_spans
    assert rs.schema_url == rs.scope_spans[0].schema_url == SCHEMA_URL

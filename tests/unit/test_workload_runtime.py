"""Workload identity through the agent's runtime (no kernel: the World of tests/fakes.py): kept sessions
are annotated from a fixture /proc and cgroupfs tree, exported under a resource per workload; the
`kubernetes:` section reaches the resolver as settings, and a bad one is a file:line error.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from retsnoop_otel.agent.config_file import ConfigError, parse_config
from retsnoop_otel.agent.main import Agent
from retsnoop_otel.capture.records import SessionEndRec
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.workload.k8s_settings import KubernetesConfig
from retsnoop_otel.workload.pods import ContainerMeta, PodCache, PodMeta
from retsnoop_otel.workload.resolver import WorkloadResolver
from tests.fakes import (
    AGENT_CONFIG,
    APP,
    CID,
    UID,
    World,
    by_set,
    cgroup_id,
    error_session,
    fake_host,
    fake_process,
    wait_exported,
)
from tests.tls_certs import make_ca

BASE = "probe_sets:\n  - name: a\n    entry: [f]\nexporter:\n  console: true\n"


def _checkout_pod_world(tmp_path: Path, world: World) -> tuple[Path, object, list]:
    """A host with one process (pid 4321) in the checkout pod's container, the pod in the watch's cache, and the
    agent's deps resolving workloads from them; the list collects the kube settings each resolver was made with."""
    root = fake_host(tmp_path / "root")
    fake_process(root, 4321, f"0::/{APP}\n", "/usr/local/bin/checkout-server", comm="python")
    pods = PodCache(lambda: 0.0)
    pods.upsert(PodMeta(UID, "checkout-7d4b9c8f6-x2x9k", "shop", {CID: ContainerMeta("app", "containerd")}))
    made: list = []

    def make_workloads(root_dir, clock, kube, log):
        made.append(kube)
        return WorkloadResolver(str(root), clock, pods)

    deps = world.deps()
    deps.make_workloads = make_workloads
    return root, deps, made


def test_sessions_carry_their_workload_to_the_exported_resource(tmp_path: Path, world: World) -> None:
    root, deps, seen = _checkout_pod_world(tmp_path, world)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(AGENT_CONFIG.format(prob=1.0))
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    agent.start()
    try:
        t = by_set(world, "__x64_sys_bpf")
        host_session = error_session(t, tid=9)
        in_container = [r._replace(tgid=4321, cgroup_id=cgroup_id(root, APP))
                        if isinstance(r, SessionEndRec) else r._replace(tgid=4321)
                        for r in error_session(t, tid=4321)]
        gone = [r._replace(exe="python3.11") if isinstance(r, SessionEndRec) else r
                for r in error_session(t, tid=77)]  # exited: only the kernel's exe name is left
        t.pending += host_session + in_container + gone
        spans = wait_exported(world, 9)
    finally:
        agent.runtime.shutdown(1.0)
    assert seen == [None]  # no kubernetes section: no watch
    roots = {s.attributes["thread.id"]: s for s in spans if s.parent is None}
    app = roots[4321]
    assert {k: v for k, v in app.resource.items() if k.startswith(("container.", "k8s."))} == {
        "container.id": CID, "container.runtime.name": "containerd", "k8s.pod.uid": UID,
        "k8s.pod.name": "checkout-7d4b9c8f6-x2x9k", "k8s.namespace.name": "shop", "k8s.container.name": "app"}
    assert app.attributes["process.executable.name"] == "checkout-server"  # /proc/PID/exe, not comm "python"
    other = roots[9]
    assert not any(k.startswith(("container.", "k8s.")) for k in other.resource)
    assert other.attributes["process.executable.name"] == "python"  # no /proc entry, no exe: the kernel's comm
    assert roots[77].attributes["process.executable.name"] == "python3.11"  # named by the kernel at session end
    children = [s for s in spans if s.parent is not None and s.context.trace_id == app.context.trace_id]
    assert children and all(s.resource == app.resource for s in children)


def kube_files(tmp_path: Path) -> tuple[Path, Path]:
    token = tmp_path / "token"
    token.write_text("t")
    make_ca(tmp_path, "ca")
    return token, tmp_path / "ca.crt"


def test_kubernetes_section_in_cluster_defaults(tmp_path: Path) -> None:
    token, ca = kube_files(tmp_path)
    env = {"K8S_NODE_NAME": "node-a", "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = parse_config(BASE + f"kubernetes:\n  metadata: true\n  token_file: {token}\n  ca_file: {ca}\n",
                       "agent.yaml")
    assert cfg.runtime.kubernetes == KubernetesConfig(True, None, None, str(token), str(ca))
    assert parse_config(BASE, "agent.yaml").runtime.kubernetes == KubernetesConfig()  # off by default
    from retsnoop_otel.workload.k8s_settings import resolve_kubernetes
    s = resolve_kubernetes(cfg.runtime.kubernetes, env)
    assert (s.node_name, s.api_server, s.token_file, s.ca_data) == ("node-a", "https://10.96.0.1:443", str(token),
                                                                     ca.read_bytes())  # read once, here
    v6 = resolve_kubernetes(cfg.runtime.kubernetes, {**env, "KUBERNETES_SERVICE_HOST": "fd00:10:96::1"})
    assert v6.api_server == "https://[fd00:10:96::1]:443"
    assert not s.well_known_labels and cfg.runtime.kubernetes.cluster_name is None  # off, unset by default
    opted = parse_config(BASE + f"kubernetes:\n  metadata: true\n  token_file: {token}\n  ca_file: {ca}\n"
                         "  well_known_labels: true\n  cluster_name: prod-eu-1\n", "agent.yaml").runtime.kubernetes
    assert (opted.well_known_labels, opted.cluster_name) == (True, "prod-eu-1")
    assert resolve_kubernetes(opted, env).well_known_labels  # on to the watch (pods.pod_meta)
    # a cluster's name needs no watch: it names the agent's own resource too
    assert parse_config(BASE + "kubernetes:\n  cluster_name: c\n", "agent.yaml").runtime.kubernetes == \
        KubernetesConfig(cluster_name="c")


@pytest.mark.parametrize("section,want", [
    ("  metadata: true\n  api_server: ftp://x\n",
     "agent.yaml:8: kubernetes.api_server: 'ftp://x' is not an https:// URL"),
    ("  metadata: yes please\n", "agent.yaml:7: kubernetes.metadata: expected"),
    ("  metdata: true\n", "agent.yaml:7: kubernetes.metdata: unknown key; did you mean 'metadata'?"),
    ("  metadata: true\n  keep_deleted: -1\n", "agent.yaml:8: kubernetes.keep_deleted:"),
    ("  - metadata\n", "agent.yaml:7: kubernetes: expected a mapping"),
    ("  well_known_labels: true\n", "agent.yaml:7: kubernetes.well_known_labels: a pod's labels come from the pod "
     "metadata watch: turn it on with kubernetes.metadata: true"),
    ("  cluster_name: ''\n", "agent.yaml:7: kubernetes.cluster_name: expected the cluster's name"),
    ("  cluster_name: ' prod'\n", "agent.yaml:7: kubernetes.cluster_name: expected the cluster's name"),
    ("  cluster_name: 5\n", "agent.yaml:7: kubernetes.cluster_name: expected a string"),
])
def test_kubernetes_section_errors(section: str, want: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + "kubernetes:\n" + section, "agent.yaml")
    assert str(err.value).startswith(want), str(err.value)


@pytest.mark.parametrize("extra,env,want", [
    ("", {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
     "kubernetes.node_name: not set and $K8S_NODE_NAME is empty: give the node's name, or set K8S_NODE_NAME from "
     "the downward API (fieldRef spec.nodeName)"),
    ("", {"K8S_NODE_NAME": "n"}, "kubernetes.api_server: not set and $KUBERNETES_SERVICE_HOST/PORT are empty"),
    ("  token_file: /nonexistent/token\n", {"K8S_NODE_NAME": "n", "KUBERNETES_SERVICE_HOST": "h",
                                            "KUBERNETES_SERVICE_PORT": "443"},
     "kubernetes.token_file: /nonexistent/token: No such file or directory; mount the service-account token "
     "(automountServiceAccountToken: true)"),
])
def test_the_environment_is_checked_when_the_agent_starts(tmp_path: Path, extra: str, env: dict, want: str,
                                                          world: World) -> None:
    """The shipped file parses anywhere; `agent --check` and the start say what the watch lacks, as one line."""
    from retsnoop_otel.command.errors import InputError
    from retsnoop_otel.runtime.runtime import Runtime
    token, ca = kube_files(tmp_path)
    files = f"  ca_file: {ca}\n" + ("" if "token_file" in extra else f"  token_file: {token}\n")
    cfg = parse_config(BASE + "kubernetes:\n  metadata: true\n" + extra + files, "agent.yaml")
    deps = world.deps()
    deps.environ = env
    with pytest.raises(InputError) as err:
        Runtime(cfg.runtime, deps).settings()
    assert str(err.value).startswith(want), str(err.value)
    assert world.tracers == []


def test_json_output_carries_the_workload_and_the_executable() -> None:
    """--json (trace and the agent's console): one object per session, now with its workload."""
    from retsnoop_otel.capture.model import Workload
    from retsnoop_otel.render.console import session_json
    from tests.fakes import TREE_FUNCS, tree_session

    w = Workload(CID, "containerd", UID, "checkout-7d4b9c8f6-x2x9k", "shop", "app",
                 owners=(("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout")),
                 image_name="registry.example/shop/checkout", image_tags=("1.4.2",))
    out = session_json(tree_session(workload=w, exe_name="checkout-server"), TREE_FUNCS, 0)
    assert out["workload"] == {"container_id": CID, "container_runtime": "containerd", "pod_uid": UID,
                               "pod_name": "checkout-7d4b9c8f6-x2x9k", "namespace": "shop", "container_name": "app",
                               "owners": {"replicaset": "checkout-7d4b9c8f6", "deployment": "checkout"},
                               "image_name": "registry.example/shop/checkout", "image_tags": ["1.4.2"]}
    assert out["exe"] == "checkout-server" and out["proc_comm"] == "bpftool"
    podman = session_json(tree_session(workload=Workload("e4b0" * 16, "podman")), TREE_FUNCS, 0)
    assert podman["workload"] == {"container_id": "e4b0" * 16, "container_runtime": "podman"}
    assert "workload" not in session_json(tree_session(), TREE_FUNCS, 0)


WL_CONFIG = """\
probe_sets:
  - name: counted
    entry: ["*sys_bpf"]
    allow: [array_map_alloc_check]
    mode: metrics
    workload_label: container
metrics:
  listen: "127.0.0.1:0"
  max_workloads: 5
"""


def test_metrics_workload_label_through_the_runtime(tmp_path: Path, world: World) -> None:
    """workload_label: the kernel's per-cgroup counts reach /metrics as container_id series; a gone cgroup's
    counts stay, and its kernel entries are deleted."""
    from retsnoop_otel.capture.model import WorkloadCount
    root = fake_host(tmp_path / "root")
    app, top = cgroup_id(root, APP), cgroup_id(root, "")
    deleted: list[set[int]] = []

    def factory(funcs, cfg, btf_func_id):
        t = World.factory(world, funcs, cfg, btf_func_id)
        fid = t.fid("array_map_alloc_check")
        counts = {app: [WorkloadCount(app, fid, False, None, 3), WorkloadCount(app, fid, False, "EINVAL", 2)],
                  top: [WorkloadCount(top, fid, False, None, 4)]}
        t.workload_counts = lambda: [c for cs in counts.values() for c in cs]

        def forget(ids: set[int]) -> None:
            deleted.append(set(ids))
            for cg in ids:
                counts.pop(cg, None)

        t.forget_cgroups = forget
        return t

    deps = world.deps()
    deps.tracer_factory = factory
    deps.make_workloads = lambda root_dir, clock, kube, log: WorkloadResolver(str(root), clock, None, rescan_min_s=0)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(WL_CONFIG)
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    agent.start()
    try:
        assert agent.runtime.probe_sets[0].tracer.cfg.workload_stats  # the kernel side counts per cgroup
        from prometheus_client import generate_latest

        def series() -> list[str]:
            text = generate_latest(agent.runtime.metrics.registry()).decode()
            return [ln for ln in text.splitlines() if ln.startswith(("retsnoop_function_calls_total{",
                                                                      "retsnoop_function_errors_total{"))]

        want = ['retsnoop_function_calls_total{container_id="",function="array_map_alloc_check",'
                'probe_set="counted"} 4.0',
                f'retsnoop_function_calls_total{{container_id="containerd://{CID}",function="array_map_alloc_check",'
                'probe_set="counted"} 5.0',
                f'retsnoop_function_errors_total{{container_id="containerd://{CID}",error_type="EINVAL",'
                'function="array_map_alloc_check",probe_set="counted"} 2.0']
        assert sorted(series()) == sorted(want)
        (root / "sys/fs/cgroup" / APP).rmdir()  # the container is gone
        assert sorted(series()) == sorted(want)  # its counts stay in its series
        assert deleted == [{app}]
        assert sorted(series()) == sorted(want)  # and are not counted twice once the kernel forgot them
    finally:
        agent.runtime.shutdown(1.0)


def test_namespace_label_needs_the_metadata_watch(tmp_path: Path) -> None:
    from retsnoop_otel.command.errors import InputError
    from retsnoop_otel.runtime.runtime import Runtime
    cfg = parse_config(WL_CONFIG.replace("workload_label: container", "workload_label: namespace"))
    with pytest.raises(InputError) as err:
        Runtime(cfg.runtime, World().deps()).settings()
    assert "kubernetes.metadata: true" in str(err.value) and "counted" in str(err.value)


def test_cluster_name_and_workload_identity_through_the_runtime(tmp_path: Path, world: World) -> None:
    """kubernetes.cluster_name beats OTEL_RESOURCE_ATTRIBUTES' k8s.cluster.name on the agent's and every workload's
    resource; a reload that changes only the name changes the spans' resource, keeps the run's service.instance.id
    and does not restart the pod watch. A container's spans have its service.namespace and
    <namespace>.<pod>.<container> instance id; a host process's keep the agent's id."""
    from retsnoop_otel.export.resource import build_resource
    root, deps, watches = _checkout_pod_world(tmp_path, world)
    deps.make_resource = build_resource
    deps.environ = {"OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=from-env"}
    base = AGENT_CONFIG.format(prob=1.0).replace(  # and the OTLP metrics push: one last push as each one stops
        'metrics:\n  listen: "127.0.0.1:0"\n', 'metrics:\n  listen: "127.0.0.1:0"\n'
        '  otlp: {endpoint: "http://127.0.0.1:4318"}\n  otlp_interval: 3600\n')
    assert "otlp_interval" in base
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(base + "kubernetes:\n  cluster_name: prod-eu-1\n")
    agent = Agent(str(cfg), deps, EventLog(io.StringIO()))
    agent.start()

    def sessions() -> dict[int, dict]:
        """A host session (tid 9) and one in the container (4321): their root spans' resources."""
        t = by_set(world, "__x64_sys_bpf")
        world.exported.clear()
        t.pending += error_session(t, tid=9) + [
            r._replace(tgid=4321, cgroup_id=cgroup_id(root, APP)) if isinstance(r, SessionEndRec)
            else r._replace(tgid=4321) for r in error_session(t, tid=4321)]
        agent.runtime.poll_once()
        spans = wait_exported(world, 4)
        return {s.attributes["thread.id"]: s.resource for s in spans if s.parent is None}

    try:
        agent_id = agent.runtime.resource.attributes["service.instance.id"]
        first = sessions()
        cfg.write_text(base)  # the key left out: the environment's name
        assert agent.reload() is True
        second = sessions()
        cfg.write_text(base + "kubernetes:\n  cluster_name: prod-eu-2\n")
        assert agent.reload() is True
        third = sessions()
        assert agent.runtime.resource.attributes["service.instance.id"] == agent_id  # one id per run
    finally:
        agent.runtime.shutdown(1.0)
    assert [{tid: r["k8s.cluster.name"] for tid, r in run.items()} for run in (first, second, third)] == [
        {9: "prod-eu-1", 4321: "prod-eu-1"}, {9: "from-env", 4321: "from-env"}, {9: "prod-eu-2", 4321: "prod-eu-2"}]
    assert len(watches) == 1  # a cluster's name is no reason for a new watch
    # the pushed metrics' resource follows: a new push per name (each stopped one pushed a last time)
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    pushed = [ExportMetricsServiceRequest.FromString(body) for s, body in world.requests if s.signal == "metrics"]
    assert [{a.key: a.value.string_value for a in r.resource_metrics[0].resource.attributes}["k8s.cluster.name"]
            for r in pushed] == ["prod-eu-1", "from-env", "prod-eu-2"]
    app, host = first[4321], first[9]
    assert {k: v for k, v in app.items() if k.startswith("service.")} == {
        "service.name": "checkout-7d4b9c8f6-x2x9k",  # a bare pod (no owner here): its name
        "service.namespace": "shop", "service.instance.id": "shop.checkout-7d4b9c8f6-x2x9k.app"}
    assert host["service.instance.id"] == agent_id and "service.namespace" not in host

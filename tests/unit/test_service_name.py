"""A session's service and its identity (export/service_name.py): the application's own service.name, then the
semantic conventions' Kubernetes order (annotation, the well-known labels only when opted in, the owners, the pod's
name, the container's name), the executable's name; service.namespace and service.instance.id to match; the
workload's resource and k8s.cluster.name.

The pods are tests/fixtures/k8s/pods_identity.json (Pod objects in the API server's JSON format, one per step of
the order), read as the pod watch reads them (pods.pod_meta) and joined to a cgroup's ids as the resolver does
(resolver.pod_workload)."""

from __future__ import annotations

import pytest

from retsnoop_otel.capture.model import AppContext, Session, Workload
from retsnoop_otel.export.resource import build_resource, with_cluster_name, workload_attributes
from retsnoop_otel.export.service_name import UNKNOWN_SERVICE, session_identity, session_service
from retsnoop_otel.export.span_encoder import SpanEncoder, WorkloadEnvelopes, build_request
from retsnoop_otel.workload.cgroup_path import ContainerRef
from retsnoop_otel.workload.pods import pod_meta
from retsnoop_otel.workload.resolver import pod_workload
from tests.fake_apiserver import fixture
from tests.fakes import TREE_FUNCS, tree_session
from tests.oracle_spans import request_to_spans

PODS = {p["metadata"]["name"]: p for p in fixture("pods_identity.json")["items"]}


def _session(exe: str = "server", comm: str = "server", **kw) -> Session:
    s = Session(tid=1, pid=1, comm="worker-3", proc_comm=comm, start_ns=0, end_ns=1, is_err=True, chain=[], kstack=[],
                **kw)
    s.exe_name = exe
    return s


def _workload(pod_name: str, well_known_labels: bool = False, container: bool = True) -> Workload:
    """The workload of the pod's (first) container, or of its pod-level cgroup, as the resolver makes it."""
    obj = PODS[pod_name]
    pod = pod_meta(obj, well_known_labels)
    assert pod is not None
    cid, runtime = "", ""
    if container:
        runtime, _, cid = obj["status"]["containerStatuses"][0]["containerID"].partition("://")
    return pod_workload(ContainerRef(cid, runtime, pod.uid), pod)


def _service(pod_name: str, well_known_labels: bool = False) -> str:
    return session_service(_session(workload=_workload(pod_name, well_known_labels)))


@pytest.mark.parametrize(("pod", "off", "on"), [
    # resource.opentelemetry.io/service.name beats the labels and the owners, opted in or not
    ("checkout-7d4b9c8f6-x2x9k", "shop-checkout", "shop-checkout"),
    # app.kubernetes.io/instance, then app.kubernetes.io/name: only when opted in; else the Deployment
    ("web-5c9d8b7f4-k8l2m", "web", "storefront-eu"),
    ("db-0", "db", "postgres"),  # app.kubernetes.io/name alone; else the StatefulSet
    ("api-6b8f9c7d5-abcde", "api", "api"),  # the Deployment (from its ReplicaSet's name and pod-template-hash)
    ("frontend-x7k2p", "frontend", "frontend"),  # a ReplicaSet of its own
    ("node-exporter-q9z8w", "node-exporter", "node-exporter"),  # the DaemonSet
    ("report-29919600-q5l8d", "report", "report"),  # the CronJob (from its Job's scheduled name)
    ("migrate-2-h4j6k", "migrate-2", "migrate-2"),  # a Job made by hand
    ("debug-shell", "debug-shell", "debug-shell"),  # a bare pod: the pod's name, not its container's (shell)
])
def test_each_step_of_the_conventions_order_on_recorded_pods(pod: str, off: str, on: str) -> None:
    assert _service(pod) == off
    assert _service(pod, well_known_labels=True) == on


def test_the_well_known_labels_are_not_even_read_without_the_opt_in() -> None:
    web = PODS["web-5c9d8b7f4-k8l2m"]
    off, on = pod_meta(web), pod_meta(web, well_known_labels=True)
    assert off is not None and on is not None
    assert (off.app_instance, off.app_name) == ("", "")
    assert (on.app_instance, on.app_name) == ("storefront-eu", "storefront")
    assert off.annotated_service == on.annotated_service == ""  # annotations are read either way
    checkout = pod_meta(PODS["checkout-7d4b9c8f6-x2x9k"])
    assert checkout is not None and (checkout.annotated_service, checkout.annotated_namespace,
                                     checkout.annotated_instance) == ("shop-checkout", "retail", "checkout-blue-1")


def test_the_owner_kinds_in_the_conventions_order() -> None:
    def service(*owners: tuple[str, str]) -> str:
        return session_service(_session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "app",
                                                          owners=owners)))
    # one chain per pod, from the controller up: the highest kind wins
    assert service(("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout")) == "checkout"
    assert service(("job", "report-29919600"), ("cronjob", "report")) == "report"
    assert service(("statefulset", "db")) == "db" and service(("daemonset", "ds")) == "ds"
    assert service(("rollout", "r")) == "pod-1"  # a kind the conventions do not name: the pod's name


def test_then_the_container_name_then_the_executable() -> None:
    # a container name without a pod name: only a Workload made by hand has that; the order still says it
    assert session_service(_session(workload=Workload("a" * 64, "containerd", "uid", "", "", "api"))) == "api"
    assert session_service(_session(workload=Workload("a" * 64))) == "server"  # a container without pod metadata
    no_record = _session()
    no_record.app = AppContext("no_record")  # publishes no service name: the executable's
    assert session_service(no_record) == "server"
    assert session_service(_session(exe="", comm="kworker/0:1")) == "kworker/0:1"
    assert session_service(_session(exe="", comm="")) == UNKNOWN_SERVICE


def test_the_application_names_its_service_first() -> None:
    s = _session(workload=_workload("checkout-7d4b9c8f6-x2x9k", well_known_labels=True))
    s.app = AppContext("ok", service_name="checkout")
    assert session_service(s) == "checkout"


def test_identity_on_kubernetes() -> None:
    """service.namespace: the pod's namespace; service.instance.id: <namespace>.<pod>.<container>."""
    api = _session(workload=_workload("api-6b8f9c7d5-abcde"))
    assert session_identity(api) == (("service.name", "api"), ("service.namespace", "shop"),
                                     ("service.instance.id", "shop.api-6b8f9c7d5-abcde.api"))
    bare = _session(workload=_workload("debug-shell"))
    assert dict(session_identity(bare)) == {"service.name": "debug-shell", "service.namespace": "default",
                                            "service.instance.id": "default.debug-shell.shell"}
    # the annotations resource.opentelemetry.io/service.namespace and service.instance.id come first
    checkout = _session(workload=_workload("checkout-7d4b9c8f6-x2x9k"))
    assert dict(session_identity(checkout)) == {"service.name": "shop-checkout", "service.namespace": "retail",
                                                "service.instance.id": "checkout-blue-1"}


def test_identity_of_the_applications_own_process_context_first() -> None:
    s = _session(workload=_workload("api-6b8f9c7d5-abcde"))
    s.app = AppContext("ok", service_name="orders", service_namespace="commerce",
                       service_instance_id="627cc493-f310-47de-96bd-71410b7dec09")
    assert dict(session_identity(s)) == {"service.name": "orders", "service.namespace": "commerce",
                                         "service.instance.id": "627cc493-f310-47de-96bd-71410b7dec09"}
    s.app = AppContext("ok", service_name="orders")  # a context without them: the pod's
    assert dict(session_identity(s)) == {"service.name": "orders", "service.namespace": "shop",
                                         "service.instance.id": "shop.api-6b8f9c7d5-abcde.api"}


def test_identity_without_the_three_names_leaves_the_agents_instance_id() -> None:
    pod_level = _session(workload=_workload("api-6b8f9c7d5-abcde", container=False))  # a conmon scope
    assert dict(session_identity(pod_level)) == {"service.name": "api", "service.namespace": "shop"}
    assert session_identity(_session(workload=Workload("a" * 64, "docker"))) == (("service.name", "server"),)
    assert session_identity(_session()) == (("service.name", "server"),)


AGENT = {"service.name": "retsnoop-otel", "service.version": "0.1.0", "service.namespace": "observability",
         "service.instance.id": "0f8b2a4e-6c1d-4e3f-9a7b-5d2c1e0f8a9b", "host.name": "node-a",
         "k8s.cluster.name": "prod-eu-1"}


def _resources(service_per_session: bool, *sessions: Session) -> list[dict]:
    envelopes = WorkloadEnvelopes(AGENT)
    enc = SpanEncoder(TREE_FUNCS, envelopes.base, workloads=envelopes, service_per_session=service_per_session)
    spans = request_to_spans(build_request([enc.encode(s, 0) for s in sessions]))
    return [s["resource"] for s in spans if s["parent_id"] is None]


def test_workload_spans_carry_the_workloads_identity_and_the_cluster() -> None:
    api = tree_session(workload=_workload("api-6b8f9c7d5-abcde"))
    host = tree_session()
    pod_res, host_res = _resources(True, api, host)
    assert {k: v for k, v in pod_res.items() if k.startswith(("service.", "k8s.cluster"))} == {
        "service.name": "api", "service.namespace": "shop", "service.instance.id": "shop.api-6b8f9c7d5-abcde.api",
        "k8s.cluster.name": "prod-eu-1"}  # the agent's version and namespace are not the workload's
    assert pod_res["k8s.pod.name"] == "api-6b8f9c7d5-abcde" and pod_res["k8s.deployment.name"] == "api"
    # outside Kubernetes: the executable's service, the agent's instance id, no namespace
    assert {k: v for k, v in host_res.items() if k.startswith("service.")} == {
        "service.name": "bpftool", "service.instance.id": AGENT["service.instance.id"]}
    # service_name_from: agent: every span under the agent's own identity
    (agent_res,) = _resources(False, api)
    assert {k: agent_res[k] for k in AGENT} == AGENT and agent_res["k8s.namespace.name"] == "shop"


def test_the_resource_names_the_owners_and_the_image() -> None:
    w = Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "app", "shop-checkout", "checkout-api",
                 (("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout")),
                 "registry.example:5000/shop/checkout", ("1.4.2",))
    assert workload_attributes(w) == {
        "container.id": "a" * 64, "container.runtime.name": "containerd",
        "container.image.name": "registry.example:5000/shop/checkout", "container.image.tags": ["1.4.2"],
        "k8s.pod.uid": "uid", "k8s.pod.name": "pod-1", "k8s.namespace.name": "shop", "k8s.container.name": "app",
        "k8s.replicaset.name": "checkout-7d4b9c8f6", "k8s.deployment.name": "checkout"}
    kinds = ("replicaset", "deployment", "daemonset", "statefulset", "job", "cronjob")
    assert set(workload_attributes(Workload(pod_uid="u", owners=tuple((k, k + "-x") for k in kinds)))) == {
        "k8s.pod.uid", *(f"k8s.{k}.name" for k in kinds)}
    assert workload_attributes(Workload(pod_uid="u", owners=(("rollout", "r"),))) == {"k8s.pod.uid": "u"}
    assert "container.image.tags" not in workload_attributes(Workload("b" * 64, image_name="nginx"))  # a digest only


def test_each_workload_and_identity_has_its_own_resource() -> None:
    envelopes = WorkloadEnvelopes(AGENT)
    server = (("service.name", "server"),)
    assert envelopes.of(None) is envelopes.base and envelopes.of(None, None) is envelopes.base
    host_app, pod_app = envelopes.of(None, server), envelopes.of(Workload("b" * 64), server)
    assert host_app is not pod_app and host_app is envelopes.of(None, server)
    assert envelopes.of(Workload("b" * 64), (("service.name", "other"),)) is not pod_app
    assert envelopes.of(Workload("b" * 64), (*server, ("service.instance.id", "x"))) is not pod_app


def test_a_sessions_envelope_is_looked_up_by_what_decides_its_identity() -> None:
    envelopes = WorkloadEnvelopes(AGENT, max_entries=4)
    api = _workload("api-6b8f9c7d5-abcde")
    first = envelopes.of_session(_session(workload=api))
    assert first is envelopes.of(api, session_identity(_session(workload=api)))  # one envelope per identity
    assert envelopes.of_session(_session(workload=api, exe="other")) is first  # the pod names it, not the exe
    own = _session(workload=api)
    own.app = AppContext("ok", service_name="orders", service_instance_id="i-1")
    assert envelopes.of_session(own) is not first
    assert envelopes.of_session(_session(exe="a")) is not envelopes.of_session(_session(exe="b"))  # host processes
    for i in range(10):  # bounded
        envelopes.of_session(_session(exe=f"e{i}"))
    assert len(envelopes._by_session) <= 4


def test_cluster_name_from_the_config_or_the_environment() -> None:
    detected = build_resource({"OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=from-env,service.namespace=tools"})
    assert detected.attributes["k8s.cluster.name"] == "from-env"  # the standard variable, as for any attribute
    assert with_cluster_name(detected, None) is detected
    configured = with_cluster_name(detected, "prod-eu-1")  # kubernetes.cluster_name beats the variable
    assert configured.attributes["k8s.cluster.name"] == "prod-eu-1" and configured.schema_url == detected.schema_url
    assert configured.attributes["service.instance.id"] == detected.attributes["service.instance.id"]
    assert "k8s.cluster.name" not in build_resource({}).attributes  # nothing detects one
    assert with_cluster_name(build_resource({}), "c").attributes["k8s.cluster.name"] == "c"

"""A session's service: the application's own service.name, the pod's annotation, its app.kubernetes.io/name label,
its owning workload's name, the container's name, the executable's name; and the workload's resource."""

from __future__ import annotations

from retsnoop_otel.capture.model import AppContext, Session, Workload
from retsnoop_otel.export.resource import workload_attributes
from retsnoop_otel.export.service_name import UNKNOWN_SERVICE, session_service
from retsnoop_otel.export.span_encoder import WorkloadEnvelopes


def _session(exe: str = "server", comm: str = "server", **kw) -> Session:
    s = Session(tid=1, pid=1, comm="worker-3", proc_comm=comm, start_ns=0, end_ns=1, is_err=True, chain=[], kstack=[],
                **kw)
    s.exe_name = exe
    return s


def test_the_application_names_its_service_first() -> None:
    s = _session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "shop-api"))
    s.app = AppContext("ok", service_name="checkout")
    assert session_service(s) == "checkout"


def test_then_the_container_name_then_the_executable() -> None:
    assert session_service(_session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "api"))) == "api"
    assert session_service(_session(workload=Workload("a" * 64))) == "server"  # a container without pod metadata
    no_record = _session()
    no_record.app = AppContext("no_record")  # publishes no service name: the executable's
    assert session_service(no_record) == "server"
    assert session_service(_session(exe="", comm="kworker/0:1")) == "kworker/0:1"
    assert session_service(_session(exe="", comm="")) == UNKNOWN_SERVICE


DEPLOYMENT = (("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout"))


def test_the_kubernetes_conventions_in_their_order() -> None:
    def service(**kw) -> str:
        return session_service(_session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "app", **kw)))

    full = {"annotated_service": "shop-checkout", "app_name": "checkout-api", "owners": DEPLOYMENT}
    assert service(**full) == "shop-checkout"  # resource.opentelemetry.io/service.name
    assert service(**{**full, "annotated_service": ""}) == "checkout-api"  # app.kubernetes.io/name
    assert service(owners=DEPLOYMENT) == "checkout"  # the highest owner known: the Deployment, not its ReplicaSet
    assert service(owners=(("replicaset", "frontend"),)) == "frontend"
    assert service(owners=(("job", "report-29919600"), ("cronjob", "report"))) == "report"
    assert service(owners=(("daemonset", "node-exporter"),)) == "node-exporter"
    assert service() == "app"  # a bare pod: its container's name
    # the application's own name beats every convention
    s = _session(workload=Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "app", **full))
    s.app = AppContext("ok", service_name="checkout")
    assert session_service(s) == "checkout"
    # a pod-level cgroup (the runtime's monitor) of a Deployment's pod: the Deployment's
    assert session_service(_session(workload=Workload("", "", "uid", "pod-1", "shop", owners=DEPLOYMENT))) == "checkout"


def test_the_resource_names_the_owners_and_the_image() -> None:
    w = Workload("a" * 64, "containerd", "uid", "pod-1", "shop", "app", "shop-checkout", "checkout-api", DEPLOYMENT,
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


def test_each_workload_and_service_has_its_own_resource() -> None:
    base = {"service.name": "retsnoop-otel", "service.version": "0.1.0", "host.name": "h"}
    envelopes = WorkloadEnvelopes(base)
    assert envelopes.of(None) is envelopes.base and envelopes.of(None, None) is envelopes.base
    host_app, pod_app = envelopes.of(None, "server"), envelopes.of(Workload("b" * 64), "server")
    assert host_app is not pod_app and host_app is envelopes.of(None, "server")
    assert envelopes.of(Workload("b" * 64), "other") is not pod_app

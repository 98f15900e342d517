"""Issue 12, item 1 on real kernels: every session exported under the resource of the container and pod it ran in.

Guest side: tests/vm/scenarios/workload_identity.py (scenario workload_identity): real cgroup v2 directories in
each layout and a named cgroup v1 hierarchy, the bundled workload run in each, the agent exporting to a real
OTLP receiver with its pod metadata watch on a recorded-response API server over HTTPS.
"""

from __future__ import annotations

import pytest

from tests.vm.scenarios import workload_identity as w

pytestmark = pytest.mark.vm
CHECKOUT = {"k8s.pod.uid": w.CHECKOUT_UID, "k8s.pod.name": "checkout-7d4b9c8f6-x2x9k", "k8s.namespace.name": "shop",
            "k8s.replicaset.name": "checkout-7d4b9c8f6", "k8s.deployment.name": "checkout"}  # the pod's owners
WANT = {  # layout -> the workload part of its resource (every other key is the agent's own)
    "containerd_systemd": {"container.id": w.APP_ID, "container.runtime.name": "containerd", **CHECKOUT,
                           "k8s.container.name": "app", "container.image.name": "registry.example/shop/checkout",
                           "container.image.tags": ["1.4.2"]},
    # deleted by the watch events before it ran: its names stay for a while
    "crio_systemd_guaranteed": {"container.id": w.COREDNS_ID, "container.runtime.name": "cri-o",
                                "k8s.pod.uid": w.COREDNS_UID, "k8s.pod.name": "coredns-76f75df574-9bz6m",
                                "k8s.namespace.name": "kube-system", "k8s.container.name": "coredns",
                                "k8s.replicaset.name": "coredns-76f75df574", "k8s.deployment.name": "coredns",
                                "container.image.name": "registry.k8s.io/coredns/coredns",
                                "container.image.tags": ["v1.11.3"]},
    # the cgroupfs path names no runtime: the pod's containerStatuses do; the pod came from watch events only
    "containerd_cgroupfs": {"container.id": w.WEB_ID, "container.runtime.name": "containerd",
                            "k8s.pod.uid": w.WEB_UID, "k8s.pod.name": "web-5c9d8b7f4-k8l2m",
                            "k8s.namespace.name": "shop", "k8s.container.name": "web",
                            "k8s.replicaset.name": "web-5c9d8b7f4", "k8s.deployment.name": "web",
                            "container.image.name": "registry.example/shop/web", "container.image.tags": ["2.0.1"]},
    "crio_conmon": CHECKOUT,  # the runtime's monitor: in the pod, not a container
    "docker_systemd": {"container.id": w.DOCKER_ID, "container.runtime.name": "docker"},
    "docker_cgroupfs": {"container.id": w.DOCKERFS_ID, "container.runtime.name": "docker"},
    "podman_rootful_nested": {"container.id": w.PODMAN_ID, "container.runtime.name": "podman"},
    "podman_rootless": {"container.id": w.ROOTLESS_ID, "container.runtime.name": "podman"},
    "v1_named_docker": {"container.id": w.V1_ID, "container.runtime.name": "docker"},
}
# service.name (export/service_name.py): the pod's annotation (coredns), its owning Deployment (checkout, its
# conmon scope too; web, whose app.kubernetes.io/name label is not read without kubernetes.well_known_labels);
# outside Kubernetes, the executable's name
SERVICE = {"containerd_systemd": "checkout", "crio_systemd_guaranteed": "cluster-dns",
           "containerd_cgroupfs": "web", "crio_conmon": "checkout"}
# service.namespace and service.instance.id (<namespace>.<pod>.<container>) of a container the watch names; the
# conmon scope (a pod-level cgroup, no container name) and the containers outside Kubernetes keep the agent's id
IDENTITY = {"containerd_systemd": ("shop", "shop.checkout-7d4b9c8f6-x2x9k.app"),
            "crio_systemd_guaranteed": ("kube-system", "kube-system.coredns-76f75df574-9bz6m.coredns"),
            "containerd_cgroupfs": ("shop", "shop.web-5c9d8b7f4-k8l2m.web"), "crio_conmon": ("shop", None)}
AGENT_KEYS = {"service.name", "service.instance.id", "host.name", "k8s.node.name", "os.type", "telemetry.sdk.name"}


def _workload_part(resource: dict) -> dict:
    return {k: v for k, v in resource.items() if k.startswith(("container.", "k8s.")) and k != "k8s.node.name"}


def test_each_layout_runs_its_workload_in_its_cgroup(vm_batch) -> None:
    r = vm_batch["workload_identity"]
    assert r["cgroup_mount"] in ("mounted", "mounted by the scenario")
    assert r["v1_mount"] == "ok"
    assert set(r["runs"]) == set(WANT)
    for name, run in r["runs"].items():
        assert run["rc"] == 0, (name, run)


def test_each_container_has_its_own_resource(vm_batch) -> None:
    r = vm_batch["workload_identity"]
    by_pid = {}
    for root in r["roots"]:
        by_pid.setdefault(root["pid"], []).append(root)
    resources = {}
    agent_ids = set()
    for name, want in WANT.items():
        roots = [x for x in by_pid.get(r["runs"][name]["pid"], []) if x["error"] == "EINVAL"]
        assert len(roots) == 1, (name, by_pid.get(r["runs"][name]["pid"]))
        (root,) = roots
        assert root["name"] == "__x64_sys_bpf"
        assert _workload_part(root["resource"]) == want, name
        assert AGENT_KEYS <= set(root["resource"]), name
        assert root["resource"]["host.name"] == root["resource"]["k8s.node.name"] == "node-a"  # K8S_NODE_NAME
        assert root["exe"].startswith("python"), root  # /proc/PID/exe (python3.11), not the kernel's comm
        assert root["resource"]["service.name"] == SERVICE.get(name, root["exe"]), name
        namespace, instance = IDENTITY.get(name, (None, None))
        assert root["resource"].get("service.namespace") == namespace, name
        if instance is not None:
            assert root["resource"]["service.instance.id"] == instance, name
        else:
            agent_ids.add(root["resource"]["service.instance.id"])
        resources[name] = tuple(sorted((k, repr(v)) for k, v in root["resource"].items()))  # tags: a list
    # one ResourceSpans per workload: the resources differ (container.id, or the pod for the conmon scope)
    assert len(set(resources.values())) == len(WANT)
    (agent_id,) = agent_ids  # the agent's one id of the run, a random UUID
    assert len(agent_id) == 36 and agent_id.count("-") == 4


def test_pod_watch_was_current_and_quiet(vm_batch) -> None:
    r = vm_batch["workload_identity"]
    metrics = dict(line.rsplit(" ", 1) for line in r["metrics"])
    assert float(metrics["retsnoop_k8s_metadata_current"]) == 1.0
    assert float(metrics["retsnoop_k8s_pods"]) == 3.0  # checkout, the pending pod, web (coredns was deleted)
    assert float(metrics["retsnoop_k8s_pod_lists_total"]) == 1.0
    errors = [x for x in r["metrics"] if x.startswith("retsnoop_k8s_watch_errors_total{")]
    assert len(errors) == 6 and all(x.endswith(" 0.0") for x in errors), errors  # every reason, none counted
    assert r["agent_log"] == [] and r["agent_rc"] == 0


def test_metrics_per_namespace_count_each_workloads_calls(vm_batch) -> None:
    """Issue 12, item 2: a `mode: metrics` probe set with `workload_label: namespace` counts the same failing
    calls in the kernel per cgroup; /metrics names them by the pod's namespace ("" outside any pod)."""
    r = vm_batch["workload_identity"]
    got = dict(line.rsplit(" ", 1) for line in r["workload_metrics"])

    def value(family: str, **labels: str) -> float:
        want = {**labels, "probe_set": "per_namespace"}
        hits = [float(v) for k, v in got.items() if k.startswith(family + "{") and
                dict(p.split("=", 1) for p in k[len(family) + 1:-1].split(",")) == {
                    n: f'"{x}"' for n, x in want.items()}]
        assert len(hits) == 1, (family, labels, r["workload_metrics"])
        return hits[0]

    errors = "retsnoop_function_errors_total"
    fn = {"function": "array_map_alloc_check", "error_type": "EINVAL"}
    # checkout's container and its conmon scope, and web: namespace shop; coredns: kube-system
    assert value(errors, **fn, namespace="shop") == 3
    assert value(errors, **fn, namespace="kube-system") == 1
    # docker, podman and the v1 run: no pod
    assert value(errors, **fn, namespace="") == 5
    sessions = "retsnoop_sessions_total"
    assert value(sessions, entry_function="__x64_sys_bpf", outcome="error", namespace="shop") == 3
    assert value("retsnoop_workload_counts_dropped_total") == 0

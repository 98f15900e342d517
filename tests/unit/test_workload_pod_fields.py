"""What a Pod object says of its workload (workload/pod_fields.py): owners from ownerReferences and labels,
container.image.name and .tags from image references, and the pod's service annotation and label."""

from __future__ import annotations

import pytest

from retsnoop_otel.workload.pod_fields import cronjob_of, owners, spec_images, split_image
from retsnoop_otel.workload.pods import ContainerMeta, pod_meta

DIGEST = "sha256:" + "8a1b2c3d" * 8


def _ref(kind: str, name: str, api: str = "apps/v1", controller: bool | None = True) -> dict:
    ref = {"apiVersion": api, "kind": kind, "name": name, "uid": "u"}
    if controller is not None:
        ref["controller"] = controller
    return ref


@pytest.mark.parametrize(("meta", "want"), [
    # a Deployment's ReplicaSet: the Deployment is the name without -<pod-template-hash>
    ({"ownerReferences": [_ref("ReplicaSet", "checkout-7d4b9c8f6")], "labels": {"pod-template-hash": "7d4b9c8f6"}},
     (("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout"))),
    ({"ownerReferences": [_ref("ReplicaSet", "my-app-v2-5c9d8b7f4")], "labels": {"pod-template-hash": "5c9d8b7f4"}},
     (("replicaset", "my-app-v2-5c9d8b7f4"), ("deployment", "my-app-v2"))),
    # a ReplicaSet of its own (no label), or one whose name does not end in the label: no Deployment claimed
    ({"ownerReferences": [_ref("ReplicaSet", "frontend")]}, (("replicaset", "frontend"),)),
    ({"ownerReferences": [_ref("ReplicaSet", "web-abc")], "labels": {"pod-template-hash": "xyz"}},
     (("replicaset", "web-abc"),)),
    ({"ownerReferences": [_ref("ReplicaSet", "-h")], "labels": {"pod-template-hash": "h"}}, (("replicaset", "-h"),)),
    ({"ownerReferences": [_ref("DaemonSet", "retsnoop-otel")]}, (("daemonset", "retsnoop-otel"),)),
    ({"ownerReferences": [_ref("StatefulSet", "db")]}, (("statefulset", "db"),)),
    ({"ownerReferences": [_ref("Job", "migrate-2", "batch/v1")], "creationTimestamp": "2026-11-20T12:00:03Z"},
     (("job", "migrate-2"),)),
    # only the controller reference; only the built-in kinds of their API group
    ({"ownerReferences": [_ref("StatefulSet", "x", controller=False), _ref("DaemonSet", "y")]}, (("daemonset", "y"),)),
    ({"ownerReferences": [_ref("StatefulSet", "x", controller=None)]}, ()),
    ({"ownerReferences": [_ref("ReplicaSet", "r", "argoproj.io/v1alpha1")]}, ()),
    ({"ownerReferences": [_ref("Rollout", "r", "argoproj.io/v1alpha1")]}, ()),
    ({"ownerReferences": [_ref("Node", "node-a", "v1")]}, ()),  # a static pod's mirror
    ({}, ()), ({"ownerReferences": None}, ()), ({"ownerReferences": [None, "x"]}, ()),
])
def test_owners(meta: dict, want: tuple) -> None:
    assert owners(meta) == want


def test_a_cronjobs_job_is_named_by_its_scheduled_minute() -> None:
    created = "2026-11-20T12:00:03Z"  # 29919600 minutes after the epoch is 12:00:00
    assert cronjob_of("report-29919600", created) == "report"
    assert cronjob_of("nightly-backup-29919600", created) == "nightly-backup"
    assert cronjob_of("report-29919600", "2026-12-20T11:59:00Z") == "report"  # a pod made again, 30 days on
    # not a schedule: a small number, a date, a time after the pod, or long before it; no time to judge by
    for job in ("migrate-2", "backup-20240101", "report-29919700", "report-29819600", "29919600", "-29919600"):
        assert cronjob_of(job, created) == "", job
    assert cronjob_of("report-29919600", "") == "" and cronjob_of("report-29919600", "yesterday") == ""
    meta = {"ownerReferences": [_ref("Job", "report-29919600", "batch/v1")], "creationTimestamp": created}
    assert owners(meta) == (("job", "report-29919600"), ("cronjob", "report"))


@pytest.mark.parametrize(("ref", "want"), [
    ("registry.example/shop/checkout:1.4.2", ("registry.example/shop/checkout", ("1.4.2",))),
    ("nginx", ("nginx", ("latest",))),  # no tag, no digest: what the runtime pulls
    ("docker.io/library/nginx:1.27-alpine", ("docker.io/library/nginx", ("1.27-alpine",))),
    # a registry's port is not a tag
    ("registry.example:5000/shop/app", ("registry.example:5000/shop/app", ("latest",))),
    ("registry.example:5000/shop/app:v2", ("registry.example:5000/shop/app", ("v2",))),
    ("localhost:5000/app", ("localhost:5000/app", ("latest",))),
    ("[::1]:5000/app:1", ("[::1]:5000/app", ("1",))),
    # a digest is no tag
    (f"registry.example:5000/shop/app@{DIGEST}", ("registry.example:5000/shop/app", ())),
    (f"registry.example:5000/shop/app:1.4@{DIGEST}", ("registry.example:5000/shop/app", ("1.4",))),
    (f"nginx@{DIGEST}", ("nginx", ())),
    # a bare image id (what some runtimes report as containerStatuses[].image), nothing
    (DIGEST, ("", ())), ("8a1b2c3d" * 8, ("", ())), ("", ("", ())), ("  ", ("", ())), (":1", ("", ())),
])
def test_split_image(ref: str, want: tuple) -> None:
    assert split_image(ref) == want


def test_images_come_from_the_spec_then_the_status() -> None:
    spec = {"containers": [{"name": "app", "image": "shop/app:1"}, {"name": "noimage"}, "junk"],
            "initContainers": [{"name": "init", "image": "shop/init:1"}],
            "ephemeralContainers": [{"name": "debug", "image": "busybox"}]}
    assert spec_images(spec) == {"app": "shop/app:1", "init": "shop/init:1", "debug": "busybox"}
    cid = "containerd://" + "ab" * 32
    status = {"containerStatuses": [
        # the runtime reports another tag of the same image: the spec's is what was asked for
        {"name": "app", "image": "shop/app:latest", "containerID": cid},
        {"name": "side", "image": f"docker.io/shop/side@{DIGEST}", "containerID": "cri-o://" + "cd" * 32}]}
    obj = {"metadata": {"uid": "u", "name": "p", "namespace": "n",
                        "labels": {"app.kubernetes.io/name": "shop", "app.kubernetes.io/instance": "shop-eu"},
                        "annotations": {"resource.opentelemetry.io/service.name": " checkout "}},
           "spec": spec, "status": status}
    pod = pod_meta(obj)
    assert pod is not None and pod.annotated_service == "checkout"
    assert (pod.app_name, pod.app_instance) == ("", "")  # the well-known labels: only with kubernetes.well_known_labels
    labelled = pod_meta(obj, well_known_labels=True)
    assert labelled is not None and (labelled.app_name, labelled.app_instance) == ("shop", "shop-eu")
    assert pod.containers == {"ab" * 32: ContainerMeta("app", "containerd", "shop/app", ("1",)),
                              "cd" * 32: ContainerMeta("side", "cri-o", "docker.io/shop/side", ())}
    assert pod.owners == ()
    odd = pod_meta({"metadata": {"uid": "u", "labels": ["not", "a", "map"], "annotations": None}}, True)
    assert odd is not None and (odd.app_name, odd.annotated_service, odd.owners) == ("", "", ())

"""What a Pod object says of its workload beyond names: its owners, its containers' images, its service.

Read from the pod alone, so the agent's RBAC stays `pods: get, list, watch`:
- owners: the controller ownerReference (`controller: true`) names the ReplicaSet, DaemonSet, StatefulSet or
  Job. A Deployment names its ReplicaSets `<deployment>-<pod-template-hash>` and labels their pods
  `pod-template-hash`, so the Deployment is the ReplicaSet's name without `-<that label>` (a ReplicaSet
  made by hand, or by another controller such as Argo Rollouts, has no such label: no Deployment is
  claimed). A CronJob names its Jobs `<cronjob>-<scheduled time in minutes since the epoch>`; that suffix is
  taken as a CronJob's only when it is a time at most 31 days before the pod was created and not after it
  (a Job named `migrate-2` or `backup-20240101` by hand is not a CronJob's).
- images: spec.containers[].image (and the init and ephemeral containers'), as the pod asked for it; the
  status's image only for a container the spec does not list (containerStatuses[].image is what the
  runtime resolved, at times another tag of the same image, or a bare image id). A reference is
  `[registry[:port]/]path[:tag][@digest]`: the name is everything before the tag and the digest, the tag
  is what follows the last `:` after the last `/` (a registry's port is not a tag); no tag and no digest
  means `latest`, as the runtime pulls it; a digest alone is no tag.
- the service (export/service_name.py): the `resource.opentelemetry.io/service.name`, `service.namespace` and
  `service.instance.id` annotations (OpenTelemetry's Kubernetes conventions), and, only when the agent is told to
  use them (`kubernetes.well_known_labels`), the `app.kubernetes.io/instance` and `app.kubernetes.io/name` labels
  (Kubernetes' well-known labels, which the conventions use behind the same kind of opt-in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

SERVICE_ANNOTATION = "resource.opentelemetry.io/service.name"
NAMESPACE_ANNOTATION = "resource.opentelemetry.io/service.namespace"
INSTANCE_ANNOTATION = "resource.opentelemetry.io/service.instance.id"
APP_INSTANCE_LABEL = "app.kubernetes.io/instance"
APP_NAME_LABEL = "app.kubernetes.io/name"
TEMPLATE_HASH_LABEL = "pod-template-hash"
# (API group, kind) of a pod's controller -> the kind's word in k8s.<kind>.name
CONTROLLER_KINDS = {("apps", "ReplicaSet"): "replicaset", ("apps", "DaemonSet"): "daemonset",
                    ("apps", "StatefulSet"): "statefulset", ("batch", "Job"): "job"}
CRONJOB_WINDOW_S = 31 * 86400  # a CronJob's Job whose pod starts later than this is not recognised as one
CLOCK_SKEW_S = 600
_SCHEDULED = re.compile(r"^(.+)-([0-9]{1,12})$")
_IMAGE_ID = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def owners(meta: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A pod's metadata -> ((kind, name), ...) from its controller up: (("replicaset", "web-5c9d8b7f4"),
    ("deployment", "web")); () without a controller of a known kind (a bare pod, a static pod, a custom one)."""
    refs = meta.get("ownerReferences")
    ref = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None) \
        if isinstance(refs, list) else None
    if ref is None:
        return ()
    api_version = _text(ref.get("apiVersion"))
    group = api_version.partition("/")[0] if "/" in api_version else ""
    kind, name = CONTROLLER_KINDS.get((group, _text(ref.get("kind")))), _text(ref.get("name"))
    if kind is None or not name:
        return ()
    chain = [(kind, name)]
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    if kind == "replicaset":
        template_hash = _text(labels.get(TEMPLATE_HASH_LABEL))
        if template_hash and name.endswith("-" + template_hash) and len(name) > len(template_hash) + 1:
            chain.append(("deployment", name[:-len(template_hash) - 1]))
    elif kind == "job":
        cronjob = cronjob_of(name, _text(meta.get("creationTimestamp")))
        if cronjob:
            chain.append(("cronjob", cronjob))
    return tuple(chain)


def cronjob_of(job: str, pod_created: str) -> str:
    """The CronJob that made a Job of this name, judged by the name and the pod's creation time; "" if none."""
    m = _SCHEDULED.match(job)
    created = _epoch_s(pod_created)
    if m is None or created is None:
        return ""
    scheduled_s = int(m.group(2)) * 60
    return m.group(1) if created - CRONJOB_WINDOW_S <= scheduled_s <= created + CLOCK_SKEW_S else ""


def _epoch_s(timestamp: str) -> float | None:
    """RFC 3339 as the API server writes it (`2026-11-20T12:00:00Z`) -> seconds since the epoch."""
    try:
        when = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def split_image(reference: str) -> tuple[str, tuple[str, ...]]:
    """An image reference -> (container.image.name, container.image.tags); ("", ()) for none or a bare id.

    `registry.example:5000/shop/app:1.4@sha256:…` -> ("registry.example:5000/shop/app", ("1.4",));
    `nginx` -> ("nginx", ("latest",)); `nginx@sha256:…` -> ("nginx", ())."""
    ref = reference.strip()
    if not ref or _IMAGE_ID.match(ref):
        return "", ()
    name, has_digest, _ = ref.partition("@")
    tag = ""
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1:]
    if not name:
        return "", ()
    if tag:
        return name, (tag,)
    return name, () if has_digest else ("latest",)


def spec_images(spec: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> image reference, for the pod's containers, init containers and ephemeral containers."""
    images: dict[str, str] = {}
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(key) or ():
            if isinstance(c, Mapping) and _text(c.get("name")) and _text(c.get("image")):
                images[_text(c.get("name"))] = _text(c.get("image"))
    return images


def label(meta: Mapping[str, Any], key: str, field: str = "labels") -> str:
    values = meta.get(field)
    return _text(values.get(key)) if isinstance(values, Mapping) else ""

"""The pods of this node as the API server describes them: uid -> name, namespace, owners, the service its
annotations (and, when opted in, its well-known labels) name, container id -> name and image (pod_fields.py
reads those).

Filled by the pod watch (k8s_watch.py) from list and watch responses (plain JSON, as the API server
sends them), read by the resolver on the capture loop: readers only look up dictionaries that the
writer replaces whole, so they never wait. A deleted pod stays for `keep_deleted_s`: its last sessions
are still in the ring buffer or the export queue when the API server reports it gone.
"""

import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from retsnoop_otel.workload import pod_fields as pf
from retsnoop_otel.workload.cgroup_path import split_k8s_container_id

KEEP_DELETED_S = 300.0
MAX_DELETED = 4096
_STATUS_LISTS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


class ContainerMeta(NamedTuple):
    name: str
    runtime: str
    image_name: str = ""
    image_tags: tuple[str, ...] = ()


class PodMeta(NamedTuple):
    uid: str
    name: str
    namespace: str
    containers: Mapping[str, ContainerMeta] = MappingProxyType({})  # container id -> its name, runtime, image
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) from the controller up (pod_fields.owners)
    annotated_service: str = ""  # resource.opentelemetry.io/service.name
    app_name: str = ""  # app.kubernetes.io/name, read only with well_known_labels
    app_instance: str = ""  # app.kubernetes.io/instance, read only with well_known_labels
    annotated_namespace: str = ""  # resource.opentelemetry.io/service.namespace
    annotated_instance: str = ""  # resource.opentelemetry.io/service.instance.id


def pod_meta(obj: Mapping[str, Any], well_known_labels: bool = False) -> PodMeta | None:
    """A Pod object (JSON) -> what sessions need of it; None without a uid. `well_known_labels`
    (kubernetes.well_known_labels): read the app.kubernetes.io/instance and /name labels too; off, they are left
    "" and the service is named by annotations and owners only (export/service_name.py)."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    status = obj.get("status") or {}
    images = pf.spec_images(obj.get("spec") or {})
    containers: dict[str, ContainerMeta] = {}
    for key in _STATUS_LISTS:
        for cs in status.get(key) or ():
            cid, runtime = split_k8s_container_id(str(cs.get("containerID") or ""))
            if cid:  # not yet started: no id, and so no cgroup either
                name = str(cs.get("name") or "")
                image_name, image_tags = pf.split_image(images.get(name) or str(cs.get("image") or ""))
                containers[cid] = ContainerMeta(name, runtime, image_name, image_tags)

    def annotation(key: str) -> str:
        return pf.label(meta, key, "annotations")

    def label(key: str) -> str:
        return pf.label(meta, key) if well_known_labels else ""

    return PodMeta(uid, str(meta.get("name") or ""), str(meta.get("namespace") or ""), containers, pf.owners(meta),
                   annotation(pf.SERVICE_ANNOTATION), label(pf.APP_NAME_LABEL), label(pf.APP_INSTANCE_LABEL),
                   annotation(pf.NAMESPACE_ANNOTATION), annotation(pf.INSTANCE_ANNOTATION))


class PodCache:
    """Live pods and recently deleted ones; `generation` moves on every change, so that the resolver
    knows when a workload it cached may have gained a name."""

    def __init__(self, monotonic: Callable[[], float], keep_deleted_s: float = KEEP_DELETED_S,
                 max_deleted: int = MAX_DELETED) -> None:
        self._now = monotonic
        self.keep_deleted_s = keep_deleted_s
        self.max_deleted = max_deleted
        self._live: dict[str, PodMeta] = {}
        self._deleted: dict[str, tuple[PodMeta, float]] = {}  # uid -> (pod, when it was deleted)
        self._write = threading.Lock()
        self.generation = 0

    def get(self, uid: str) -> PodMeta | None:
        pod = self._live.get(uid)
        if pod is None:
            gone = self._deleted.get(uid)
            pod = gone[0] if gone is not None else None
        return pod

    def __len__(self) -> int:
        return len(self._live)

    @property
    def deleted(self) -> int:
        return len(self._deleted)

    def replace(self, pods: Iterable[PodMeta]) -> None:
        """A fresh list: pods missing from it were deleted while nobody watched."""
        with self._write:
            live = {p.uid: p for p in pods}
            deleted = dict(self._deleted)
            now = self._now()
            for uid, pod in self._live.items():
                if uid not in live:
                    deleted[uid] = (pod, now)
            for uid in live:
                deleted.pop(uid, None)
            self._live, self._deleted = live, self._bounded(deleted, now)
            self.generation += 1

    def upsert(self, pod: PodMeta) -> None:
        with self._write:
            live = dict(self._live)
            live[pod.uid] = pod
            if pod.uid in self._deleted:
                deleted = dict(self._deleted)
                del deleted[pod.uid]
                self._deleted = deleted
            self._live = live
            self.generation += 1

    def delete(self, pod: PodMeta) -> None:
        with self._write:
            live = dict(self._live)
            live.pop(pod.uid, None)
            deleted = dict(self._deleted)
            deleted[pod.uid] = (pod, self._now())
            self._live, self._deleted = live, self._bounded(deleted, self._now())
            self.generation += 1

    def expire(self) -> None:
        """Forget pods deleted more than keep_deleted_s ago."""
        now = self._now()
        if any(now - t > self.keep_deleted_s for _, t in self._deleted.values()):
            with self._write:
                self._deleted = self._bounded(dict(self._deleted), now)
                self.generation += 1

    def _bounded(self, deleted: dict[str, tuple[PodMeta, float]], now: float) -> dict[str, tuple[PodMeta, float]]:
        kept = {uid: v for uid, v in deleted.items() if now - v[1] <= self.keep_deleted_s}
        while len(kept) > self.max_deleted:
            del kept[min(kept, key=lambda u: kept[u][1])]
        return kept

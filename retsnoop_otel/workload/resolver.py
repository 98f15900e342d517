"""Session -> Workload (container, pod, and the pod's names), and pid -> executable name, all cached.

Asked once per kept session on the capture loop, so a repeat costs dictionary look-ups only:
- cgroup v2: the session's cgroup id -> path (CgroupIndex) -> ContainerRef (the path's own words)
  -> Workload with the pod's names from the watch's cache (PodCache), cached per id and recomputed
  only when the pod cache changed (its generation). An id seen for the first time is learned from the
  process's /proc/PID/cgroup (one read, checked against the directory's inode), else found by a
  rate-limited walk of the hierarchy.
- cgroup v1 hosts (the id is then the unused v2 root's), or an id that stays unknown: the process's
  /proc/PID/cgroup v1 lines, cached per process.
- the executable's name: the basename of /proc/PID/exe, cached per process. A cached process is the
  same one while the record's comm matches; `service()` (poll loop) also re-reads the start time of a
  few cached processes each turn and forgets those that exited, so a reused pid is not given its
  predecessor's name or container.
Nothing here waits for the network: the pod names come from the watch thread's cache.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from retsnoop_otel.capture.model import NO_WORKLOAD, Workload
from retsnoop_otel.kernel.cgroups import read_proc_cgroup, v2_path
from retsnoop_otel.workload.cgroup_path import ContainerRef, parse_cgroup_path
from retsnoop_otel.workload.cgroupfs import CgroupIndex, cgroup2_mount, has_cgroup_v1
from retsnoop_otel.workload.k8s_settings import KubeSettings
from retsnoop_otel.workload.procfs import container_of, exe_name, start_time

if TYPE_CHECKING:  # the pod cache only with the pod watch (build_resolver): its fields import datetime
    from retsnoop_otel.workload.pods import PodCache, PodMeta

MAX_CGROUPS = 16384  # cached workloads per cgroup id
MAX_PROCESSES = 8192
SWEEP_EVERY_S = 2.0
SWEEP_BATCH = 64  # processes re-checked per sweep


class _Proc:
    __slots__ = ("comm", "started", "exe", "ref", "workload")

    def __init__(self, comm: str, started: int | None, exe: str | None = None, ref: ContainerRef | None = None,
                 workload: tuple[int, Workload] | None = None) -> None:
        self.comm = comm
        self.started = started  # /proc/PID/stat start time; None: could not be read
        self.exe = exe  # read when first asked (the kernel usually names it); "": could not be followed
        self.ref = ref  # from /proc/PID/cgroup (v1 fallback), read when first needed
        self.workload = workload  # (pod cache generation, workload)


class WorkloadResolver:
    def __init__(self, root: str = "/", monotonic: Callable[[], float] = time.monotonic,
                 pods: PodCache | None = None, watch: Any = None, rescan_min_s: float = 1.0) -> None:
        self.proc_root = os.path.join(root, "proc")
        self.index = CgroupIndex(os.path.join(root, cgroup2_mount(root).lstrip("/")), monotonic, rescan_min_s)
        self.v1 = has_cgroup_v1(root)
        self.pods = pods
        self.watch = watch  # k8s_watch.PodWatch, stopped by close()
        self._now = monotonic
        self._by_cgroup: dict[int, tuple[int, Workload]] = {}
        self._procs: dict[int, _Proc] = {}
        self._lock = threading.Lock()  # misses only: the capture loop and the scrape thread may both ask
        self._next_sweep = 0.0
        self._sweep_from = 0

    # ---- the contract ---------------------------------------------------------------------------------

    def of_cgroup(self, cgroup_id: int) -> Workload:
        """cgroup v2 id -> workload, cached; an unknown id costs at most a rate-limited walk of cgroupfs."""
        return self._of_cgroup(cgroup_id, 0)

    def of_session(self, pid: int, cgroup_id: int, comm: str = "") -> Workload:
        """The workload of a session: by cgroup v2 id, else (cgroup v1) by the process's own cgroups."""
        workload = self._of_cgroup(cgroup_id, pid)
        if workload or not self.v1 or not pid:
            return workload
        proc = self._proc(pid, comm)
        gen = self._generation()
        if proc.workload is None or proc.workload[0] != gen:
            if proc.ref is None:
                lines = read_proc_cgroup(self.proc_root, pid)
                proc.ref = container_of(lines) if lines else ContainerRef()
            proc.workload = (gen, self._workload(proc.ref))
        return proc.workload[1]

    def knows_cgroup(self, cgroup_id: int) -> bool:
        """Whether the cgroup v2 id has a path (learned, or found by a rate-limited walk of cgroupfs)."""
        return bool(cgroup_id) and self.index.lookup(cgroup_id) is not None

    def cgroup_alive(self, cgroup_id: int) -> bool:
        """Whether the cgroup still exists; True while its path is not known (it may be a new one)."""
        path = self.index.get(cgroup_id)
        if path is None:
            return True
        try:
            return os.stat(self.index.mount_dir + (path if path != "/" else "")).st_ino == cgroup_id
        except OSError:
            return False

    def exe_name(self, pid: int, comm: str = "") -> str:
        """Basename of /proc/PID/exe; "" for kernel threads, exited processes and those not readable."""
        if not pid:
            return ""
        proc = self._proc(pid, comm)
        if proc.exe is None:
            proc.exe = exe_name(self.proc_root, pid) or ""
        return proc.exe

    # ---- cgroup v2 --------------------------------------------------------------------------------------

    def _generation(self) -> int:
        return self.pods.generation if self.pods is not None else 0

    def _of_cgroup(self, cgroup_id: int, pid: int) -> Workload:
        gen = self._generation()
        hit = self._by_cgroup.get(cgroup_id)
        if hit is not None and hit[0] == gen:
            return hit[1]
        if not cgroup_id:
            return NO_WORKLOAD
        with self._lock:
            path = self.index.get(cgroup_id)
            if path is None and pid:
                path = self._learn(pid, cgroup_id)
            if path is None:
                path = self.index.lookup(cgroup_id)
            if path is None:
                return NO_WORKLOAD  # not cached: found by a later walk, or by the next session's process
            workload = self._workload(parse_cgroup_path(path))
            if len(self._by_cgroup) >= MAX_CGROUPS:
                del self._by_cgroup[next(iter(self._by_cgroup))]
            self._by_cgroup[cgroup_id] = (gen, workload)
            return workload

    def _learn(self, pid: int, cgroup_id: int) -> str | None:
        lines = read_proc_cgroup(self.proc_root, pid)
        path = v2_path(lines) if lines else None
        if path is None or self.index.learn(path, cgroup_id) is None:
            return None
        return self.index.get(cgroup_id)

    def _workload(self, ref: ContainerRef) -> Workload:
        if not ref:
            return NO_WORKLOAD
        return pod_workload(ref, self.pods.get(ref.pod_uid) if self.pods is not None and ref.pod_uid else None)

    # ---- processes ----------------------------------------------------------------------------------------

    def _proc(self, pid: int, comm: str) -> _Proc:
        proc = self._procs.get(pid)
        if proc is not None and (not comm or proc.comm == comm):
            return proc
        with self._lock:
            proc = _Proc(comm, start_time(self.proc_root, pid))
            if pid not in self._procs and len(self._procs) >= MAX_PROCESSES:
                del self._procs[next(iter(self._procs))]
            self._procs[pid] = proc
            return proc

    def service(self) -> None:
        """From the poll loop: forget a few cached processes that exited or whose pid now names another."""
        now = self._now()
        if now < self._next_sweep or not self._procs:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        pids = list(self._procs)
        start = self._sweep_from % len(pids)
        batch = pids[start:start + SWEEP_BATCH]
        self._sweep_from = start + len(batch)
        for pid in batch:
            proc = self._procs.get(pid)
            started = start_time(self.proc_root, pid)
            if proc is not None and (started is None or started != proc.started):
                with self._lock:
                    if self._procs.get(pid) is proc:
                        del self._procs[pid]

    def counters(self) -> Any:
        """The pod watch's k8s_watch.WatchCounters, or None when the watch is off."""
        return self.watch.counters() if self.watch is not None else None

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()


def pod_workload(ref: ContainerRef, pod: PodMeta | None) -> Workload:
    """What a cgroup path says, completed by its pod as the watch knows it (None: not known)."""
    if pod is None:
        return Workload(ref.container_id, ref.runtime, ref.pod_uid)
    said = dict(annotated_service=pod.annotated_service, app_name=pod.app_name, owners=pod.owners,
                app_instance=pod.app_instance, annotated_namespace=pod.annotated_namespace,
                annotated_instance=pod.annotated_instance)
    c = pod.containers.get(ref.container_id) if ref.container_id else None
    if c is None:  # not started when the watch last heard, or a pod-level cgroup (conmon): the pod's own
        return Workload(ref.container_id, ref.runtime, ref.pod_uid, pod.name, pod.namespace, **said)
    return Workload(ref.container_id, ref.runtime or c.runtime, ref.pod_uid, pod.name, pod.namespace, c.name,
                    image_name=c.image_name, image_tags=c.image_tags, **said)


def build_resolver(root: str, monotonic: Callable[[], float], kube: KubeSettings | None, log: Any) -> WorkloadResolver:
    """The resolver, with the pod watch started when the settings turn it on."""
    if kube is None:
        return WorkloadResolver(root, monotonic)
    from retsnoop_otel.workload.k8s_watch import PodWatch
    from retsnoop_otel.workload.pods import PodCache
    pods = PodCache(monotonic, kube.keep_deleted_s)
    return WorkloadResolver(root, monotonic, pods, PodWatch(kube, pods, log, monotonic).start())

"""A cgroup path -> the container it is (id and runtime) and the Kubernetes pod it belongs to.

The layouts, as the runtimes and the kubelet name their cgroups (same paths on cgroup v1 and v2):

  kubelet, systemd driver   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
                            cri-containerd-<id>.scope | crio-<id>.scope | docker-<id>.scope
                            (Guaranteed pods sit directly in kubepods.slice: kubepods-pod<uid>.slice)
  kubelet, cgroupfs driver  /kubepods/burstable/pod<uid>/<id>   (CRI-O: .../crio-<id>; Guaranteed: /kubepods/pod<uid>/)
  Docker                    /system.slice/docker-<id>.scope (systemd driver), /docker/<id> (cgroupfs)
  Podman                    /machine.slice/libpod-<id>.scope (rootful), /user.slice/user-1000.slice/
                            user@1000.service/user.slice/libpod-<id>.scope (rootless), /libpod_parent/libpod-<id>
                            (cgroupfs), and .../libpod-<id>.scope/container when the container runs its own init
  nerdctl (containerd)      /system.slice/nerdctl-<id>.scope, /<namespace>/<id> (cgroupfs)

`crio-conmon-<id>.scope` and `libpod-conmon-<id>.scope` hold the runtime's monitor process, not the
container: they give no container id (a conmon scope inside a pod slice still gives the pod). Paths read
from another cgroup namespace start with `/..` components; only the components that match count, so the
innermost container component wins and a kubelet `--cgroup-root` prefix does not matter.
"""

import re
from functools import lru_cache
from typing import NamedTuple

_ID = r"([0-9a-f]{64})"
# component -> runtime; the conmon scopes ("crio-conmon-<id>", "libpod-conmon-<id>") do not match: "conmon-" is no id
_CONTAINER = [(re.compile(rf"^cri-containerd-{_ID}\.scope$"), "containerd"),
              (re.compile(rf"^crio-{_ID}(?:\.scope)?$"), "cri-o"),
              (re.compile(rf"^docker-{_ID}\.scope$"), "docker"),
              (re.compile(rf"^libpod-{_ID}(?:\.scope)?$"), "podman"),
              (re.compile(rf"^nerdctl-{_ID}\.scope$"), "containerd")]
_BARE_ID = re.compile(rf"^{_ID}$")
_UID = r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"  # static pods: 32 hex
_POD_SYSTEMD = re.compile(rf"^(?:[a-z0-9_]+-)?kubepods(?:-besteffort|-burstable|-guaranteed)?-pod{_UID}\.slice$")
_POD_CGROUPFS = re.compile(rf"^pod{_UID}$")
RUNTIME_OF_K8S_PREFIX = {"containerd": "containerd", "cri-o": "cri-o", "docker": "docker"}  # containerID scheme


class ContainerRef(NamedTuple):
    """What a cgroup path says by itself; "" = not in the path."""

    container_id: str = ""
    runtime: str = ""
    pod_uid: str = ""

    def __bool__(self) -> bool:
        return bool(self.container_id or self.pod_uid)


NONE = ContainerRef()


def _container(parts: list[str]) -> tuple[int, str, str]:
    """(index, id, runtime) of the innermost container component; index -1 when there is none."""
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        for pattern, runtime in _CONTAINER:
            m = pattern.match(part)
            if m:
                return i, m.group(1), runtime
        m = _BARE_ID.match(part)
        if m and i > 0:  # cgroupfs drivers: a bare id under its parent (kubepods pod, docker, a containerd namespace)
            return i, m.group(1), "docker" if parts[i - 1] == "docker" else ""
    return -1, "", ""


def _pod_uid(parts: list[str]) -> str:
    under_kubepods = False
    for part in parts:
        m = _POD_SYSTEMD.match(part)
        if m is None and under_kubepods:
            m = _POD_CGROUPFS.match(part)
        if m:
            return m.group(1).replace("_", "-")
        under_kubepods = under_kubepods or part == "kubepods"
    return ""


@lru_cache(maxsize=4096)
def parse_cgroup_path(path: str) -> ContainerRef:
    """The container and pod named by a cgroup path (as in /proc/PID/cgroup or below a cgroupfs mount)."""
    parts = [p for p in path.split("/") if p and p != ".."]
    index, container_id, runtime = _container(parts)
    pod_uid = _pod_uid(parts[:index] if index >= 0 else parts)
    if not container_id and not pod_uid:
        return NONE
    return ContainerRef(container_id, runtime, pod_uid)


def split_k8s_container_id(text: str) -> tuple[str, str]:
    """status.containerStatuses[].containerID ('containerd://<id>') -> (id, runtime); ("", "") if not set yet."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return "", ""
    return rest.strip().lower(), RUNTIME_OF_K8S_PREFIX.get(scheme, scheme)

"""Cgroup paths of every supported layout -> container id, runtime and pod uid; /proc/PID/cgroup v1 and v2.

The paths are written the way the runtimes and the kubelet name their cgroups (see the docstring of
retsnoop_otel/workload/cgroup_path.py), with ids of the real formats: 64 hex digits for containers,
RFC 4122 uids for pods (underscores in systemd slice names), 32 hex digits for static pods.
"""

from __future__ import annotations

import pytest

from retsnoop_otel.kernel.cgroups import parse_proc_cgroup, v2_path
from retsnoop_otel.workload.cgroup_path import ContainerRef, parse_cgroup_path, split_k8s_container_id
from retsnoop_otel.workload.procfs import container_of

CID = "3a8f1c4b2d9e7f6051a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8"
CID2 = "e4b0f6b9d3c1a2f8e7d6c5b4a3928170f6e5d4c3b2a19080f7e6d5c4b3a29180"
UID = "6f1b6c5e-2a4d-4a8e-9c3b-0f2e1d4c5b6a"
UID_ = UID.replace("-", "_")
STATIC_UID = "4c9fe1b35f3f5cd28e6b59b1a4d3e8f0"

LAYOUTS = [
    # kubelet, systemd driver
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     ContainerRef(CID, "containerd", UID)),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
     ContainerRef(CID, "cri-o", UID)),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",  # Guaranteed: no QoS level
     ContainerRef(CID, "containerd", UID)),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope",
     ContainerRef(CID, "docker", UID)),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/crio-{CID}.scope",
     ContainerRef(CID, "cri-o", STATIC_UID)),
    # the monitor process of CRI-O: in the pod, but not the container
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope",
     ContainerRef("", "", UID)),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",  # the pod's own cgroup
     ContainerRef("", "", UID)),
    # kubelet, cgroupfs driver
    (f"/kubepods/burstable/pod{UID}/{CID}", ContainerRef(CID, "", UID)),
    (f"/kubepods/besteffort/pod{UID}/{CID}", ContainerRef(CID, "", UID)),
    (f"/kubepods/pod{UID}/{CID}", ContainerRef(CID, "", UID)),  # Guaranteed
    (f"/kubepods/burstable/pod{UID}/crio-{CID}", ContainerRef(CID, "cri-o", UID)),
    (f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}", ContainerRef("", "", UID)),
    # a kubelet --cgroup-root (kind nodes) and a path read from another cgroup namespace
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", ContainerRef(CID, "containerd", UID)),
    (f"/../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     ContainerRef(CID, "containerd", UID)),
    (f"/kubelet/kubepods/burstable/pod{UID}/{CID}", ContainerRef(CID, "", UID)),
    # Docker
    (f"/system.slice/docker-{CID}.scope", ContainerRef(CID, "docker", "")),
    (f"/docker/{CID}", ContainerRef(CID, "docker", "")),
    # Podman
    (f"/machine.slice/libpod-{CID}.scope", ContainerRef(CID, "podman", "")),
    (f"/machine.slice/libpod-{CID}.scope/container", ContainerRef(CID, "podman", "")),
    (f"/machine.slice/libpod-conmon-{CID}.scope", ContainerRef()),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope", ContainerRef(CID, "podman", "")),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-conmon-{CID}.scope", ContainerRef()),
    (f"/libpod_parent/libpod-{CID}", ContainerRef(CID, "podman", "")),
    (f"/machine.slice/machine-libpod_pod_{CID2}.slice/libpod-{CID}.scope", ContainerRef(CID, "podman", "")),
    # nerdctl (containerd without Kubernetes)
    (f"/system.slice/nerdctl-{CID}.scope", ContainerRef(CID, "containerd", "")),
    (f"/default/{CID}", ContainerRef(CID, "", "")),
    # not containers
    ("/", ContainerRef()),
    ("/system.slice/sshd.service", ContainerRef()),
    ("/user.slice/user-1000.slice/session-3.scope", ContainerRef()),
    (f"/{CID}", ContainerRef()),  # a bare id with no parent names nothing we know
    (f"/system.slice/docker-{CID[:12]}.scope", ContainerRef()),  # short ids are not container ids
    (f"/pod{UID}/{CID}", ContainerRef(CID, "", "")),  # pod<uid> counts only below kubepods
]


@pytest.mark.parametrize("path,want", LAYOUTS, ids=[p for p, _ in LAYOUTS])
def test_layouts(path: str, want: ContainerRef) -> None:
    assert parse_cgroup_path(path) == want


def test_innermost_container_wins() -> None:
    """Docker in a Podman container: the threads are in the inner container."""
    path = f"/machine.slice/libpod-{CID2}.scope/container/docker/{CID}"
    assert parse_cgroup_path(path) == ContainerRef(CID, "docker", "")


@pytest.mark.parametrize("text,want", [
    (f"containerd://{CID}", (CID, "containerd")),
    (f"cri-o://{CID}", (CID, "cri-o")),
    (f"docker://{CID}", (CID, "docker")),
    ("", ("", "")),
])
def test_kubernetes_container_ids(text: str, want: tuple[str, str]) -> None:
    assert split_k8s_container_id(text) == want


V2 = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
V1 = f"""12:pids:/kubepods/burstable/pod{UID}/{CID}
11:hugetlb:/kubepods/burstable/pod{UID}/{CID}
10:net_cls,net_prio:/kubepods/burstable/pod{UID}/{CID}
9:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
8:memory:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""
V1_DOCKER_SYSTEMD = f"""11:devices:/system.slice/docker-{CID}.scope
4:memory:/system.slice/docker-{CID}.scope
1:name=systemd:/system.slice/docker-{CID}.scope
"""
HYBRID = f"""5:memory:/user.slice
1:name=systemd:/system.slice/docker-{CID}.scope
0::/system.slice/docker-{CID}.scope
"""


def test_proc_cgroup_v2() -> None:
    lines = parse_proc_cgroup(V2)
    assert len(lines) == 1 and lines[0].v2 and lines[0].controllers == ()
    assert v2_path(lines) == V2[3:].strip()
    assert container_of(lines) == ContainerRef(CID, "containerd", UID)


def test_proc_cgroup_v1_controllers_and_named_hierarchy() -> None:
    lines = parse_proc_cgroup(V1)
    assert [(x.hierarchy, x.controllers) for x in lines[:3]] == [(12, ("pids",)), (11, ("hugetlb",)),
                                                                 (10, ("net_cls", "net_prio"))]
    assert lines[5].controllers == ("name=systemd",)
    assert v2_path(lines) == "/"  # the unused v2 root of a v1 host: names nothing, the v1 lines decide
    assert container_of(lines) == ContainerRef(CID, "", UID)
    assert container_of(parse_proc_cgroup(V1_DOCKER_SYSTEMD)) == ContainerRef(CID, "docker", "")
    assert container_of(parse_proc_cgroup(HYBRID)) == ContainerRef(CID, "docker", "")


def test_proc_cgroup_oddities() -> None:
    text = "garbage\n\n4:memory:/a:b\nx:cpu:/c\n0::/\n"
    lines = parse_proc_cgroup(text)
    assert [(x.hierarchy, x.path) for x in lines] == [(4, "/a:b"), (0, "/")]
    assert container_of(parse_proc_cgroup("")) == ContainerRef()

"""The resolver over fixture trees: a cgroupfs tree (real directories, their inode numbers as cgroup ids, as
cgroup v2 numbers them), /proc/PID/{cgroup,exe,stat}, mountinfo of a v2 and of a hybrid v1 host, and the pod
cache's names. Also the cgroup2 mount found from mountinfo (the same function --cgroup uses).
"""

from __future__ import annotations

import os
from pathlib import Path

from retsnoop_otel.capture.model import NO_WORKLOAD, Workload
from retsnoop_otel.workload.cgroupfs import cgroup2_mount, has_cgroup_v1
from retsnoop_otel.workload.pods import ContainerMeta, PodCache, PodMeta
from retsnoop_otel.workload.resolver import WorkloadResolver
from tests.fakes import APP, CID, CID2, POD, PODMAN, UID, Clock, cgroup_id, fake_host, fake_process

HYBRID_MOUNTINFO = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_cgroup2_mount_from_mountinfo(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text(HYBRID_MOUNTINFO)
    assert cgroup2_mount(str(tmp_path)) == "/sys/fs/cgroup/unified" and has_cgroup_v1(str(tmp_path))
    # a private cgroup namespace's own subtree, and the host's whole hierarchy bind-mounted: the whole one
    (tmp_path / "proc/self/mountinfo").write_text(
        "50 40 0:26 /../../kubepods.slice /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
        "51 40 0:26 / /host/sys\\040fs/cgroup ro - cgroup2 cgroup2 rw\n")
    assert cgroup2_mount(str(tmp_path)) == "/host/sys fs/cgroup" and not has_cgroup_v1(str(tmp_path))
    (tmp_path / "proc/self/mountinfo").unlink()
    assert cgroup2_mount(str(tmp_path)) == "/sys/fs/cgroup"  # nothing to read: the usual place


def test_cgroup_id_resolved_by_a_walk_then_cached(tmp_path: Path) -> None:
    root, clock = fake_host(tmp_path), Clock()
    r = WorkloadResolver(str(root), clock)
    want = Workload(CID, "containerd", UID)
    assert r.of_cgroup(cgroup_id(root, APP)) == want and r.index.scans == 1
    assert r.of_cgroup(cgroup_id(root, PODMAN)) == Workload(CID2, "podman")  # found by the same walk
    assert r.of_cgroup(cgroup_id(root, "system.slice/sshd.service")) == NO_WORKLOAD
    assert r.of_cgroup(cgroup_id(root, APP)) is r.of_cgroup(cgroup_id(root, APP)) and r.index.scans == 1


def test_unknown_ids_walk_at_most_once_per_interval(tmp_path: Path) -> None:
    root, clock = fake_host(tmp_path), Clock()
    r = WorkloadResolver(str(root), clock, rescan_min_s=1.0)
    for bogus in range(10**9, 10**9 + 50):  # a flood of ids nobody knows
        assert r.of_cgroup(bogus) == NO_WORKLOAD
    assert r.index.scans == 1
    late = f"{POD}/cri-containerd-{CID2}.scope"  # a container created after that walk
    (root / "sys/fs/cgroup" / late).mkdir()
    assert r.of_cgroup(cgroup_id(root, late)) == NO_WORKLOAD and r.index.scans == 1  # not before the interval
    clock.t += 1.0
    assert r.of_cgroup(cgroup_id(root, late)) == Workload(CID2, "containerd", UID) and r.index.scans == 2


def test_a_removed_cgroup_stays_resolvable(tmp_path: Path) -> None:
    root, clock = fake_host(tmp_path), Clock()
    r = WorkloadResolver(str(root), clock)
    ident = cgroup_id(root, APP)
    assert r.of_cgroup(ident).container_id == CID
    (root / "sys/fs/cgroup" / APP).rmdir()  # the container exited; its last sessions are still arriving
    clock.t += 10
    assert WorkloadResolver(str(root), clock).of_cgroup(ident) == NO_WORKLOAD  # a new walk cannot find it
    assert r.of_cgroup(ident) == Workload(CID, "containerd", UID)


def test_session_learns_its_cgroup_from_proc_without_a_walk(tmp_path: Path) -> None:
    root, clock = fake_host(tmp_path), Clock()
    fake_process(root, 4321, f"0::/{APP}\n", "/usr/local/bin/checkout-server")
    r = WorkloadResolver(str(root), clock)
    assert r.of_session(4321, cgroup_id(root, APP), "checkout-server") == Workload(CID, "containerd", UID)
    assert r.index.scans == 0 and r.index.get(cgroup_id(root, APP)) == "/" + APP
    # a process that moved since: its /proc path no longer has that id, so the id is found by a walk
    fake_process(root, 4322, "0::/system.slice/sshd.service\n", "/usr/sbin/sshd")
    assert r.of_session(4322, cgroup_id(root, PODMAN), "sshd") == Workload(CID2, "podman") and r.index.scans == 1


def test_pod_names_arrive_later_and_replace_the_cached_workload(tmp_path: Path) -> None:
    root, clock = fake_host(tmp_path), Clock()
    pods = PodCache(clock)
    r = WorkloadResolver(str(root), clock, pods)
    ident = cgroup_id(root, APP)
    assert r.of_cgroup(ident) == Workload(CID, "containerd", UID)  # the watch has not listed yet
    owners = (("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout"))
    pods.upsert(PodMeta(UID, "checkout-7d4b9c8f6-x2x9k", "shop",
                        {CID: ContainerMeta("app", "containerd", "registry.example/shop/checkout", ("1.4.2",))},
                        owners, "", "shop-checkout"))
    assert r.of_cgroup(ident) == Workload(CID, "containerd", UID, "checkout-7d4b9c8f6-x2x9k", "shop", "app",
                                          "", "shop-checkout", owners, "registry.example/shop/checkout", ("1.4.2",))
    pods.delete(pods.get(UID))  # deleted, kept a while: the names stay
    assert r.of_cgroup(ident).pod_name == "checkout-7d4b9c8f6-x2x9k"


def test_a_pod_level_cgroup_has_the_pods_owners_and_service_but_no_container_image(tmp_path: Path) -> None:
    """The runtime's monitor (crio-conmon-<id>.scope) is in the pod, not in a container: what the pod says of itself
    (owners, annotation, label) applies; a container's name and image do not."""
    root, clock = fake_host(tmp_path), Clock()
    conmon = f"{POD}/crio-conmon-{CID}.scope"
    (root / "sys/fs/cgroup" / conmon).mkdir(parents=True)
    pods = PodCache(clock)
    owners = (("statefulset", "db"),)
    pods.upsert(PodMeta(UID, "db-0", "shop", {CID: ContainerMeta("db", "cri-o", "postgres", ("16",))}, owners,
                        "orders-db", ""))
    assert WorkloadResolver(str(root), clock, pods).of_cgroup(cgroup_id(root, conmon)) == \
        Workload("", "", UID, "db-0", "shop", "", "orders-db", "", owners)


def test_runtime_from_the_api_when_the_path_has_none(tmp_path: Path) -> None:
    """cgroupfs driver: /kubepods/burstable/pod<uid>/<id> names no runtime; containerStatuses' scheme does."""
    root, clock = fake_host(tmp_path), Clock()
    rel = f"kubepods/burstable/pod{UID}/{CID}"
    (root / "sys/fs/cgroup" / rel).mkdir(parents=True)
    pods = PodCache(clock)
    pods.upsert(PodMeta(UID, "web-0", "shop", {CID: ContainerMeta("web", "cri-o")}))
    assert WorkloadResolver(str(root), clock, pods).of_cgroup(cgroup_id(root, rel)) == \
        Workload(CID, "cri-o", UID, "web-0", "shop", "web")


def test_cgroup_v1_host_falls_back_to_the_process_cgroups(tmp_path: Path) -> None:
    """On a hybrid host the kernel's id is the unified hierarchy's (here: its root, no container); the process's
    v1 lines (name=systemd, memory) name the container."""
    mount = "sys/fs/cgroup/unified"
    root, clock = fake_host(tmp_path, HYBRID_MOUNTINFO, mount), Clock()
    fake_process(root, 77, f"4:memory:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/"
                      f"pod{UID}/{CID}\n0::/\n", "/bin/app")
    fake_process(root, 78, f"4:memory:/docker/{CID2}\n1:name=systemd:/docker/{CID2}\n0::/\n", "/bin/other")
    r = WorkloadResolver(str(root), clock)
    assert r.v1
    unified_root = os.stat(root / mount).st_ino
    assert r.of_session(77, unified_root, "app") == Workload(CID, "", UID)
    assert r.of_session(78, unified_root, "other") == Workload(CID2, "docker")  # per process, not per id
    assert r.of_cgroup(unified_root) == NO_WORKLOAD


def test_exe_names_and_reused_pids(tmp_path: Path) -> None:
    root, clock = fake_host(tmp_path), Clock()
    fake_process(root, 10, "0::/\n", "/usr/lib/jvm/java-21-openjdk-amd64/bin/java", start=100, comm="java")
    fake_process(root, 11, "0::/\n", "/opt/app/bin/server (deleted)", start=100, comm="server")
    fake_process(root, 12, "0::/\n", None, comm="kworker/0:1")  # kernel threads have no exe
    r = WorkloadResolver(str(root), clock)
    assert r.exe_name(10, "java") == "java" and r.exe_name(11, "server") == "server" and r.exe_name(12, "kw") == ""
    assert r.exe_name(999, "gone") == ""
    # the comm changed (exec or a new process with the old pid): read again
    fake_process(root, 10, "0::/\n", "/usr/bin/python3.11", start=100, comm="python3")
    assert r.exe_name(10, "java") == "java"  # same comm: the cached process
    assert r.exe_name(10, "python3") == "python3.11"
    # a new process with the same pid and the same comm: the sweep sees the new start time
    fake_process(root, 11, "0::/\n", "/opt/other/bin/server", start=200, comm="server")
    assert r.exe_name(11, "server") == "server"
    fake_process(root, 11, "0::/\n", "/opt/other/bin/server2", start=200, comm="server")
    clock.t += 10
    r.service()
    assert r.exe_name(11, "server") == "server2"

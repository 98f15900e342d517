"""kernel/cgroups.py: the CPUs a process may keep busy, read from a fixture tree of /proc and cgroupfs."""

from __future__ import annotations

import os
from pathlib import Path

from retsnoop_otel.kernel.cgroups import cpu_quota, usable_cpus


def _cgroups(tmp_path: Path, member: str, limits: dict[str, str]) -> str:
    """A root whose /proc/self/cgroup names `member` and whose cgroupfs holds cpu.max files at `limits`' paths."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(f"1:name=systemd:/old\n0::{member}\n")
    for path, value in limits.items():
        (tmp_path / "sys/fs/cgroup" / path).mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys/fs/cgroup" / path / "cpu.max").write_text(value + "\n")
    return str(tmp_path)


def test_usable_cpus_are_the_affinity_capped_by_every_cgroup_quota_up_the_path(tmp_path: Path) -> None:
    unit = _cgroups(tmp_path / "unit", "/system.slice/agent.service",
                    {"system.slice/agent.service": "max 100000", "system.slice": "150000 100000"})
    assert usable_cpus(unit, affinity=4) == 1.5  # the slice's quota, though the unit has none of its own
    assert usable_cpus(unit, affinity=1) == 1.0  # pinned below the quota
    pod = _cgroups(tmp_path / "pod", "/", {"": "50000 100000"})  # a private cgroup namespace: its own root
    assert usable_cpus(pod, affinity=8) == 0.5
    free = _cgroups(tmp_path / "free", "/user.slice", {"user.slice": "max 100000"})
    assert usable_cpus(free, affinity=2) == 2.0
    odd = _cgroups(tmp_path / "odd", "/a", {"a": "lots 0"})  # unreadable values count as no limit
    assert usable_cpus(odd, affinity=3) == 3.0
    assert usable_cpus(str(tmp_path / "nowhere"), affinity=2) == 2.0  # no /proc: the affinity alone
    assert usable_cpus() == min(len(os.sched_getaffinity(0)), usable_cpus(affinity=10_000))


def test_cpu_quota_is_none_where_no_cgroup_sets_one(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, "/a/b", {"a/b": "max 100000", "a": "max 100000"})
    assert cpu_quota(os.path.join(root, "sys/fs/cgroup"), "/a/b") is None
    assert cpu_quota(os.path.join(root, "sys/fs/cgroup"), "/../a/b") is None  # no climbing out of the mount
    assert cpu_quota(os.path.join(root, "sys/fs/cgroup"), "/") is None

"""What the kernel says of a process's cgroups: the lines of /proc/PID/cgroup, and the CPUs its affinity and the
cgroup v2 CPU quotas over it leave it.

Two rooms read them: the workload resolver (which container a traced process runs in) and the start (how many
threads are worth starting: symbols/read_ahead.py, kernel/clones.py). Every reader takes its root (`/`, `/proc`, or a
fixture tree in tests).
"""

import os
from typing import NamedTuple


class CgroupLine(NamedTuple):
    """One line of /proc/PID/cgroup: `0::/path` (v2) or `4:memory:/path`, `1:name=systemd:/path` (v1)."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str

    @property
    def v2(self) -> bool:
        return self.hierarchy == 0 and not self.controllers


def parse_proc_cgroup(text: str) -> list[CgroupLine]:
    """Lines that do not have the three fields are skipped; a path may itself hold ':'."""
    out = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].isdigit():
            continue
        controllers = tuple(c for c in fields[1].split(",") if c)
        out.append(CgroupLine(int(fields[0]), controllers, fields[2]))
    return out


def read_proc_cgroup(proc_root: str, pid: int | str) -> list[CgroupLine] | None:
    """The lines of PROC_ROOT/PID/cgroup (`pid` may be "self"); None for a process that is gone or unreadable."""
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            return parse_proc_cgroup(f.read())
    except OSError:
        return None


def v2_path(lines: list[CgroupLine]) -> str | None:
    return next((line.path for line in lines if line.v2), None)


def cpu_quota(cgroupfs: str, path: str) -> float | None:
    """The smallest cgroup v2 CPU quota (cpu.max, in CPUs) of the cgroup at `path` and of each ancestor, as a
    container's CPU limit or a systemd unit's CPUQuota= sets them (a unit without one may sit in a slice that has
    one); None where none is set or readable."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    quotas = []
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(cgroupfs, *parts[:depth], "cpu.max")) as f:
                limit, _, period = f.read().partition(" ")
            if limit != "max" and int(period) > 0:
                quotas.append(int(limit) / int(period))
        except (OSError, ValueError):
            continue
    return min(quotas, default=None)


def usable_cpus(root: str = "/", affinity: int | None = None) -> float:
    """How many CPUs this process may keep busy at once: its CPU affinity (`affinity`, else the kernel's: a cpuset or
    taskset leaves fewer than the machine has), capped by the cgroup v2 quotas over its cgroup. cgroup v1 quotas are
    not read (counted as no limit)."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except OSError:
            affinity = os.cpu_count() or 1
    lines = read_proc_cgroup(os.path.join(root, "proc"), "self")
    path = v2_path(lines) if lines else None
    quota = cpu_quota(os.path.join(root, "sys/fs/cgroup"), path) if path is not None else None
    return float(affinity) if quota is None else min(float(affinity), quota)

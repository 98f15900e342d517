"""What /proc says of a process: its cgroups (v1 and v2 lines), its executable's name and its start time.

Every reader takes the proc root (`/proc`, or a fixture tree in tests). A process that is gone, or one
whose /proc/PID/exe the reader may not follow (another user's, or one holding capabilities we lack
without CAP_SYS_PTRACE), gives None rather than an exception: the caller falls back to what the kernel
record carries.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from retsnoop_otel.workload.cgroup_path import NONE, ContainerRef, parse_cgroup_path


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


def v2_path(lines: list[CgroupLine]) -> str | None:
    return next((line.path for line in lines if line.v2), None)


def container_of(lines: list[CgroupLine]) -> ContainerRef:
    """The cgroup v2 line first; then the v1 hierarchies (name=systemd and the controllers name the same
    container, so the first one that names one decides)."""
    ordered = sorted(lines, key=lambda line: not line.v2)
    for line in ordered:
        ref = parse_cgroup_path(line.path)
        if ref.container_id:
            return ref
    return next((ref for ref in map(parse_cgroup_path, (line.path for line in ordered)) if ref), NONE)


def read_proc_cgroup(proc_root: str, pid: int) -> list[CgroupLine] | None:
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            return parse_proc_cgroup(f.read())
    except OSError:
        return None


def exe_name(proc_root: str, pid: int) -> str | None:
    """The basename of /proc/PID/exe; None for kernel threads, exited and unreadable processes."""
    try:
        target = os.readlink(f"{proc_root}/{pid}/exe")
    except OSError:
        return None
    target = target.removesuffix(" (deleted)")  # the binary was replaced or removed since the exec
    return os.path.basename(target) or None


def start_time(proc_root: str, pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): with the pid, it names one process for good."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rpartition(b")")[2].split()  # comm may hold spaces and parentheses
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None

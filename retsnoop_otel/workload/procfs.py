"""What /proc says of a process: the container its cgroup lines name (kernel/cgroups.py reads them), its executable's
name and its start time.

Every reader takes the proc root (`/proc`, or a fixture tree in tests). A process that is gone, or one
whose /proc/PID/exe the reader may not follow (another user's, or one holding capabilities we lack
without CAP_SYS_PTRACE), gives None rather than an exception: the caller falls back to what the kernel
record carries.
"""

from __future__ import annotations

import os

from retsnoop_otel.kernel.cgroups import CgroupLine
from retsnoop_otel.workload.cgroup_path import NONE, ContainerRef, parse_cgroup_path


def container_of(lines: list[CgroupLine]) -> ContainerRef:
    """The cgroup v2 line first; then the v1 hierarchies (name=systemd and the controllers name the same
    container, so the first one that names one decides)."""
    ordered = sorted(lines, key=lambda line: not line.v2)
    for line in ordered:
        ref = parse_cgroup_path(line.path)
        if ref.container_id:
            return ref
    return next((ref for ref in map(parse_cgroup_path, (line.path for line in ordered)) if ref), NONE)


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

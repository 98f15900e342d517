"""The cgroup v2 hierarchy as the kernel numbers it: where it is mounted, and cgroup id -> path.

On cgroup v2, `bpf_get_current_cgroup_id()` (the session record's cgroup_id) is the inode number of
the cgroup's directory in cgroupfs. The index learns ids from paths it is shown (a process's
/proc/PID/cgroup, checked against the directory's inode) and, for ids nobody showed it, scans the
hierarchy: at most once per `rescan_min_s`, so a flood of unknown ids costs one walk a second, not one
per session. Entries are never dropped when their cgroup goes away (sessions of a container that just
exited still arrive); the map is bounded instead, oldest first out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

DEFAULT_MOUNT = "/sys/fs/cgroup"
MAX_ENTRIES = 65536
MAX_SCAN_DIRS = 200_000  # one walk visits at most this many cgroups
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def mounts(root: str = "/") -> list[tuple[str, str, str]]:
    """(fstype, mount point, root of the mount inside its filesystem) of every mount of this process.

    /proc/self/mountinfo; /proc/mounts (no root field: "/") when mountinfo cannot be read."""
    out = []
    try:
        with open(os.path.join(root, "proc/self/mountinfo")) as f:
            for line in f:
                head, sep, tail = line.partition(" - ")
                fields, after = head.split(), tail.split()
                if sep and len(fields) >= 5 and after:
                    out.append((after[0], _unescape(fields[4]), _unescape(fields[3])))
        return out
    except OSError:
        pass
    try:
        with open(os.path.join(root, "proc/mounts")) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3:
                    out.append((fields[2], _unescape(fields[1]), "/"))
    except OSError:
        pass
    return out


def cgroup2_mount(root: str = "/") -> str:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts.

    A mount of the whole hierarchy (its root "/") is preferred over one of a subtree (a private cgroup
    namespace shows only the container's own cgroup)."""
    found = [(mroot != "/", point) for fstype, point, mroot in mounts(root) if fstype == "cgroup2"]
    return min(found)[1] if found else DEFAULT_MOUNT


def has_cgroup_v1(root: str = "/") -> bool:
    """Whether v1 hierarchies are mounted: then /proc/PID/cgroup has lines that name the container too."""
    return any(fstype == "cgroup" for fstype, _, _ in mounts(root))


class CgroupIndex:
    """cgroup v2 id -> path (relative to the mount, "/kubepods.slice/..."), learned and scanned."""

    def __init__(self, mount_dir: str, monotonic: Callable[[], float], rescan_min_s: float = 1.0,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.mount_dir = mount_dir.rstrip("/") or "/"  # as this process sees it (root parameter included)
        self._now = monotonic
        self.rescan_min_s = rescan_min_s
        self.max_entries = max(1, max_entries)
        self._paths: dict[int, str] = {}
        self._next_scan = 0.0
        self.scans = 0

    def __len__(self) -> int:
        return len(self._paths)

    def get(self, cgroup_id: int) -> str | None:
        """Known ids only: never touches the file system."""
        return self._paths.get(cgroup_id)

    def lookup(self, cgroup_id: int) -> str | None:
        """Known ids, else one walk of the hierarchy if none was made within rescan_min_s."""
        path = self._paths.get(cgroup_id)
        if path is None and cgroup_id and self._now() >= self._next_scan:
            self.rescan()
            path = self._paths.get(cgroup_id)
        return path

    def learn(self, path: str, cgroup_id: int | None = None) -> int | None:
        """Record `path` (from /proc/PID/cgroup); with `cgroup_id`, only if its directory has that inode.

        Returns the directory's id, or None when it does not exist (any more) or does not match."""
        try:
            ino = os.stat(self.mount_dir + ("/" + path.strip("/") if path.strip("/") else "")).st_ino
        except OSError:
            return None
        if cgroup_id is not None and ino != cgroup_id:
            return None
        self._add(ino, "/" + path.strip("/"))
        return ino

    def _add(self, cgroup_id: int, path: str) -> None:
        paths = self._paths
        if cgroup_id in paths:
            paths[cgroup_id] = path  # an inode number reused by a new cgroup: the newest path is right
            return
        while len(paths) >= self.max_entries:
            del paths[next(iter(paths))]
        paths[cgroup_id] = path

    def rescan(self) -> int:
        """Walk the hierarchy (directory entries carry the inode: no stat per cgroup); returns cgroups seen."""
        self._next_scan = self._now() + self.rescan_min_s
        self.scans += 1
        try:
            self._add(os.stat(self.mount_dir).st_ino, "/")
        except OSError:
            return 0
        seen, stack = 1, [(self.mount_dir, "")]
        while stack and seen < MAX_SCAN_DIRS:
            directory, rel = stack.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            path = f"{rel}/{entry.name}"
                            self._add(entry.inode(), path)
                            stack.append((entry.path, path))
                            seen += 1
            except OSError:  # removed while walking, or not readable
                continue
        return seen

"""Effective capabilities of the current process, by name (from /proc/self/status), and its open-file limit.

Tracing needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN); naming what is held and what is missing
turns an opaque EPERM into an actionable message.
"""

from __future__ import annotations

import os
import resource

# Capability numbers (uapi linux/capability.h).
CAP_NAMES: dict[int, str] = {
    0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 2: "CAP_DAC_READ_SEARCH", 3: "CAP_FOWNER", 4: "CAP_FSETID",
    5: "CAP_KILL", 6: "CAP_SETGID", 7: "CAP_SETUID", 8: "CAP_SETPCAP", 9: "CAP_LINUX_IMMUTABLE",
    10: "CAP_NET_BIND_SERVICE", 11: "CAP_NET_BROADCAST", 12: "CAP_NET_ADMIN", 13: "CAP_NET_RAW",
    14: "CAP_IPC_LOCK", 15: "CAP_IPC_OWNER", 16: "CAP_SYS_MODULE", 17: "CAP_SYS_RAWIO", 18: "CAP_SYS_CHROOT",
    19: "CAP_SYS_PTRACE", 20: "CAP_SYS_PACCT", 21: "CAP_SYS_ADMIN", 22: "CAP_SYS_BOOT", 23: "CAP_SYS_NICE",
    24: "CAP_SYS_RESOURCE", 25: "CAP_SYS_TIME", 26: "CAP_SYS_TTY_CONFIG", 27: "CAP_MKNOD", 28: "CAP_LEASE",
    29: "CAP_AUDIT_WRITE", 30: "CAP_AUDIT_CONTROL", 31: "CAP_SETFCAP", 32: "CAP_MAC_OVERRIDE",
    33: "CAP_MAC_ADMIN", 34: "CAP_SYSLOG", 35: "CAP_WAKE_ALARM", 36: "CAP_BLOCK_SUSPEND",
    37: "CAP_AUDIT_READ", 38: "CAP_PERFMON", 39: "CAP_BPF", 40: "CAP_CHECKPOINT_RESTORE",
}

# The ones that decide what a tracer may do, in the order they are reported.
TRACING_CAPS = ("CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYSLOG", "CAP_SYS_RESOURCE")


class CapsError(RuntimeError):
    """The status file has no readable CapEff line."""


def parse_cap_mask(mask: int) -> set[str]:
    """Names of the bits set in a capability mask; unknown bits become 'CAP_<n>'."""
    return {CAP_NAMES.get(bit, f"CAP_{bit}") for bit in range(64) if mask >> bit & 1}


def effective_mask(status_text: str) -> int:
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            try:
                return int(value.strip(), 16)
            except ValueError:
                raise CapsError(f"unreadable CapEff value '{value.strip()}'") from None
    raise CapsError("no CapEff line in the process status")


def effective_caps(root: str = "/") -> set[str]:
    """Effective capability names of this process, read from <root>/proc/self/status."""
    path = os.path.join(root, "proc/self/status")
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise CapsError(f"cannot read {path}: {exc.strerror}") from None
    return parse_cap_mask(effective_mask(text))


def can_trace(caps: set[str]) -> bool:
    """Whether these capabilities allow loading tracing programs and perf events (kernel 5.8+ split)."""
    return "CAP_SYS_ADMIN" in caps or {"CAP_BPF", "CAP_PERFMON"} <= caps


def raise_nofile_limit(need: int) -> None:
    """kprobe mode holds up to four fds per function (perf event and link, entry and exit): a thousand
    functions exceed the usual 1024/4096 limits. Root (CAP_SYS_RESOURCE) may raise the hard limit too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    roomy = hard == resource.RLIM_INFINITY or hard >= need
    for limits in ((need, hard if roomy else need), (hard, hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            return
        except (ValueError, OSError):
            continue

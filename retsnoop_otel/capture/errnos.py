"""Kernel errno names, including the kernel-internal codes (512..531) user space never sees."""

from __future__ import annotations

import errno as _errno

from retsnoop_otel.inputs.files import shown  # a name echoed cut and on one line

MAX_ERRNO = 4095

_KERNEL_INTERNAL = {
    512: "ERESTARTSYS",
    513: "ERESTARTNOINTR",
    514: "ERESTARTNOHAND",
    515: "ENOIOCTLCMD",
    516: "ERESTART_RESTARTBLOCK",
    517: "EPROBE_DEFER",
    518: "EOPENSTALE",
    519: "ENOPARAM",
    521: "EBADHANDLE",
    522: "ENOTSYNC",
    523: "EBADCOOKIE",
    524: "ENOTSUPP",
    525: "ETOOSMALL",
    526: "ESERVERFAULT",
    527: "EBADTYPE",
    528: "EJUKEBOX",
    529: "EIOCBQUEUED",
    530: "ERECALLCONFLICT",
    531: "ENOGRACE",
}

# Python's table picks one name per number; prefer the names kernel developers read in source.
_PREFERRED = {11: "EAGAIN", 35: "EDEADLK", 95: "EOPNOTSUPP"}

ERRNO_NAMES: dict[int, str] = {**_errno.errorcode, **_PREFERRED, **_KERNEL_INTERNAL}
ERRNO_VALUES: dict[str, int] = {name: num for num, name in ERRNO_NAMES.items()}
ERRNO_VALUES.update({name: value for name in dir(_errno)
                     if name.startswith("E") and isinstance(value := getattr(_errno, name), int)})
ERRNO_VALUES.update({name: num for num, name in _KERNEL_INTERNAL.items()})


def errno_name(num: int) -> str | None:
    """Name of a positive errno value, or None when the kernel defines no name for it."""
    return ERRNO_NAMES.get(num)


def parse_errno(text: str) -> int:
    """Parse 'EINVAL', '-EINVAL' or 'einval' into a positive errno number; ValueError if unknown."""
    name = text.strip().lstrip("-").upper()
    if name not in ERRNO_VALUES:
        raise ValueError(f"unknown errno name {shown(text)} (expected a name such as EINVAL or -ENOMEM)")
    return ERRNO_VALUES[name]

"""Integers and numbers a user gives (flags, config keys): one reader with the range of where each one ends up.

Every integer lands somewhere with a size: a pid in the kernel's pid_t (at most PID_MAX_LIMIT, 2^22), a BPF map's
max_entries (u32, and at most 2^31 for the hash maps and the ring buffer), a count in user space. Each key or flag
names its IntRange here, so a value past it is refused with the key, the value as written (cut by shown()) and
the range, before anything reaches the kernel, instead of a struct.error or the kernel's EINVAL/E2BIG.

The text is checked before int() converts it: Python refuses decimal strings over 4300 digits with a ValueError
(and cannot print such integers back), so over-long digit strings are refused here by their length.
"""

import math
import re
from typing import NamedTuple

from retsnoop_otel.inputs.files import shown

PID_MAX_LIMIT = 1 << 22  # include/linux/threads.h: the largest pid a 64-bit kernel hands out
U32_MAX = (1 << 32) - 1
BPF_MAP_MAX = 1 << 31  # hash maps refuse max_entries above 2^31 (E2BIG); a ring buffer is at most 2^31 bytes
_MAX_INT_TEXT = 40  # characters: more than any integer in range (u64 has 20 digits) with a sign and '_'s
_INT = re.compile(r"[+-]?(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)")


class IntRange(NamedTuple):
    lo: int
    hi: int
    what: str = ""  # where the value ends up, said with the range: "the kernel's PID_MAX_LIMIT"

    def describe(self) -> str:
        why = f" ({self.what})" if self.what else ""
        return f"between {self.lo} and {self.hi}{why}"

    def problem(self, value: int, text: object) -> str | None:
        """None when `value` is in range, else what to say (`text`: the value as the user wrote it)."""
        if self.lo <= value <= self.hi:
            return None
        return f"must be an integer {self.describe()}, got {shown(text)}"


PID = IntRange(1, PID_MAX_LIMIT, "a process id, at most the kernel's PID_MAX_LIMIT")
COUNT = IntRange(1, U32_MAX, "a count, at most 2^32 - 1")
MAP_ENTRIES = IntRange(1, BPF_MAP_MAX, "a BPF map's max_entries, at most 2^31")
RINGBUF_BYTES = IntRange(1, BPF_MAP_MAX, "bytes of a BPF ring buffer, at most 2 GiB")


class NumberError(ValueError):
    """One problem with one value; the caller prefixes the flag or key."""


def parse_int(text: str, rng: IntRange, prefixes: bool = False) -> int:
    """An integer within `rng` from text as typed ('42'; with `prefixes`, also 0x/0o/0b as C and Python write
    them); raises NumberError naming the value (cut) and the range."""
    stripped = text.strip()
    if len(stripped) > _MAX_INT_TEXT and re.fullmatch(r"[+-]?[0-9_]+", stripped[:_MAX_INT_TEXT]):
        raise NumberError(f"must be an integer {rng.describe()}, got {shown(text)}")
    m = _INT.fullmatch(stripped)
    if not m or (not prefixes and not stripped.lstrip("+-").isdigit()):
        raise NumberError(f"expected an integer {rng.describe()}, got {shown(text)}")
    try:
        value = int(stripped, 0 if prefixes else 10)
    except ValueError:  # '012' with prefixes (C's octal), '1__2'
        raise NumberError(f"expected an integer {rng.describe()}, got {shown(text)}") from None
    bad = rng.problem(value, text)
    if bad:
        raise NumberError(bad)
    return value


def parse_float(text: str, lo: float, hi: float, unit: str, closed: bool = False) -> float:
    """A finite number with lo < value < hi, or lo <= value <= hi when `closed` (NaN and infinity refused: NaN
    passes every comparison)."""
    try:
        value = float(text)
    except ValueError:
        raise NumberError(f"expected a number of {unit}, got {shown(text)}") from None
    if closed:
        if not math.isfinite(value) or not lo <= value <= hi:
            raise NumberError(f"expected a number of {unit} from {lo:g} to {hi:.15g}, got {shown(text)}")
    elif not math.isfinite(value) or not lo < value < hi:
        raise NumberError(f"expected a number of {unit} above {lo:g} and below {hi:.15g}, got {shown(text)}")
    return value


_SIZE = re.compile(r"(\d+)\s*([KMG]i?B?)?", re.I)


def parse_size(text: str, rng: IntRange) -> int:
    """Bytes as an integer (0x... too) or with a K/M/G suffix, powers of 1024 ('8M', '16MiB', '512k'), within
    `rng`."""
    stripped = text.strip()
    m = _SIZE.fullmatch(stripped) if len(stripped) <= _MAX_INT_TEXT else None
    if not m:
        if _INT.fullmatch(stripped) or len(stripped) > _MAX_INT_TEXT:
            return parse_int(text, rng, prefixes=True)
        raise NumberError(f"expected a size in bytes such as 8388608 or 8M, got {shown(text)}")
    value = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[(m.group(2) or "")[:1].lower()]
    bad = rng.problem(value, text)
    if bad:
        raise NumberError(bad.replace("an integer", "a size in bytes", 1))
    return value

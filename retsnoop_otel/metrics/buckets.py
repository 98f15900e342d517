"""Which duration buckets a probe set's histograms have: a range of the kernel's log2 slots.

The kernel counts durations in DUR_BUCKETS log2 slots (slot i holds [2^i, 2^(i+1)) ns, the last one
everything longer), a layout fixed in BPF so that counting stays one array increment. A probe set's
`duration_range` only chooses, in user space and at scrape time, which powers of two become bucket
bounds: the slots below the range are summed into the first bucket and those above it into +Inf.
Fewer buckets mean fewer series per function (each bucket is one), at no cost in the kernel.

The range is widened outward to powers of two of nanoseconds (min rounded down, max rounded up), so
every duration from min to max falls in a bucket of its own resolution.
"""

import re
from typing import NamedTuple

from retsnoop_otel.capture.records import DUR_BUCKETS

FIRST_EXP = 1  # the kernel's first bound: slot 0 ends at 2^1 ns
LAST_EXP = DUR_BUCKETS - 1  # its last finite bound: 2^39 ns (549.76 s); the last slot is open
_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
             "min": 60_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|min|m)\s*$")


class RangeError(ValueError):
    """A duration range the kernel's slots cannot give; the message says what to write instead."""


def parse_duration_ns(text: str) -> int:
    """'250us', '1.5s', '2ns' -> nanoseconds; a unit is required (a bare number could be any unit)."""
    m = _DURATION.match(text)
    if not m:
        raise RangeError(f"expected a duration with a unit (ns, us, ms, s, m) such as 1us, 250ms or 10s, "
                         f"got {text!r}")
    return round(float(m.group(1)) * _UNITS_NS[m.group(2)])


def format_ns(ns: int) -> str:
    """A duration as people write it in the config ('1.024us', '17.18s')."""
    for unit, scale in (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)):
        if ns >= scale:
            return f"{ns / scale:.4g}{unit}"
    return f"{ns}ns"


class _Bounds(NamedTuple):
    min_ns: int = 1 << FIRST_EXP
    max_ns: int = 1 << LAST_EXP


class DurationRange(_Bounds):
    """The durations a probe set's histograms resolve, in nanoseconds (the defaults: the kernel's whole range)."""

    __slots__ = ()

    def __new__(cls, min_ns: int = 1 << FIRST_EXP, max_ns: int = 1 << LAST_EXP) -> "DurationRange":
        if min_ns < 1 << FIRST_EXP:
            raise RangeError(f"min {format_ns(min_ns)} is below the kernel's first bucket bound (2ns); "
                             "use 2ns or more")
        if max_ns > 1 << LAST_EXP:
            raise RangeError(f"max {format_ns(max_ns)} is above the kernel's last bucket bound "
                             f"({format_ns(1 << LAST_EXP)}, 2^{LAST_EXP} ns); use 549s or less")
        if min_ns >= max_ns:
            raise RangeError(f"min {format_ns(min_ns)} must be below max {format_ns(max_ns)}")
        return super().__new__(cls, min_ns, max_ns)

    @property
    def exponents(self) -> tuple[int, int]:
        """(first, last) bound as powers of two of nanoseconds: min rounded down, max rounded up."""
        return self.min_ns.bit_length() - 1, (self.max_ns - 1).bit_length()

    def describe(self) -> str:
        lo, hi = self.exponents
        return f"{format_ns(1 << lo)}..{format_ns(1 << hi)} ({hi - lo + 2} buckets)"


def slot_buckets(lo: int, hi: int, slots: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The finite bounds (exponents) of range [2^lo, 2^hi] over `slots` kernel slots, and each slot's bucket.

    Slot i ends at 2^(i+1) ns, so it falls in the first bucket whose bound is at or above that end;
    the kernel's open last slot, and slots ending above 2^hi, fall in +Inf (index len(bounds)).
    """
    hi = min(hi, slots - 1)
    bounds = tuple(range(lo, hi + 1))
    owner = tuple(max(lo, i + 1) - lo if i < slots - 1 and i + 1 <= hi else len(bounds) for i in range(slots))
    return bounds, owner


def merge(counts: tuple[int, ...] | list[int], owner: tuple[int, ...], buckets: int) -> list[int]:
    """Per-slot counts summed into per-bucket counts."""
    out = [0] * buckets
    for i, n in enumerate(counts):
        out[owner[i]] += n
    return out

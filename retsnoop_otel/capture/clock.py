"""Conversion of kernel boot-clock timestamps (bpf_ktime_get_boot_ns) to wall-clock time.

The kernel stamps events with CLOCK_BOOTTIME, which keeps counting across suspend; OTLP wants Unix
epoch nanoseconds. The difference between the two clocks is measured from user space by reading
CLOCK_REALTIME on both sides of a CLOCK_BOOTTIME read; the sample with the tightest bracket bounds
the error best. The offset drifts when NTP steps the wall clock, so long-running users re-measure.
"""

import time
from collections.abc import Callable
from typing import NamedTuple

ClockFn = Callable[[], int]


def _realtime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


def _boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class ClockOffset(NamedTuple):
    """A measured CLOCK_REALTIME - CLOCK_BOOTTIME difference.

    `measured_at` is the boot-clock time of the measurement, so callers can tell how old it is;
    `uncertainty_ns` is the width of the realtime bracket around the boot-clock read.
    """

    offset_ns: int
    measured_at: int
    uncertainty_ns: int = 0


def measure_clock_offset(samples: int = 10, realtime: ClockFn = _realtime_ns,
                         boottime: ClockFn = _boottime_ns) -> ClockOffset:
    """Best of `samples` bracketed reads: realtime, boottime, realtime; the narrowest bracket wins."""
    if samples < 1:
        raise ValueError("samples must be at least 1")
    best: ClockOffset | None = None
    for _ in range(samples):
        before = realtime()
        boot = boottime()
        after = realtime()
        width = after - before
        if width < 0:  # the wall clock was stepped backwards between the reads: useless sample
            continue
        if best is None or width < best.uncertainty_ns:
            best = ClockOffset(before + width // 2 - boot, boot, width)
    if best is None:
        raise RuntimeError(f"CLOCK_REALTIME went backwards in all {samples} samples; cannot measure offset")
    return best


def measure_boot_to_wall_offset(samples: int = 10, realtime: ClockFn = _realtime_ns,
                                boottime: ClockFn = _boottime_ns) -> int:
    """Nanoseconds to add to a boot-clock timestamp to get Unix epoch time."""
    return measure_clock_offset(samples, realtime, boottime).offset_ns

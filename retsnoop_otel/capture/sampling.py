"""Which successful sessions are kept: error sessions always are, successful ones are sampled.

A kernel can run an entry function millions of times a second without failing; exporting each
success would cost more than the tracing itself, so successes are kept by probability or up to a
rate per entry function (a token bucket each, so one hot function cannot starve the others).

What the exported spans say about it follows OTel probability sampling (tracestate-probability-
sampling): a probability becomes a 56-bit rejection threshold T, a session is kept when a 56-bit
random value R is >= T, and R becomes the low 56 bits of the trace id, so that downstream samplers
and span-derived metrics can weigh each kept trace by 2^56 / (2^56 - T). A rate limiter keeps a
varying fraction of sessions that nobody knows in advance: its sessions carry no threshold rather
than an invented one. Error sessions are always kept: threshold 0.

The decision is taken in the kernel (bpf/sampling.bpf.h, from kernel_sampling() here): R is drawn
there and travels with the session end record, so a dropped success never reaches user space.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

RANDOM_BITS = 56
MAX_THRESHOLD = (1 << RANDOM_BITS) - 1
ALWAYS = 0  # the threshold of sessions kept whatever the randomness (error sessions, probability 1)
PRECISION = 4  # hex digits of a threshold, as the specification recommends to SDKs


def threshold(probability: float, precision: int = PRECISION) -> int:
    """The rejection threshold of a sampling probability in (0, 1], rounded to `precision` hex digits.

    Small probabilities get more digits (one per leading 'f' of the threshold), so that 1-in-1000
    keeps its precision; the result is the threshold written, so decisions use it too.
    """
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"a sampling probability is in (0, 1], not {probability!r}")
    if probability == 1.0:
        return ALWAYS
    exponent = math.frexp(probability)[1]  # probability = m * 2**exponent with 0.5 <= m < 1
    digits = max(1, min(RANDOM_BITS // 4, precision + (-exponent) // 4))
    step = 1 << (4 * (RANDOM_BITS // 4 - digits))
    from fractions import Fraction  # exact arithmetic, needed only when a probability is configured
    exact = (1 - Fraction(probability)) * (1 << RANDOM_BITS) / step
    return min(MAX_THRESHOLD, int(exact + Fraction(1, 2)) * step)  # half rounds up


def th_value(t: int) -> str:
    """The `th` sub-key value: 14 hex digits, trailing zeros removed ("0" for 100%)."""
    if not 0 <= t <= MAX_THRESHOLD:
        raise ValueError(f"a threshold has {RANDOM_BITS} bits, not {t:#x}")
    return f"{t:014x}".rstrip("0") or "0"


@functools.cache
def trace_state(t: int | None) -> str:
    """The W3C tracestate of a trace kept with threshold `t` ("" when the probability is not known)."""
    return "" if t is None else f"ot=th:{th_value(t)}"


class Sampling(NamedTuple):
    """Error sessions are always kept; successful ones by probability or by rate per entry function."""

    success_probability: float = 0.0
    success_rate_per_s: float | None = None

    @property
    def captures_success(self) -> bool:
        return self.success_probability > 0 or bool(self.success_rate_per_s)


class KernelSampling(NamedTuple):
    """The decision as the kernel side takes it (bpf/sampling.bpf.h), so that a successful session the
    sampler drops costs no ring-buffer record and no user-space work: a success is kept when its 56-bit
    randomness is >= `threshold`, or (interval_ns > 0) when its entry function's token bucket of
    1e9 / interval_ns per second with a burst of burst_ns / interval_ns + 1 has a token."""

    capture_success: bool = False
    threshold: int = 0
    interval_ns: int = 0
    burst_ns: int = 0

    @property
    def by_probability(self) -> bool:
        return self.capture_success and not self.interval_ns


def kernel_sampling(sampling: Sampling) -> KernelSampling:
    """The kernel side's constants for a probe set's sampling of successful sessions."""
    rate = sampling.success_rate_per_s
    if rate:
        interval = 1e9 / rate
        return KernelSampling(True, 0, max(1, round(interval)), round((max(1.0, rate) - 1) * interval))
    p = sampling.success_probability
    if p > 0:
        return KernelSampling(True, threshold(min(p, 1.0)))
    return KernelSampling()

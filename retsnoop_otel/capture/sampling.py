"""Which sessions are kept: successful ones are sampled, error sessions are all kept unless sampled too.

A kernel can run an entry function millions of times a second without failing; exporting each
success would cost more than the tracing itself, so successes are kept by probability or up to a
rate per entry function (a token bucket each, so one hot function cannot starve the others).

What the exported spans say about it follows OTel probability sampling (tracestate-probability-
sampling): a probability becomes a 56-bit rejection threshold T, a session is kept when a 56-bit
random value R is >= T, and R becomes the low 56 bits of the trace id, so that downstream samplers
and span-derived metrics can weigh each kept trace by 2^56 / (2^56 - T). A rate limiter keeps a
varying fraction of sessions that nobody knows in advance: its sessions carry no threshold rather
than an invented one. Error sessions are all kept by default (threshold 0). In an error storm they can be
sampled as well, the same two ways a user of OTel samplers knows (a ratio, or a rate limit): by probability
(sampling.errors, threshold and tracestate as for successes), or by rate per error origin
(sampling.errors_rate_per_s: a token bucket per origin function, so that one origin failing a million times a
second cannot crowd out a rare one; no threshold, as for successes by rate). Either way the kernel counts every
failing session by origin before it decides (retsnoop_error_origins_total stays exact) and counts the ones it
dropped (CaptureStats.errors_sampled_out).

The decision is taken in the kernel (bpf/sampling.bpf.h, from kernel_sampling() here): R is drawn
there and travels with the session end record, so a dropped session never reaches user space. The error
origin is known there only at the session's end, where error sampling decides: a success's path is unchanged.
"""

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
    """Successful sessions kept by probability or by rate per entry function; error sessions all kept
    (probability 1), or by probability, or by rate per error origin."""

    success_probability: float = 0.0
    success_rate_per_s: float | None = None
    error_probability: float = 1.0
    error_rate_per_s: float | None = None

    @property
    def captures_success(self) -> bool:
        return self.success_probability > 0 or bool(self.success_rate_per_s)

    @property
    def samples_errors(self) -> bool:
        return self.error_probability < 1.0 or bool(self.error_rate_per_s)


class KernelSampling(NamedTuple):
    """The decision as the kernel side takes it (bpf/sampling.bpf.h), so that a session the sampler drops
    costs no ring-buffer record and no user-space work: a success is kept when its 56-bit randomness is
    >= `threshold`, or (interval_ns > 0) when its entry function's token bucket of 1e9 / interval_ns per
    second with a burst of burst_ns / interval_ns + 1 has a token. An error session likewise with the
    error_* constants, its bucket being its error origin's; error_threshold 0 and no interval: all kept."""

    capture_success: bool = False
    threshold: int = 0
    interval_ns: int = 0
    burst_ns: int = 0
    error_threshold: int = ALWAYS
    error_interval_ns: int = 0
    error_burst_ns: int = 0

    @property
    def by_probability(self) -> bool:
        return self.capture_success and not self.interval_ns

    @property
    def errors_by_probability(self) -> bool:
        return self.error_threshold != ALWAYS and not self.error_interval_ns

    def kept_threshold(self, error: bool, sampled: bool, by_probability: bool) -> int | None:
        """What a kept session's tracestate says: ALWAYS for an error the kernel did not sample (it sends those
        unflagged), the configured threshold when kept by probability, unknown (None) when kept by a rate."""
        if error and not sampled:
            return ALWAYS
        if not by_probability:
            return None
        return self.error_threshold if error else self.threshold


def _bucket(rate: float) -> tuple[int, int]:
    """A token bucket of `rate` per second with a burst of max(1, rate): (interval_ns, burst_ns)."""
    interval = 1e9 / rate
    return max(1, round(interval)), round((max(1.0, rate) - 1) * interval)


def kernel_sampling(sampling: Sampling) -> KernelSampling:
    """The kernel side's constants for a probe set's sampling of successful and error sessions."""
    errors: tuple[int, int, int] = (ALWAYS, 0, 0)
    if sampling.error_rate_per_s:
        errors = (ALWAYS, *_bucket(sampling.error_rate_per_s))
    elif sampling.error_probability < 1.0:
        errors = (threshold(sampling.error_probability), 0, 0)
    rate = sampling.success_rate_per_s
    if rate:
        return KernelSampling(True, 0, *_bucket(rate), *errors)
    p = sampling.success_probability
    if p > 0:
        return KernelSampling(True, threshold(min(p, 1.0)), 0, 0, *errors)
    return KernelSampling(False, 0, 0, 0, *errors)

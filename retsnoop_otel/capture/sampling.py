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
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

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


@dataclass(frozen=True)
class Sampling:
    """Error sessions are always kept; successful ones by probability or by rate per entry function."""

    success_probability: float = 0.0
    success_rate_per_s: float | None = None

    @property
    def captures_success(self) -> bool:
        return self.success_probability > 0 or bool(self.success_rate_per_s)


@dataclass(frozen=True, slots=True)
class Kept:
    """A successful session's keep decision: the threshold and randomness it was taken with (None: unknown)."""

    threshold: int | None
    randomness: int | None


RATE_LIMITED = Kept(None, None)


class SuccessSampler:
    """Keeps successful sessions by probability, or up to a rate per entry function (token bucket)."""

    def __init__(self, sampling: Sampling, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sampling = sampling
        self._rng = rng or random.Random()
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # entry func id -> (tokens, last refill)
        p = sampling.success_probability
        self.threshold: int | None = threshold(min(p, 1.0)) if p > 0 and not sampling.success_rate_per_s else None

    def keep(self, entry_func_id: int | None) -> bool:
        return self.decide(entry_func_id) is not None

    def decide(self, entry_func_id: int | None) -> Kept | None:
        """How a successful session is kept, or None when it is not."""
        rate = self.sampling.success_rate_per_s
        if not rate:
            if self.threshold is None:
                return None
            r = self._rng.getrandbits(RANDOM_BITS)
            return Kept(self.threshold, r) if r >= self.threshold else None
        now = self._clock()
        burst = max(1.0, rate)
        key = -1 if entry_func_id is None else entry_func_id  # id 0 is a real entry function
        tokens, last = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - last) * rate)
        keep = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if keep else tokens, now)
        return RATE_LIMITED if keep else None

"""Which successful sessions are kept: error sessions always are, successful ones are sampled.

A kernel can run an entry function millions of times a second without failing; exporting each
success would cost more than the tracing itself, so successes are kept by probability or up to a
rate per entry function (a token bucket each, so one hot function cannot starve the others).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """Error sessions are always kept; successful ones by probability or by rate per entry function."""

    success_probability: float = 0.0
    success_rate_per_s: float | None = None

    @property
    def captures_success(self) -> bool:
        return self.success_probability > 0 or bool(self.success_rate_per_s)


class SuccessSampler:
    """Keeps successful sessions by probability, or up to a rate per entry function (token bucket)."""

    def __init__(self, sampling: Sampling, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sampling = sampling
        self._rng = rng or random.Random()
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # entry func id -> (tokens, last refill)

    def keep(self, entry_func_id: int | None) -> bool:
        rate = self.sampling.success_rate_per_s
        if not rate:
            p = self.sampling.success_probability
            return p >= 1.0 or (p > 0.0 and self._rng.random() < p)
        now = self._clock()
        burst = max(1.0, rate)
        key = -1 if entry_func_id is None else entry_func_id  # id 0 is a real entry function
        tokens, last = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - last) * rate)
        keep = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if keep else tokens, now)
        return keep

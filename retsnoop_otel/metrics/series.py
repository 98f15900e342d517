"""Bounds on label values, for fleets that trace many functions (metrics.max_error_types, metrics.functions)."""

import fnmatch
import threading
from collections.abc import Mapping
from typing import NamedTuple

OTHER = "other"  # label value of what the series bounds fold together


class SeriesBounds(NamedTuple):
    """Caps on label values: 0 / () mean no cap."""

    max_error_types: int = 0  # error_type values per function; the rest are summed as error_type="other"
    functions: tuple[str, ...] = ()  # globs of functions with series of their own; the rest: function="other"
    max_workloads: int = 0  # workload label values with series of their own, per probe set; the rest: "other"


class SeriesLimiter:
    """Applies SeriesBounds the same way at every scrape.

    Which error types of a function get their own series is decided once, when they first appear
    (the largest first), and never changes: a counter that moved between `EINVAL` and `other` from
    one scrape to the next would look like a reset to Prometheus. Memory is bounded by functions x cap.
    """

    def __init__(self, bounds: SeriesBounds) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        self._kept: dict[str, list[str]] = {}
        self._allowed: dict[str, bool] = {}
        self._workloads: set[str] = set()

    def function(self, name: str) -> str:
        if not self.bounds.functions:
            return name
        ok = self._allowed.get(name)
        if ok is None:
            ok = self._allowed[name] = any(fnmatch.fnmatchcase(name, g) for g in self.bounds.functions)
        return name if ok else OTHER

    def errors(self, function: str, errors: Mapping[str, int]) -> dict[str, int]:
        cap = self.bounds.max_error_types
        if not cap:
            return dict(errors)
        with self._lock:
            kept = self._kept.setdefault(function, [])
            for err in sorted(errors, key=lambda e: (-errors[e], e)):
                if err not in kept and len(kept) < cap:
                    kept.append(err)
            chosen = set(kept)
        out = {e: n for e, n in errors.items() if e in chosen}
        rest = sum(n for e, n in errors.items() if e not in chosen)
        if rest:
            out[OTHER] = out.get(OTHER, 0) + rest
        return out

    def workload(self, value: str) -> str:
        """The series a workload label value goes to: its own while there is room, else `other`.

        Asked once per cgroup (workload_series decides a cgroup's value once); "" (outside any
        container) does not take a place.
        """
        cap = self.bounds.max_workloads
        if not cap or not value:
            return value
        with self._lock:
            if value in self._workloads or len(self._workloads) < cap:
                self._workloads.add(value)
                return value
        return OTHER

    def release_workload(self, value: str) -> None:
        """A value whose workloads are all gone gives its place to the next one."""
        with self._lock:
            self._workloads.discard(value)

"""Per-workload metric series from the kernel's per-cgroup counts (a probe set's `workload_label`).

The kernel counts by cgroup v2 id, which means nothing to a person and changes with every container
start, so series are labelled by what the cgroup belongs to: its Kubernetes namespace, or its
container. Three rules keep those series honest counters:
- a cgroup's label value is decided once (a cgroup does not move between containers or namespaces);
  one whose pod is not known yet (the metadata watch lags the pod's start) waits up to `pending_s`
  and is then counted as `unknown`, rather than first under one value and later under another;
- the counts of a cgroup that is gone are kept in a retired total of its value before its kernel
  entries are deleted, so the series never goes down and the kernel map does not fill with the dead;
- at most `max_values` values have series of their own (SeriesLimiter.workload), the rest are summed
  as `other`; a value whose cgroups have all been gone for `retire_after_s` gives its place up and its
  series ends, so container churn does not push every new container into `other` for good.
"""

from collections.abc import Callable, Iterable
from typing import NamedTuple

from retsnoop_otel.capture.model import Workload, WorkloadCount
from retsnoop_otel.metrics.series import OTHER, SeriesBounds, SeriesLimiter

# workload_label setting -> Prometheus label name: `container_id` as kube-state-metrics writes it
# (`containerd://<id>`), so kube_pod_container_info joins it to pod and container names
LABEL_NAMES = {"namespace": "namespace", "container": "container_id"}
UNKNOWN = "unknown"  # a pod whose metadata did not arrive within pending_s
PENDING_S = 60.0
RETIRE_AFTER_S = 600.0


def label_value(workload: Workload, kind: str) -> str | None:
    """The label value of a workload; "" outside any container or pod, None while its pod is not known yet."""
    if kind == "namespace":
        if workload.namespace:
            return workload.namespace
        return None if workload.pod_uid else ""
    if not workload.container_id:
        return ""
    return f"{workload.container_runtime}://{workload.container_id}" if workload.container_runtime \
        else workload.container_id


class WorkloadTotal(NamedTuple):
    """One series' count: calls of a function (or sessions of an entry function) with one outcome, per value."""

    value: str  # the workload label's value
    func_id: int
    session: bool
    error: str | None  # None: success
    count: int


_Key = tuple[str, int, bool, "str | None"]


class WorkloadSeries:
    """Folds one probe set's per-cgroup kernel counts into per-value totals, scrape after scrape."""

    def __init__(self, label_of: Callable[[int], str | None], alive: Callable[[int], bool],
                 monotonic: Callable[[], float], max_values: int = 0, pending_s: float = PENDING_S,
                 retire_after_s: float = RETIRE_AFTER_S) -> None:
        """`label_of(cgroup id)`: its value, None while not known yet; `alive(cgroup id)`: it still exists."""
        self._label_of = label_of
        self._alive = alive
        self._now = monotonic
        self._limiter = SeriesLimiter(SeriesBounds(max_workloads=max_values))
        self._pending_s = pending_s
        self._retire_after_s = retire_after_s
        self._value: dict[int, str] = {}  # cgroup -> its decided value (OTHER past the limit)
        self._first_seen: dict[int, float] = {}  # undecided cgroups
        self._retired: dict[_Key, int] = {}  # counts of cgroups that are gone
        self._retired_cgroups: set[int] = set()  # gone, their kernel entries not yet seen deleted
        self._empty_since: dict[str, float] = {}  # value -> since when it has no live cgroup

    def fold(self, counts: Iterable[WorkloadCount]) -> tuple[list[WorkloadTotal], set[int]]:
        """Totals per (value, function, outcome), and the gone cgroups whose kernel entries to delete now."""
        now = self._now()
        totals = dict(self._retired)
        live: dict[int, bool] = {}
        seen: set[int] = set()
        for c in counts:
            cg = c.cgroup_id
            seen.add(cg)
            if cg in self._retired_cgroups:
                continue  # already folded into _retired: its entries are on their way out
            if cg not in live:
                live[cg] = self._alive(cg)
            value = self._decide(cg, now, live[cg])
            if value is None:
                continue  # counted from the scrape its value is decided on
            key = (value, c.func_id, c.session, c.error)
            totals[key] = totals.get(key, 0) + c.count
            if not live[cg]:
                self._retired[key] = self._retired.get(key, 0) + c.count
        gone = {cg for cg, ok in live.items() if not ok and cg in self._value}
        for cg in self._retired_cgroups - seen:  # their kernel entries are deleted: only _retired holds them now
            self._value.pop(cg, None)
        self._retired_cgroups = (self._retired_cgroups & seen) | gone
        active = {self._value[cg] for cg, ok in live.items() if ok and cg in self._value}
        self._retire_values(active, totals, now)
        return [WorkloadTotal(*key, n) for key, n in totals.items()], gone

    def _decide(self, cg: int, now: float, alive: bool) -> str | None:
        value = self._value.get(cg)
        if value is not None:
            return value
        value = self._label_of(cg)
        if value is None:
            first = self._first_seen.setdefault(cg, now)
            if alive and now - first < self._pending_s:
                return None
            value = UNKNOWN
        self._first_seen.pop(cg, None)
        value = self._limiter.workload(value)
        self._value[cg] = value
        return value

    def _retire_values(self, active: set[str], totals: dict[_Key, int], now: float) -> None:
        """Values with no live cgroup for retire_after_s lose their series and their place under the limit."""
        for value in {k[0] for k in totals} | set(self._empty_since):
            if value in active or value == OTHER:
                self._empty_since.pop(value, None)
                continue
            since = self._empty_since.setdefault(value, now)
            if now - since < self._retire_after_s:
                continue
            del self._empty_since[value]
            for table in (self._retired, totals):
                for key in [k for k in table if k[0] == value]:
                    del table[key]
            for cg in [cg for cg, v in self._value.items() if v == value]:
                del self._value[cg]
            self._limiter.release_workload(value)

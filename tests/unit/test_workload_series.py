"""Per-workload series from per-cgroup kernel counts: decided once, monotonic across dying cgroups, bounded."""

from __future__ import annotations

from retsnoop_otel.capture.model import Workload, WorkloadCount
from retsnoop_otel.metrics.series import OTHER
from retsnoop_otel.metrics.workload_series import UNKNOWN, WorkloadSeries, label_value
from tests.fakes import Clock

CID = "3f4b1c2d" * 8


def series(labels: dict[int, str | None], alive: set[int], clock: Clock, max_values: int = 0) -> WorkloadSeries:
    return WorkloadSeries(labels.get, alive.__contains__, clock, max_values=max_values, pending_s=60,
                          retire_after_s=600)


def totals(ws: WorkloadSeries, counts: list[WorkloadCount]) -> tuple[dict, set[int]]:
    out, gone = ws.fold(counts)
    return {(t.value, t.func_id, t.session, t.error): t.count for t in out}, gone


def test_label_values_of_workloads():
    pod = Workload(container_id=CID, container_runtime="containerd", pod_uid="u-1", pod_name="web-1",
                   namespace="shop", container_name="app")
    assert label_value(pod, "namespace") == "shop"
    assert label_value(pod, "container") == f"containerd://{CID}"  # kube-state-metrics' container_id
    assert label_value(Workload(container_id=CID), "container") == CID
    assert label_value(Workload(), "namespace") == "" and label_value(Workload(), "container") == ""
    # a pod seen in the cgroup path whose metadata has not arrived: not decided yet
    assert label_value(Workload(container_id=CID, pod_uid="u-2"), "namespace") is None


def test_counts_are_summed_per_value_and_function_and_outcome():
    clock = Clock()
    ws = series({10: "shop", 11: "shop", 12: ""}, {10, 11, 12}, clock)
    got, gone = totals(ws, [WorkloadCount(10, 1, False, None, 5), WorkloadCount(11, 1, False, None, 2),
                            WorkloadCount(11, 1, False, "EINVAL", 3), WorkloadCount(12, 1, False, None, 7),
                            WorkloadCount(10, 0, True, "error", 1)])
    assert got == {("shop", 1, False, None): 7, ("shop", 1, False, "EINVAL"): 3, ("", 1, False, None): 7,
                   ("shop", 0, True, "error"): 1}
    assert gone == set()


def test_a_pending_cgroup_is_counted_once_decided_never_under_two_values():
    clock = Clock()
    labels: dict[int, str | None] = {10: None}
    ws = series(labels, {10}, clock)
    assert totals(ws, [WorkloadCount(10, 1, False, None, 4)])[0] == {}
    labels[10] = "shop"  # the pod arrived through the watch
    clock.t += 5
    assert totals(ws, [WorkloadCount(10, 1, False, None, 6)])[0] == {("shop", 1, False, None): 6}
    labels[10] = "elsewhere"  # decided once: a later answer does not move the counter
    assert totals(ws, [WorkloadCount(10, 1, False, None, 8)])[0] == {("shop", 1, False, None): 8}


def test_a_pod_whose_metadata_never_arrives_becomes_unknown_after_the_wait():
    clock = Clock()
    ws = series({10: None}, {10}, clock)
    assert totals(ws, [WorkloadCount(10, 1, False, None, 1)])[0] == {}
    clock.t += 61
    assert totals(ws, [WorkloadCount(10, 1, False, None, 2)])[0] == {(UNKNOWN, 1, False, None): 2}


def test_a_gone_cgroup_keeps_its_counts_and_its_entries_can_go():
    clock = Clock()
    alive = {10, 11}
    ws = series({10: "shop", 11: "shop"}, alive, clock)
    totals(ws, [WorkloadCount(10, 1, False, None, 5), WorkloadCount(11, 1, False, None, 1)])
    alive.discard(10)  # the container exited, its cgroup removed
    got, gone = totals(ws, [WorkloadCount(10, 1, False, None, 6), WorkloadCount(11, 1, False, None, 2)])
    assert gone == {10} and got == {("shop", 1, False, None): 8}
    # entries still there (deletion not seen yet): not counted twice
    got, gone = totals(ws, [WorkloadCount(10, 1, False, None, 6), WorkloadCount(11, 1, False, None, 3)])
    assert got == {("shop", 1, False, None): 9} and gone == set()
    # deleted: the retired count stays in the series, which never goes down
    got, _ = totals(ws, [WorkloadCount(11, 1, False, None, 4)])
    assert got == {("shop", 1, False, None): 10}


def test_values_beyond_the_limit_go_to_other_and_a_gone_value_frees_its_place():
    clock = Clock()
    alive = {1, 2, 3}
    ws = series({1: "a", 2: "b", 3: "c", 4: "d", 5: ""}, alive, clock, max_values=2)
    got, _ = totals(ws, [WorkloadCount(cg, 0, False, None, 1) for cg in (1, 2, 3)])
    assert got == {("a", 0, False, None): 1, ("b", 0, False, None): 1, (OTHER, 0, False, None): 1}
    alive.discard(1)
    got, gone = totals(ws, [WorkloadCount(cg, 0, False, None, 1) for cg in (1, 2, 3)])
    assert gone == {1} and got[("a", 0, False, None)] == 1
    clock.t += 601  # `a` had no live cgroup for retire_after_s: its series ends, its place is free
    got, _ = totals(ws, [WorkloadCount(cg, 0, False, None, 1) for cg in (2, 3)])
    assert ("a", 0, False, None) not in got
    alive.update({4, 5})
    got, _ = totals(ws, [WorkloadCount(cg, 0, False, None, 2) for cg in (2, 3, 4, 5)])
    # `d` takes the free place; `c` stays in other (a counter never moves); "" never takes a place
    assert got == {("b", 0, False, None): 2, (OTHER, 0, False, None): 2, ("d", 0, False, None): 2,
                   ("", 0, False, None): 2}


def test_families_carry_the_workload_label_of_the_sets_that_have_one():
    from prometheus_client import generate_latest

    from retsnoop_otel.metrics.series import SeriesBounds, SeriesLimiter
    from retsnoop_otel.metrics.workload_series import WorkloadTotal
    from tests.fakes import FakeProbeSet, metrics_registry

    labelled = FakeProbeSet(name="k8s", workload_label="namespace", workloads=[
        WorkloadTotal("shop", 0, False, None, 2), WorkloadTotal("shop", 0, False, "EINVAL", 1),
        WorkloadTotal("", 0, False, None, 4), WorkloadTotal("shop", 1, False, "EPERM", 3),
        WorkloadTotal("shop", 2, False, "EPERM", 1), WorkloadTotal("shop", 2, False, "ENOENT", 1),
        WorkloadTotal("shop", 0, True, "error", 1), WorkloadTotal("shop", 0, True, None, 2)])
    plain = FakeProbeSet(name="vfs")
    limiter = SeriesLimiter(SeriesBounds(max_error_types=1))
    text = generate_latest(metrics_registry(sets=[labelled, plain], limiter=lambda _: limiter)).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith(("retsnoop_function_calls_total",
                                                               "retsnoop_function_errors_total",
                                                               "retsnoop_sessions_total"))]
    assert lines == [
        'retsnoop_function_calls_total{function="do_open",namespace="",probe_set="k8s"} 4.0',
        'retsnoop_function_calls_total{function="do_open",namespace="shop",probe_set="k8s"} 3.0',
        # may_open: two instances, summed under one name as without the label
        'retsnoop_function_calls_total{function="may_open",namespace="shop",probe_set="k8s"} 5.0',
        'retsnoop_function_calls_total{function="do_open",namespace="",probe_set="vfs"} 3.0',
        'retsnoop_function_calls_total{function="may_open",namespace="",probe_set="vfs"} 5.0',
        'retsnoop_function_errors_total{error_type="EINVAL",function="do_open",namespace="shop",probe_set="k8s"} 1.0',
        # the error-type bound of the series limiter holds per function with the label too
        'retsnoop_function_errors_total{error_type="EPERM",function="may_open",namespace="shop",probe_set="k8s"} 4.0',
        'retsnoop_function_errors_total{error_type="other",function="may_open",namespace="shop",probe_set="k8s"} 1.0',
        'retsnoop_function_errors_total{error_type="EINVAL",function="do_open",namespace="",probe_set="vfs"} 1.0',
        'retsnoop_function_errors_total{error_type="EPERM",function="may_open",namespace="",probe_set="vfs"} 3.0',
        'retsnoop_function_errors_total{error_type="other",function="may_open",namespace="",probe_set="vfs"} 1.0',
        'retsnoop_sessions_total{entry_function="do_open",namespace="shop",outcome="error",probe_set="k8s"} 1.0',
        'retsnoop_sessions_total{entry_function="do_open",namespace="shop",outcome="success",probe_set="k8s"} 2.0',
    ]

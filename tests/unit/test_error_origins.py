"""Error origins (issue 46 point 1): the kernel's counts read and served, and the origin of a session in user space.

The origin is the deepest function of a failing session's error chain (the stack view's '!' row). The kernel
counts it in map origin_stats; these tests check the map's decoding, the /metrics and reload paths, the root
span attribute and --json, and that the chain's deepest level is what the kernel's rule gives over recorded
calls (tests/origin_oracle.py)."""

from __future__ import annotations

import struct

from prometheus_client import generate_latest

from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import (
    Call,
    CaptureStats,
    OriginCount,
    RetKind,
    Session,
    StackEntry,
    TracedFunc,
)
from retsnoop_otel.capture.origins import error_origin
from retsnoop_otel.kernel import stats_maps
from retsnoop_otel.metrics.series import SeriesBounds, SeriesLimiter
from retsnoop_otel.render.console import session_json
from retsnoop_otel.runtime import carry
from tests.fakes import EINVAL, OFFSET, TREE_FUNCS, FakeProbeSet, metrics_registry, tree_session
from tests.oracle_spans import request_to_spans
from tests.origin_oracle import origin_from_calls
from tests.span_checks import encoded

FUNCS = [TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True),
         TracedFunc(1, "array_map_alloc_check", 0, RetKind.INT32, False),
         TracedFunc(2, "map_lookup_elem", 0, RetKind.INT32, False),
         TracedFunc(3, "bpf_map_area_alloc", 0, RetKind.POINTER, False)]
ENOMEM = (1 << 64) - 12


class DictMap:
    """A per-CPU BPF hash map as stats_maps reads it."""

    def __init__(self, items: dict[bytes, bytes]) -> None:
        self.items = items

    def keys(self):
        return iter(self.items)

    def lookup(self, key: bytes, value_size: int | None = None) -> bytes | None:
        return self.items.get(key)

    def delete(self, key: bytes) -> None:
        self.items.pop(key, None)


def _percpu(*counts: int) -> bytes:
    return struct.pack(f"<{len(counts)}Q", *counts)


def test_origin_map_is_summed_over_cpus_and_named() -> None:
    m = DictMap({records.ORIGIN_KEY.pack(0, 1, 22): _percpu(3, 4),
                 records.ORIGIN_KEY.pack(0, 2, 9): _percpu(0, 5),
                 records.ORIGIN_KEY.pack(0, 3, 0): _percpu(1, 0),  # a NULL pointer
                 records.ORIGIN_KEY.pack(0, 99, 22): _percpu(1, 1)})  # an id of another table: skipped
    got = sorted(stats_maps.origin_counts(m, FUNCS, 2))
    assert got == [OriginCount(0, 1, "EINVAL", 7), OriginCount(0, 2, "EBADF", 5), OriginCount(0, 3, "NULL", 1)]
    assert records.ORIGIN_KEY.size == 16 and records.CAPTURE_STATS.size == 72  # bpf/retsnoop.h


def test_metrics_serve_one_series_per_entry_origin_and_error() -> None:
    ps = FakeProbeSet(name="bpf", funcs=FUNCS, origins=[OriginCount(0, 1, "EINVAL", 7), OriginCount(0, 2, "EBADF", 5),
                                                        OriginCount(0, 1, "EINVAL", 2)],
                      capture=CaptureStats(origins_dropped=3))
    text = generate_latest(metrics_registry(sets=[ps])).decode()
    lines = [line for line in text.splitlines() if line.startswith("retsnoop_error_origins")]
    assert lines == [
        'retsnoop_error_origins_total{entry="__x64_sys_bpf",error_type="EINVAL",origin="array_map_alloc_check",'
        'probe_set="bpf"} 9.0',
        'retsnoop_error_origins_total{entry="__x64_sys_bpf",error_type="EBADF",origin="map_lookup_elem",'
        'probe_set="bpf"} 5.0',
        'retsnoop_error_origins_dropped_total{probe_set="bpf"} 3.0']


def test_origins_outside_metrics_functions_fold_into_other() -> None:
    ps = FakeProbeSet(name="bpf", funcs=FUNCS, origins=[OriginCount(0, 1, "EINVAL", 7), OriginCount(0, 2, "EINVAL", 1)])
    limiter = SeriesLimiter(SeriesBounds(functions=("array_*",)))
    text = generate_latest(metrics_registry(sets=[ps], limiter=lambda _n: limiter)).decode()
    assert 'retsnoop_error_origins_total{entry="__x64_sys_bpf",error_type="EINVAL",origin="other",probe_set="bpf"} ' \
        '1.0' in text
    assert 'origin="array_map_alloc_check",probe_set="bpf"} 7.0' in text


def test_a_reload_carries_the_origin_counts_by_name() -> None:
    before = carry.totals(FUNCS, [], [], [], CaptureStats(), [], 0, 0, 0, None, [OriginCount(0, 1, "EINVAL", 4)])
    renumbered = [f._replace(id=i) for i, f in enumerate(reversed(FUNCS))]  # the new config's own ids
    now = carry.origin_counts([OriginCount(3, 2, "EINVAL", 1)], renumbered, before)
    assert sorted((renumbered[c.entry_func_id].name, renumbered[c.origin_func_id].name, c.error, c.count)
                  for c in now) == [("__x64_sys_bpf", "array_map_alloc_check", "EINVAL", 1),
                                    ("__x64_sys_bpf", "array_map_alloc_check", "EINVAL", 4)]


def test_the_root_span_of_a_failing_session_names_its_origin() -> None:
    root = request_to_spans(encoded(tree_session()))[0]
    assert root["attributes"]["retsnoop.error.origin"] == "map_create"
    ok = tree_session(is_err=False, chain=[StackEntry(0, 0, 8_000)])
    assert "retsnoop.error.origin" not in request_to_spans(encoded(ok))[0]["attributes"]


def test_json_carries_the_origin_and_its_error() -> None:
    assert session_json(tree_session(), TREE_FUNCS, OFFSET)["origin"] == {"function": "map_create", "error": "EINVAL"}
    assert "origin" not in session_json(tree_session(is_err=False), TREE_FUNCS, OFFSET)


def _session(calls: list[Call], chain: list[StackEntry]) -> Session:
    return Session(1, 1, "t", "t", 0, 100, True, chain, [], calls=calls)


def test_the_chain_end_is_the_kernel_rules_origin_over_the_calls() -> None:
    """Trees that tell the rules apart: an error handled by its caller and a later one; an error passed up
    through a void function; the failing call after a failing sibling."""
    ok, einval = 0, EINVAL
    funcs = {**{f.id: f for f in FUNCS}, 4: TracedFunc(4, "void_helper", 0, RetKind.VOID, False)}
    handled = [Call(0, 0, 0, 100, ENOMEM, children=[
        Call(2, 1, 1, 10, ok, children=[Call(1, 2, 2, 5, einval)]),  # map_lookup_elem handled it: not the origin
        Call(3, 1, 20, 30, ENOMEM)])]
    through_void = [Call(0, 0, 0, 100, einval, children=[Call(4, 1, 1, 50, 0, children=[Call(1, 2, 2, 5, einval)])])]
    siblings = [Call(0, 0, 0, 100, ENOMEM, children=[Call(1, 1, 1, 5, einval), Call(3, 1, 6, 9, ENOMEM)])]
    cases = [(handled, [StackEntry(0, ENOMEM, 100), StackEntry(3, ENOMEM, 10)], 3),
             (through_void, [StackEntry(0, einval, 100), StackEntry(4, 0, 49), StackEntry(1, einval, 3)], 1),
             (siblings, [StackEntry(0, ENOMEM, 100), StackEntry(3, ENOMEM, 3)], 3)]
    for calls, chain, want in cases:
        s = _session(calls, chain)
        origin = error_origin(s, funcs)
        assert origin is not None and origin.func_id == origin_from_calls(calls, funcs) == want, (calls, origin)
    assert origin_from_calls(tree_session().calls, TREE_FUNCS) == error_origin(tree_session(), TREE_FUNCS).func_id

"""Histogram bucket ranges per probe set: the kernel's log2 slots merged in user space (underflow into the first
bucket, overflow into +Inf), in the exposition, the OTLP push and the exemplars; the config keys and their
one-line errors."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from retsnoop_otel.agent.config_file import ConfigError, parse_config
from retsnoop_otel.capture.model import FuncStats, RetKind, SessionStats, TracedFunc
from retsnoop_otel.capture.records import DUR_BUCKETS
from retsnoop_otel.export.metrics_push import metrics_request
from retsnoop_otel.metrics.buckets import DurationRange, RangeError, parse_duration_ns, slot_buckets
from retsnoop_otel.metrics.exemplars import ExemplarStore
from retsnoop_otel.metrics.kernel_families import KernelCollector, layout
from tests.fakes import FakeProbeSet, make_registry

FUNCS = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True)}
US_TO_10S = DurationRange(1_000, 10_000_000_000)  # bounds 2^9 ns (512 ns) .. 2^34 ns (17.18 s)


def slots(**at: int) -> tuple[int, ...]:
    """40 kernel slot counts, e.g. slots(s3=2): two durations in [8, 16) ns."""
    out = [0] * DUR_BUCKETS
    for key, n in at.items():
        out[int(key[1:])] = n
    return tuple(out)


def test_durations_and_ranges() -> None:
    assert [parse_duration_ns(t) for t in ("2ns", "1us", "1µs", "1.5ms", "10s", "1m", " 250 ms ")] == [
        2, 1_000, 1_000, 1_500_000, 10_000_000_000, 60_000_000_000, 250_000_000]
    for bad in ("10", "1 parsec", "s", "-1s", ""):
        with pytest.raises(RangeError, match="expected a duration with a unit"):
            parse_duration_ns(bad)
    assert US_TO_10S.exponents == (9, 34) and US_TO_10S.describe() == "512ns..17.18s (27 buckets)"
    assert DurationRange().exponents == (1, 39)  # the kernel's whole layout
    assert DurationRange(1024, 2048).exponents == (10, 11)  # powers of two stay as they are
    for kw, problem in (({"min_ns": 1}, "below the kernel's first bucket bound"),
                        ({"max_ns": 600_000_000_000}, "above the kernel's last bucket bound"),
                        ({"min_ns": 5_000, "max_ns": 5_000}, "must be below max")):
        with pytest.raises(RangeError, match=problem):
            DurationRange(**kw)


def test_default_range_is_the_kernel_layout() -> None:
    bounds, owner = slot_buckets(1, 39, DUR_BUCKETS)
    assert bounds == tuple(range(1, 40)) and owner == tuple(range(40))  # every slot its own bucket
    les, _owner = layout(1, 39, DUR_BUCKETS)  # what a probe set without a range is served
    assert les[0] == "2e-09" and len(les) == 40


def test_slots_below_and_above_the_range_are_merged() -> None:
    bounds, owner = slot_buckets(9, 34, DUR_BUCKETS)
    assert bounds == tuple(range(9, 35))
    assert set(owner[:9]) == {0}  # slots ending at or below 512 ns: the first bucket (underflow)
    assert owner[9] == 1 and owner[33] == 25  # [512, 1024) ns -> le 1.024us; [2^33, 2^34) -> le 2^34 ns
    assert set(owner[34:]) == {26}  # from 2^34 ns on, and the kernel's open slot: +Inf (overflow)


def _text(rng: DurationRange | None, openmetrics: bool = False, store: ExemplarStore | None = None) -> str:
    ps = FakeProbeSet(name="bpf", funcs=FUNCS,
                      stats=lambda: [FuncStats(0, 10, {}, slots(s0=1, s5=2, s9=3, s30=1, s36=2, s39=1), 99)],
                      sessions=[SessionStats(0, 10, 0, slots(s5=2, s12=7, s39=1), 99)])
    reg = make_registry(KernelCollector(lambda: [ps], stats_enabled=lambda: False, duration_range=lambda _n: rng,
                                        exemplars=store.for_histogram if store else None))
    return (generate_openmetrics if openmetrics else generate_latest)(reg).decode()


def _buckets(text: str, family: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(text + ("" if text.endswith("# EOF\n") else "# EOF\n")):
        for s in fam.samples:
            if s.name == family + "_bucket":
                out[s.labels["le"]] = s.value
    return out


def test_exposition_with_a_range_per_probe_set() -> None:
    full = _buckets(_text(None, True), "retsnoop_function_duration_seconds")
    ranged = _buckets(_text(US_TO_10S, True), "retsnoop_function_duration_seconds")
    assert len(full) == 40 and len(ranged) == 27
    assert ranged["5.12e-07"] == 3  # underflow: slots 0 and 5 (below 512 ns)
    assert ranged["1.024e-06"] == 6  # + slot 9, [512, 1024) ns
    assert ranged["2.147483648"] == ranged["17.179869184"] == 7  # + slot 30
    assert ranged["+Inf"] == 10  # + the overflow: slots 36 and 39
    assert full["+Inf"] == ranged["+Inf"] and full["5.12e-07"] == 3  # same counts, fewer series
    text = _text(US_TO_10S)
    assert 'retsnoop_function_duration_seconds_count{function="__x64_sys_bpf",probe_set="bpf"} 10.0' in text
    assert 'retsnoop_function_duration_seconds_sum{function="__x64_sys_bpf",probe_set="bpf"} 9.9e-08' in text
    assert text.count('retsnoop_session_duration_seconds_bucket{') == 27


def test_a_merged_bucket_shows_the_latest_exemplar_of_its_slots() -> None:
    store = ExemplarStore()
    store.record("bpf", "__x64_sys_bpf", 40, 0xA, 2_000_000_000)  # slot 5: underflow bucket
    store.record("bpf", "__x64_sys_bpf", 3, 0xB, 3_000_000_000)  # slot 1: the same bucket, later
    store.record("bpf", "__x64_sys_bpf", 2**38, 0xC, 1_000_000_000)  # slot 38: +Inf
    text = _text(US_TO_10S, openmetrics=True, store=store)
    first = next(line for line in text.splitlines() if 'retsnoop_session_duration_seconds_bucket{' in line
                 and 'le="5.12e-07"' in line)
    assert f'trace_id="{0xB:032x}"' in first
    inf = next(line for line in text.splitlines() if 'retsnoop_session_duration_seconds_bucket{' in line
               and 'le="+Inf"' in line)
    assert f'trace_id="{0xC:032x}"' in inf


def test_otlp_push_carries_the_ranged_bounds() -> None:
    ps = FakeProbeSet(name="bpf", funcs=FUNCS, stats=lambda: [FuncStats(0, 4, {}, slots(s2=1, s10=2, s39=1), 9)])
    collector = KernelCollector(lambda: [ps], stats_enabled=lambda: False, duration_range=lambda _n: US_TO_10S)
    metrics = {m.name: m for m in metrics_request(collector.collect(), {}, 1, 2).resource_metrics[0]
               .scope_metrics[0].metrics}
    (point,) = metrics["retsnoop_function_duration_seconds"].histogram.data_points
    assert list(point.explicit_bounds) == [2**k / 1e9 for k in range(9, 35)]
    assert point.bucket_counts[0] == 1 and point.bucket_counts[2] == 2 and point.bucket_counts[-1] == 1
    assert sum(point.bucket_counts) == point.count == 4


def _exponential_points(duration_range: DurationRange | None, kernel_slots: tuple[int, ...], sum_ns: int) -> list:
    """The function duration pushed with exponential histograms, read back from the bytes on the wire."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    ps = FakeProbeSet(name="bpf", funcs=FUNCS,
                      stats=lambda: [FuncStats(0, sum(kernel_slots), {}, kernel_slots, sum_ns)])
    collector = KernelCollector(lambda: [ps], stats_enabled=lambda: False, duration_range=lambda _n: duration_range)
    wire = metrics_request(collector.collect(), {}, 1, 2, exponential=True).SerializeToString()
    metrics = {m.name: m for m in ExportMetricsServiceRequest.FromString(wire).resource_metrics[0]
               .scope_metrics[0].metrics}
    assert "retsnoop_function_duration_seconds" not in metrics
    metric = metrics["retsnoop_function_duration_nanoseconds"]
    assert metric.unit == "ns" and metric.WhichOneof("data") == "exponential_histogram"
    return list(metric.exponential_histogram.data_points)


def test_an_exponential_histogram_carries_the_kernel_slots_one_for_one() -> None:
    """OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram: scale 0 in
    nanoseconds, bucket index k = the kernel's slot k ([2^k, 2^(k+1)) ns), every slot as it was counted."""
    kernel = slots(s0=1, s3=2, s4=0, s17=5, s39=1)
    (point,) = _exponential_points(None, kernel, 123_456)
    assert (point.scale, point.zero_count, point.count, point.sum) == (0, 0, 9, 123_456.0)
    assert point.positive.offset == 0
    assert list(point.positive.bucket_counts) == list(kernel)  # slot for slot, 0 through the open slot 39
    (ranged,) = _exponential_points(US_TO_10S, slots(s2=1, s10=2, s11=3, s39=1), 5)
    assert ranged.positive.offset == 8  # the underflow (slots up to 8) at the lowest index of the range
    assert list(ranged.positive.bucket_counts)[:4] == [1, 0, 2, 3] and ranged.positive.bucket_counts[-1] == 1
    assert ranged.positive.offset + len(ranged.positive.bucket_counts) - 1 == 34  # the overflow: 2^34 ns on


# ---- configuration -------------------------------------------------------------------------------------------

BASE = """\
probe_sets:
  - name: a
    entry: [x]
    mode: metrics
    duration_range: {a}
  - name: b
    entry: [y]
    mode: metrics
metrics:
  duration_range: {m}
"""


def test_per_probe_set_range_with_a_metrics_wide_default() -> None:
    from retsnoop_otel.runtime.deps import RuntimeDeps
    from retsnoop_otel.runtime.runtime import Runtime
    cfg = parse_config(BASE.format(a="{min: 1us, max: 10s}", m="{max: 1s}"), "agent.yaml")
    assert cfg.runtime.probe_sets[0].duration_range == US_TO_10S and cfg.runtime.probe_sets[1].duration_range is None
    assert cfg.runtime.metrics.duration_range == DurationRange(max_ns=1_000_000_000)
    runtime = Runtime(cfg.runtime, RuntimeDeps())
    assert runtime.metrics.duration_range("a") == US_TO_10S  # its own
    assert runtime.metrics.duration_range("b") == DurationRange(max_ns=1_000_000_000)  # the metrics-wide one


@pytest.mark.parametrize("value,where,problem", [
    ("{min: 1ns}", "probe_sets[0].duration_range.min", "below the kernel's first bucket bound (2ns)"),
    ("{max: 10m}", "probe_sets[0].duration_range.max", "above the kernel's last bucket bound"),
    ("{min: 1s, max: 1ms}", "probe_sets[0].duration_range.min", "must be below max"),
    ("{min: 5}", "probe_sets[0].duration_range.min", "expected a duration with a unit"),
    ("{min: 1 fortnight}", "probe_sets[0].duration_range.min", "expected a duration with a unit"),
    ("{}", "probe_sets[0].duration_range", "give min, max or both"),
    ("{minimum: 1us}", "probe_sets[0].duration_range.minimum", "did you mean 'min'"),
    ("10s", "probe_sets[0].duration_range", "expected a mapping"),
])
def test_range_errors_are_one_line_naming_file_line_and_key(value: str, where: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE.format(a=value, m="{max: 1s}"), "agent.yaml")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"agent.yaml:5: {where}: ") and problem in text, text


def test_metrics_wide_range_errors_name_their_key() -> None:
    with pytest.raises(ConfigError, match=r"^agent.yaml:10: metrics.duration_range.max: max 600s is above"):
        parse_config(BASE.format(a="{min: 1us}", m="{max: 10m}"), "agent.yaml")

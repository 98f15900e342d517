import socket
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import CaptureStats, FuncStats, RetKind, TracedFunc
from retsnoop_otel.export.otlp import ExportStats
from retsnoop_otel.metrics.collector import (
    MetricsCollector,
    MetricsPortInUseError,
    bucket_bounds_seconds,
    make_registry,
    serve_metrics,
)

FUNCS = {
    0: TracedFunc(0, "do_open", 0, RetKind.INT32, True),
    1: TracedFunc(1, "may_open", 0, RetKind.INT32, False),
    2: TracedFunc(2, "may_open", 0, RetKind.INT32, False, module="mod"),  # same name, another instance
}


def func_stats():
    return [
        # durations: 1 call in [2,4) ns, 2 in [8,16) ns; the last (4th) bucket is open-ended
        FuncStats(0, 3, {"EINVAL": 1}, (0, 1, 0, 2), 1_500_000_000),
        FuncStats(1, 4, {"EPERM": 2, "ENOENT": 1}, (0, 0, 4, 0), 40),
        FuncStats(2, 1, {"EPERM": 1}, (1, 0, 0, 0), 1),
    ]


def registry(export=True):
    collector = MetricsCollector("vfs", FUNCS, func_stats,
                                 lambda: CaptureStats(dropped_sessions=2, incomplete_sessions=1, dropped_records=7,
                                                      sessions_started=20, sessions_reported=18),
                                 (lambda: ExportStats(100, {"queue_full": 5, "export_failed": 3}, 1)) if export
                                 else None)
    return make_registry(collector)


EXPECTED = f"""\
# HELP retsnoop_function_calls_total Calls of a traced kernel function
# TYPE retsnoop_function_calls_total counter
retsnoop_function_calls_total{{function="do_open",probe_set="vfs"}} 3.0
retsnoop_function_calls_total{{function="may_open",probe_set="vfs"}} 5.0
# HELP retsnoop_function_errors_total Failing returns of a traced kernel function, by error type
# TYPE retsnoop_function_errors_total counter
retsnoop_function_errors_total{{error_type="EINVAL",function="do_open",probe_set="vfs"}} 1.0
retsnoop_function_errors_total{{error_type="ENOENT",function="may_open",probe_set="vfs"}} 1.0
retsnoop_function_errors_total{{error_type="EPERM",function="may_open",probe_set="vfs"}} 3.0
# HELP retsnoop_function_duration_seconds Duration of traced kernel function calls
# TYPE retsnoop_function_duration_seconds histogram
retsnoop_function_duration_seconds_bucket{{function="do_open",le="2e-09",probe_set="vfs"}} 0.0
retsnoop_function_duration_seconds_bucket{{function="do_open",le="4e-09",probe_set="vfs"}} 1.0
retsnoop_function_duration_seconds_bucket{{function="do_open",le="8e-09",probe_set="vfs"}} 1.0
retsnoop_function_duration_seconds_bucket{{function="do_open",le="+Inf",probe_set="vfs"}} 3.0
retsnoop_function_duration_seconds_count{{function="do_open",probe_set="vfs"}} 3.0
retsnoop_function_duration_seconds_sum{{function="do_open",probe_set="vfs"}} 1.5
retsnoop_function_duration_seconds_bucket{{function="may_open",le="2e-09",probe_set="vfs"}} 1.0
retsnoop_function_duration_seconds_bucket{{function="may_open",le="4e-09",probe_set="vfs"}} 1.0
retsnoop_function_duration_seconds_bucket{{function="may_open",le="8e-09",probe_set="vfs"}} 5.0
retsnoop_function_duration_seconds_bucket{{function="may_open",le="+Inf",probe_set="vfs"}} 5.0
retsnoop_function_duration_seconds_count{{function="may_open",probe_set="vfs"}} 5.0
retsnoop_function_duration_seconds_sum{{function="may_open",probe_set="vfs"}} 4.1e-08
# HELP retsnoop_sessions_dropped_total Sessions lost in the kernel (sessions map full or end record lost)
# TYPE retsnoop_sessions_dropped_total counter
retsnoop_sessions_dropped_total 2.0
# HELP retsnoop_sessions_incomplete_total Sessions that lost per-call records or had mismatched exits
# TYPE retsnoop_sessions_incomplete_total counter
retsnoop_sessions_incomplete_total 1.0
# HELP retsnoop_records_lost_total Per-call records lost in the kernel (ring buffer full)
# TYPE retsnoop_records_lost_total counter
retsnoop_records_lost_total 7.0
# HELP retsnoop_sessions_started_total Entry-function sessions started
# TYPE retsnoop_sessions_started_total counter
retsnoop_sessions_started_total 20.0
# HELP retsnoop_sessions_reported_total Sessions sent to user space
# TYPE retsnoop_sessions_reported_total counter
retsnoop_sessions_reported_total 18.0
# HELP retsnoop_spans_exported_total Spans accepted by the OTLP endpoint
# TYPE retsnoop_spans_exported_total counter
retsnoop_spans_exported_total 100.0
# HELP retsnoop_spans_dropped_total Spans not exported, by cause
# TYPE retsnoop_spans_dropped_total counter
retsnoop_spans_dropped_total{{cause="export_failed"}} 3.0
retsnoop_spans_dropped_total{{cause="queue_full"}} 5.0
# HELP retsnoop_export_errors_total Failed OTLP export requests
# TYPE retsnoop_export_errors_total counter
retsnoop_export_errors_total 1.0
# HELP retsnoop_build_info retsnoop-otel version
# TYPE retsnoop_build_info gauge
retsnoop_build_info{{version="{__version__}"}} 1.0
"""


def test_exposition_text_exact():
    assert generate_latest(registry()).decode() == EXPECTED


def test_openmetrics_exposition():
    text = generate_openmetrics(registry()).decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE retsnoop_function_calls counter\n" in text
    assert 'retsnoop_function_calls_total{function="may_open",probe_set="vfs"} 5.0\n' in text
    assert 'retsnoop_function_duration_seconds_bucket{function="do_open",le="4e-09",probe_set="vfs"} 1.0\n' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the strict parser accepts it
    hist = families["retsnoop_function_duration_seconds"]
    assert hist.type == "histogram"
    buckets = [s for s in hist.samples if s.name.endswith("_bucket") and s.labels["function"] == "may_open"]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
    assert families["retsnoop_spans_dropped"].type == "counter"


def test_no_export_stats_reports_zero():
    text = generate_latest(registry(export=False)).decode()
    assert "retsnoop_spans_exported_total 0.0\n" in text and "retsnoop_export_errors_total 0.0\n" in text
    assert "retsnoop_spans_dropped_total{" not in text


def test_reads_happen_at_scrape_time():
    calls = {"n": 0}

    def stats():
        calls["n"] += 1
        return [FuncStats(0, calls["n"], {}, (1,), 1)]

    reg = make_registry(MetricsCollector("p", FUNCS, stats, CaptureStats))
    assert calls["n"] == 0
    generate_latest(reg)
    text = generate_latest(reg).decode()
    assert 'retsnoop_function_calls_total{function="do_open",probe_set="p"} 2.0' in text


def test_kernel_bucket_bounds():
    bounds = bucket_bounds_seconds(40)
    assert len(bounds) == 40 and bounds[0] == "2e-09" and bounds[-1] == "+Inf"
    assert float(bounds[-2]) == 2**39 / 1e9  # bucket 38 ends at 2^39 ns; bucket 39 is open-ended


def test_serve_metrics_over_http_and_port_in_use():
    reg = registry()
    server, thread = serve_metrics(0, reg, addr="127.0.0.1")
    try:
        port = server.server_port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert body == EXPECTED
        with pytest.raises(MetricsPortInUseError, match=f"127.0.0.1:{port}.*already in use") as info:
            serve_metrics(port, reg, addr="127.0.0.1")
        assert info.value.port == port
    finally:
        server.shutdown()
        server.server_close()
    thread.join(5)
    with socket.socket() as s:  # the listener is gone (REUSEADDR only skips TIME_WAIT leftovers)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_session_outcomes_and_duration_per_entry_function():
    from retsnoop_otel.capture.model import SessionStats
    from retsnoop_otel.metrics.collector import MetricsCollector, make_registry

    funcs = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True)}
    buckets = [0] * 40
    buckets[10] = 3  # [1024, 2048) ns
    buckets[20] = 1  # [~1 ms, ~2 ms)
    coll = MetricsCollector("bpf", funcs, func_stats=list, capture_stats=CaptureStats,
                            session_stats=lambda: [SessionStats(0, 4, 1, tuple(buckets), 3 * 1500 + 1_500_000)])
    text = generate_latest(make_registry(coll)).decode()
    assert 'retsnoop_sessions_total{entry_function="__x64_sys_bpf",outcome="error",probe_set="bpf"} 1.0' in text
    assert 'retsnoop_sessions_total{entry_function="__x64_sys_bpf",outcome="success",probe_set="bpf"} 3.0' in text
    assert ('retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="2.048e-06",'
            'probe_set="bpf"} 3.0') in text
    assert 'retsnoop_session_duration_seconds_count{entry_function="__x64_sys_bpf",probe_set="bpf"} 4.0' in text


def _bounded(bounds, stats):
    from retsnoop_otel.metrics.collector import SeriesLimiter
    limiter = SeriesLimiter(bounds)
    box = {"stats": stats}
    reg = make_registry(MetricsCollector("vfs", FUNCS, lambda: box["stats"], CaptureStats, limiter=limiter))
    return reg, box


def _errors(reg):
    text = generate_latest(reg).decode()
    return sorted(line for line in text.splitlines() if line.startswith("retsnoop_function_errors_total"))


def test_error_types_capped_per_function_and_stable_across_scrapes():
    from retsnoop_otel.metrics.collector import SeriesBounds
    reg, box = _bounded(SeriesBounds(max_error_types=1), [FuncStats(1, 9, {"EPERM": 3, "ENOENT": 1}, (0,), 0)])
    assert _errors(reg) == [
        'retsnoop_function_errors_total{error_type="EPERM",function="may_open",probe_set="vfs"} 3.0',
        'retsnoop_function_errors_total{error_type="other",function="may_open",probe_set="vfs"} 1.0']
    # ENOENT overtakes EPERM later: the series keep their identity (no counter would appear to reset)
    box["stats"] = [FuncStats(1, 99, {"EPERM": 4, "ENOENT": 50, "EFAULT": 2}, (0,), 0)]
    assert _errors(reg) == [
        'retsnoop_function_errors_total{error_type="EPERM",function="may_open",probe_set="vfs"} 4.0',
        'retsnoop_function_errors_total{error_type="other",function="may_open",probe_set="vfs"} 52.0']


def test_function_allow_list_folds_the_rest_into_other():
    from retsnoop_otel.metrics.collector import SeriesBounds
    reg, _ = _bounded(SeriesBounds(functions=("do_*",)), func_stats())
    text = generate_latest(reg).decode()
    assert 'retsnoop_function_calls_total{function="do_open",probe_set="vfs"} 3.0' in text
    assert 'retsnoop_function_calls_total{function="other",probe_set="vfs"} 5.0' in text
    assert "may_open" not in text
    assert 'retsnoop_function_errors_total{error_type="EPERM",function="other",probe_set="vfs"} 3.0' in text
    assert 'retsnoop_function_duration_seconds_count{function="other",probe_set="vfs"} 5.0' in text


def test_unbounded_by_default():
    from retsnoop_otel.metrics.collector import SeriesBounds
    reg, _ = _bounded(SeriesBounds(), func_stats())

    def functions(r):
        return [x for x in generate_latest(r).decode().splitlines() if x.startswith("retsnoop_function_")]
    assert functions(reg) == functions(registry(export=False))


def test_openmetrics_exposition_exact():
    """OpenMetrics: the same samples; counter families are named without _total in HELP/TYPE; # EOF ends it."""
    import re
    want = re.sub(r"^# (HELP|TYPE) (\w+)_total ", r"# \1 \2 ", EXPECTED, flags=re.M) + "# EOF\n"
    assert generate_openmetrics(registry()).decode() == want

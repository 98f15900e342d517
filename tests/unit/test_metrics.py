"""The metric families, composed the way the runtime composes them, checked down to the exposition bytes."""

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import FuncStats, RetKind, SessionStats, TracedFunc
from retsnoop_otel.metrics.buckets import FIRST_EXP, LAST_EXP
from retsnoop_otel.metrics.kernel_families import layout
from retsnoop_otel.metrics.series import SeriesBounds, SeriesLimiter
from tests.fakes import FakeProbeSet, metrics_registry, vfs_func_stats

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
# HELP retsnoop_sessions_total Entry-function sessions by outcome (error: the entry function returned an error)
# TYPE retsnoop_sessions_total counter
# HELP retsnoop_session_duration_seconds Duration of entry-function sessions
# TYPE retsnoop_session_duration_seconds histogram
# HELP retsnoop_error_origins_total Failing entry-function sessions by the function their error started in (the deepest function of the error chain, the stack view's '!' row) and the error it returned; every failing session, sampled, exported or not
# TYPE retsnoop_error_origins_total counter
# HELP retsnoop_bpf_program_runs_total Runs of retsnoop's BPF programs (kernel bpf_stats; only while kernel.bpf_stats_enabled=1)
# TYPE retsnoop_bpf_program_runs_total counter
# HELP retsnoop_bpf_program_run_seconds_total Time spent in retsnoop's BPF programs (kernel bpf_stats; only while kernel.bpf_stats_enabled=1)
# TYPE retsnoop_bpf_program_run_seconds_total counter
# HELP retsnoop_sessions_dropped_total Sessions lost in the kernel (sessions map full or end record lost)
# TYPE retsnoop_sessions_dropped_total counter
retsnoop_sessions_dropped_total{{probe_set="vfs"}} 2.0
# HELP retsnoop_sessions_incomplete_total Sessions that lost per-call records or had mismatched exits
# TYPE retsnoop_sessions_incomplete_total counter
retsnoop_sessions_incomplete_total{{probe_set="vfs"}} 1.0
# HELP retsnoop_records_lost_total Per-call records lost in the kernel (ring buffer full)
# TYPE retsnoop_records_lost_total counter
retsnoop_records_lost_total{{probe_set="vfs"}} 7.0
# HELP retsnoop_sessions_started_total Entry-function sessions started
# TYPE retsnoop_sessions_started_total counter
retsnoop_sessions_started_total{{probe_set="vfs"}} 20.0
# HELP retsnoop_sessions_reported_total Sessions sent to user space
# TYPE retsnoop_sessions_reported_total counter
retsnoop_sessions_reported_total{{probe_set="vfs"}} 18.0
# HELP retsnoop_workload_counts_dropped_total Calls and sessions left out of the per-workload counts (the kernel's per-cgroup map was full)
# TYPE retsnoop_workload_counts_dropped_total counter
retsnoop_workload_counts_dropped_total{{probe_set="vfs"}} 0.0
# HELP retsnoop_error_origins_dropped_total Failing sessions left out of retsnoop_error_origins_total (the kernel's origin map was full)
# TYPE retsnoop_error_origins_dropped_total counter
retsnoop_error_origins_dropped_total{{probe_set="vfs"}} 0.0
# HELP retsnoop_attached_functions Kernel functions attached, by probe set and attach mode
# TYPE retsnoop_attached_functions gauge
retsnoop_attached_functions{{mode="kprobe_multi",probe_set="vfs"}} 3.0
# HELP retsnoop_sessions_not_exported_total Sessions captured but not exported, by reason (sampled: successful session not sampled; sampled_error: error session not sampled, still counted by origin; filtered: error filter)
# TYPE retsnoop_sessions_not_exported_total counter
retsnoop_sessions_not_exported_total{{probe_set="vfs",reason="sampled"}} 4.0
retsnoop_sessions_not_exported_total{{probe_set="vfs",reason="sampled_error"}} 0.0
retsnoop_sessions_not_exported_total{{probe_set="vfs",reason="filtered"}} 1.0
# HELP retsnoop_sessions_evicted_total Half-assembled sessions dropped in user space because too many threads had one open at once
# TYPE retsnoop_sessions_evicted_total counter
retsnoop_sessions_evicted_total{{probe_set="vfs"}} 0.0
# HELP retsnoop_spans_exported_total Spans accepted by the exporters
# TYPE retsnoop_spans_exported_total counter
retsnoop_spans_exported_total 100.0
# HELP retsnoop_spans_dropped_total Spans not exported, by cause
# TYPE retsnoop_spans_dropped_total counter
retsnoop_spans_dropped_total{{cause="export_failed"}} 3.0
retsnoop_spans_dropped_total{{cause="queue_full"}} 5.0
# HELP retsnoop_export_errors_total Failed export requests
# TYPE retsnoop_export_errors_total counter
retsnoop_export_errors_total 1.0
# HELP retsnoop_traces_total Traces handed to the exporters, by probe set, the service.name of their spans and their status (error, ok); a probe set's services beyond metrics.max_workloads count as other
# TYPE retsnoop_traces_total counter
# HELP retsnoop_session_errors_total Sessions that could not be turned into spans
# TYPE retsnoop_session_errors_total counter
retsnoop_session_errors_total 0.0
# HELP retsnoop_config_reloads_total Config reloads (SIGHUP or a change of the file) by result
# TYPE retsnoop_config_reloads_total counter
retsnoop_config_reloads_total{{result="success"}} 0.0
retsnoop_config_reloads_total{{result="failure"}} 0.0
# HELP retsnoop_agent_up 1 while retsnoop-otel runs
# TYPE retsnoop_agent_up gauge
retsnoop_agent_up 1.0
# HELP retsnoop_bpf_stats_enabled 1 while the kernel counts BPF program runs and run time (sysctl kernel.bpf_stats_enabled)
# TYPE retsnoop_bpf_stats_enabled gauge
retsnoop_bpf_stats_enabled 0.0
# HELP retsnoop_build_info retsnoop-otel version
# TYPE retsnoop_build_info gauge
retsnoop_build_info{{version="{__version__}"}} 1.0
"""


def test_exposition_text_exact():
    assert generate_latest(metrics_registry()).decode() == EXPECTED


def test_openmetrics_exposition():
    text = generate_openmetrics(metrics_registry()).decode()
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


def test_several_probe_sets_share_each_family_once():
    text = generate_latest(metrics_registry(sets=[FakeProbeSet(), FakeProbeSet(name="net")])).decode()
    assert text.count("# TYPE retsnoop_function_calls_total counter") == 1
    assert 'retsnoop_function_calls_total{function="do_open",probe_set="net"} 3.0' in text
    assert 'retsnoop_records_lost_total{probe_set="vfs"} 7.0' in text
    assert text.count("retsnoop_build_info{") == 1


def test_no_export_stats_reports_zero():
    text = generate_latest(metrics_registry(export=False)).decode()
    assert "retsnoop_spans_exported_total 0.0\n" in text and "retsnoop_export_errors_total 0.0\n" in text
    assert "retsnoop_spans_dropped_total{" not in text


def test_reads_happen_at_scrape_time():
    calls = {"n": 0}

    def stats():
        calls["n"] += 1
        return [FuncStats(0, calls["n"], {}, (1,), 1)]

    sets = []
    reg = metrics_registry(sets=sets)  # described while empty: no map is read before the first scrape
    sets.append(FakeProbeSet(name="p", stats=stats))
    assert calls["n"] == 0
    generate_latest(reg)
    text = generate_latest(reg).decode()
    assert 'retsnoop_function_calls_total{function="do_open",probe_set="p"} 2.0' in text


def test_kernel_bucket_bounds():
    bounds, _owner = layout(FIRST_EXP, LAST_EXP, 40)  # the kernel's own layout: every slot a bucket
    assert len(bounds) == 40 and bounds[0] == "2e-09" and bounds[-1] == "+Inf"
    assert float(bounds[-2]) == 2**39 / 1e9  # bucket 38 ends at 2^39 ns; bucket 39 is open-ended


def test_session_outcomes_and_duration_per_entry_function():
    funcs = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True)}
    buckets = [0] * 40
    buckets[10] = 3  # [1024, 2048) ns
    buckets[20] = 1  # [~1 ms, ~2 ms)
    ps = FakeProbeSet(name="bpf", funcs=funcs, stats=list,
                      sessions=[SessionStats(0, 4, 1, tuple(buckets), 3 * 1500 + 1_500_000)])
    text = generate_latest(metrics_registry(sets=[ps])).decode()
    assert 'retsnoop_sessions_total{entry_function="__x64_sys_bpf",outcome="error",probe_set="bpf"} 1.0' in text
    assert 'retsnoop_sessions_total{entry_function="__x64_sys_bpf",outcome="success",probe_set="bpf"} 3.0' in text
    assert ('retsnoop_session_duration_seconds_bucket{entry_function="__x64_sys_bpf",le="2.048e-06",'
            'probe_set="bpf"} 3.0') in text
    assert 'retsnoop_session_duration_seconds_count{entry_function="__x64_sys_bpf",probe_set="bpf"} 4.0' in text


def _bounded(bounds, stats):
    limiter = SeriesLimiter(bounds)
    box = {"stats": stats}
    return metrics_registry(sets=[FakeProbeSet(stats=lambda: box["stats"])], limiter=lambda _name: limiter), box


def _errors(reg):
    text = generate_latest(reg).decode()
    return sorted(line for line in text.splitlines() if line.startswith("retsnoop_function_errors_total"))


def test_error_types_capped_per_function_and_stable_across_scrapes():
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
    reg, _ = _bounded(SeriesBounds(functions=("do_*",)), vfs_func_stats())
    text = generate_latest(reg).decode()
    assert 'retsnoop_function_calls_total{function="do_open",probe_set="vfs"} 3.0' in text
    assert 'retsnoop_function_calls_total{function="other",probe_set="vfs"} 5.0' in text
    assert "may_open" not in text
    assert 'retsnoop_function_errors_total{error_type="EPERM",function="other",probe_set="vfs"} 3.0' in text
    assert 'retsnoop_function_duration_seconds_count{function="other",probe_set="vfs"} 5.0' in text


def test_unbounded_by_default():
    reg, _ = _bounded(SeriesBounds(), vfs_func_stats())

    def functions(r):
        return [x for x in generate_latest(r).decode().splitlines() if x.startswith("retsnoop_function_")]
    assert functions(reg) == functions(metrics_registry(export=False))


def test_openmetrics_exposition_exact():
    """OpenMetrics: the same samples; counter families are named without _total in HELP/TYPE; # EOF ends it."""
    import re
    want = re.sub(r"^# (HELP|TYPE) (\w+)_total ", r"# \1 \2 ", EXPECTED, flags=re.M) + "# EOF\n"
    assert generate_openmetrics(metrics_registry()).decode() == want

"""Self-metrics for the cost of our BPF programs (bpf_stats), with fake readers.

The real read (BPF_OBJ_GET_INFO_BY_FD on attached programs) is tested in tests/native/test_bpf_stats.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from retsnoop_otel.agent.main import AgentCollector
from retsnoop_otel.capture.model import CaptureStats, ProgramStats, RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.tracer import sum_program_stats
from retsnoop_otel.metrics.collector import MetricsCollector, make_registry, read_bpf_stats_enabled

FUNCS = {0: TracedFunc(0, "__x64_sys_bpf", 0, RetKind.SIGNED, True)}
PROGRAMS = [ProgramStats("kmulti_entry", 1200, 1_500_000), ProgramStats("kmulti_exit", 1200, 900_000)]

ENABLED_BLOCK = """\
# HELP retsnoop_bpf_program_runs_total Runs of retsnoop's BPF programs (kernel bpf_stats; only while \
kernel.bpf_stats_enabled=1)
# TYPE retsnoop_bpf_program_runs_total counter
retsnoop_bpf_program_runs_total{probe_set="bpf",program="kmulti_entry"} 1200.0
retsnoop_bpf_program_runs_total{probe_set="bpf",program="kmulti_exit"} 1200.0
# HELP retsnoop_bpf_program_run_seconds_total Time spent in retsnoop's BPF programs (kernel bpf_stats; only while \
kernel.bpf_stats_enabled=1)
# TYPE retsnoop_bpf_program_run_seconds_total counter
retsnoop_bpf_program_run_seconds_total{probe_set="bpf",program="kmulti_entry"} 0.0015
retsnoop_bpf_program_run_seconds_total{probe_set="bpf",program="kmulti_exit"} 0.0009
# HELP retsnoop_bpf_stats_enabled 1 while the kernel counts BPF program runs and run time (sysctl \
kernel.bpf_stats_enabled)
# TYPE retsnoop_bpf_stats_enabled gauge
retsnoop_bpf_stats_enabled 1.0
"""


def proc_root(tmp_path: Path, value: str | None) -> str:
    """A fake / with proc/sys/kernel/bpf_stats_enabled holding `value` (None: no such file)."""
    if value is not None:
        sysctl = tmp_path / "proc/sys/kernel/bpf_stats_enabled"
        sysctl.parent.mkdir(parents=True)
        sysctl.write_text(value)
    return str(tmp_path)


def test_read_bpf_stats_enabled(tmp_path: Path) -> None:
    assert read_bpf_stats_enabled(proc_root(tmp_path / "on", "1\n")) is True
    assert read_bpf_stats_enabled(proc_root(tmp_path / "off", "0\n")) is False
    assert read_bpf_stats_enabled(proc_root(tmp_path / "none", None)) is False  # kernel without the sysctl


def test_program_families_while_stats_are_enabled() -> None:
    coll = MetricsCollector("bpf", FUNCS, list, CaptureStats, program_stats=lambda: PROGRAMS,
                            stats_enabled=lambda: True)
    text = generate_latest(make_registry(coll)).decode()
    assert ENABLED_BLOCK in text
    families = {f.name: f for f in text_string_to_metric_families(generate_openmetrics(make_registry(coll)).decode())}
    assert families["retsnoop_bpf_program_run_seconds"].type == "counter"


def test_program_families_have_no_samples_and_nothing_is_read_while_stats_are_disabled() -> None:
    reads = []

    def programs() -> list[ProgramStats]:
        reads.append(1)
        return PROGRAMS

    coll = MetricsCollector("bpf", FUNCS, list, CaptureStats, program_stats=programs, stats_enabled=lambda: False)
    text = generate_latest(make_registry(coll)).decode()
    assert "# TYPE retsnoop_bpf_program_runs_total counter\n" in text
    assert "retsnoop_bpf_program_runs_total{" not in text and "retsnoop_bpf_program_run_seconds_total{" not in text
    assert "retsnoop_bpf_stats_enabled 0.0\n" in text
    assert reads == []  # no syscall per program fd when the counters stand still anyway
    text_string_to_metric_families(generate_openmetrics(make_registry(coll)).decode())  # still valid OpenMetrics


def test_no_program_families_without_a_program_reader() -> None:
    text = generate_latest(make_registry(MetricsCollector("bpf", FUNCS, list, CaptureStats))).decode()
    assert "retsnoop_bpf_program" not in text and "retsnoop_bpf_stats_enabled" not in text


def test_fentry_clones_are_summed_per_template() -> None:
    infos = {10: lb.ProgInfo(run_cnt=5, run_time_ns=500), 11: lb.ProgInfo(run_cnt=5, run_time_ns=700),
             12: lb.ProgInfo(run_cnt=2, run_time_ns=100), 13: lb.ProgInfo(run_cnt=3, run_time_ns=90)}
    clones = [("fexit_exit", 10), ("fentry_entry", 11), ("fexit_exit", 12), ("fentry_entry", 13)]
    assert sum_program_stats(clones, infos.__getitem__) == [ProgramStats("fexit_exit", 7, 600),
                                                            ProgramStats("fentry_entry", 8, 790)]


def _agent(*names: str) -> SimpleNamespace:
    sets = [SimpleNamespace(name=n, funcs=FUNCS, mode="kprobe_multi", attached=1, evicted=0, sampled_out=0,
                            filtered_out=0,
                            tracer=SimpleNamespace(func_stats=list, capture_stats=CaptureStats, session_stats=list,
                                                   program_stats=lambda n=n: [ProgramStats("kmulti_entry",
                                                                                           len(n), 1000)]))
            for n in names]
    return SimpleNamespace(_lock=threading.Lock(), series_limiter=lambda _name: None, probe_sets=sets, outputs=None,
                           emit_errors=0, reloads={"success": 0, "failure": 0})


def test_agent_labels_runs_per_probe_set_and_reports_the_sysctl_once(tmp_path: Path) -> None:
    agent = _agent("bpf", "vfs_reads")
    text = generate_latest(make_registry(AgentCollector(agent, proc_root(tmp_path, "1\n")))).decode()
    assert 'retsnoop_bpf_program_runs_total{probe_set="bpf",program="kmulti_entry"} 3.0\n' in text
    assert 'retsnoop_bpf_program_runs_total{probe_set="vfs_reads",program="kmulti_entry"} 9.0\n' in text
    assert 'retsnoop_bpf_program_run_seconds_total{probe_set="vfs_reads",program="kmulti_entry"} 1e-06\n' in text
    assert text.count("retsnoop_bpf_stats_enabled") == 3  # HELP, TYPE and one unlabelled sample
    assert "retsnoop_bpf_stats_enabled 1.0\n" in text


def test_agent_without_bpf_stats(tmp_path: Path) -> None:
    text = generate_latest(make_registry(AgentCollector(_agent("bpf"), proc_root(tmp_path, "0\n")))).decode()
    assert "retsnoop_bpf_stats_enabled 0.0\n" in text
    assert "retsnoop_bpf_program_runs_total{" not in text

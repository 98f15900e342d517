"""Self-metrics for the cost of our BPF programs (bpf_stats), with fake readers.

The real read (BPF_OBJ_GET_INFO_BY_FD on attached programs) is tested in tests/native/test_bpf_stats.py.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from retsnoop_otel.capture.model import ProgramStats, RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf_progs as lb
from retsnoop_otel.kernel.stats_maps import sum_program_stats
from retsnoop_otel.metrics.kernel_families import KernelCollector, read_bpf_stats_enabled
from retsnoop_otel.metrics.runtime_families import RunCounters, RuntimeCollector
from tests.fakes import FakeProbeSet, make_registry

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


class WithPrograms(FakeProbeSet):
    def __init__(self, name: str = "bpf", programs=lambda: PROGRAMS) -> None:
        super().__init__(name=name, funcs=FUNCS, stats=list)
        self._programs = programs

    def program_stats(self) -> list[ProgramStats]:
        return self._programs()


def registry(sets: list, enabled: bool) -> object:
    return make_registry(KernelCollector(lambda: sets, stats_enabled=lambda: enabled),
                         RuntimeCollector(RunCounters, stats_enabled=lambda: enabled))


def test_program_families_while_stats_are_enabled() -> None:
    text = generate_latest(registry([WithPrograms()], True)).decode()
    runs = text[text.index("# HELP retsnoop_bpf_program_runs_total"):text.index("# HELP retsnoop_sessions_dropped")]
    stats = text[text.index("# HELP retsnoop_bpf_stats_enabled"):text.index("# HELP retsnoop_build_info")]
    assert runs + stats == ENABLED_BLOCK
    openmetrics = generate_openmetrics(registry([WithPrograms()], True)).decode()
    families = {f.name: f for f in text_string_to_metric_families(openmetrics)}
    assert families["retsnoop_bpf_program_run_seconds"].type == "counter"


def test_program_families_have_no_samples_and_nothing_is_read_while_stats_are_disabled() -> None:
    reads = []

    def programs() -> list[ProgramStats]:
        reads.append(1)
        return PROGRAMS

    text = generate_latest(registry([WithPrograms(programs=programs)], False)).decode()
    assert "# TYPE retsnoop_bpf_program_runs_total counter\n" in text
    assert "retsnoop_bpf_program_runs_total{" not in text and "retsnoop_bpf_program_run_seconds_total{" not in text
    assert "retsnoop_bpf_stats_enabled 0.0\n" in text
    assert reads == []  # no syscall per program fd when the counters stand still anyway
    text_string_to_metric_families(generate_openmetrics(registry([WithPrograms(programs=programs)], False)).decode())


def test_fentry_clones_are_summed_per_template() -> None:
    infos = {10: lb.ProgInfo(run_cnt=5, run_time_ns=500), 11: lb.ProgInfo(run_cnt=5, run_time_ns=700),
             12: lb.ProgInfo(run_cnt=2, run_time_ns=100), 13: lb.ProgInfo(run_cnt=3, run_time_ns=90)}
    clones = [("fexit_exit", 10), ("fentry_entry", 11), ("fexit_exit", 12), ("fentry_entry", 13)]
    assert sum_program_stats(clones, infos.__getitem__) == [ProgramStats("fexit_exit", 7, 600),
                                                            ProgramStats("fentry_entry", 8, 790)]


def test_runs_per_probe_set_and_the_sysctl_once(tmp_path: Path) -> None:
    sets = [WithPrograms(n, lambda n=n: [ProgramStats("kmulti_entry", len(n), 1000)]) for n in ("bpf", "vfs_reads")]
    root = proc_root(tmp_path, "1\n")
    reg = make_registry(KernelCollector(lambda: sets, stats_enabled=lambda: read_bpf_stats_enabled(root)),
                        RuntimeCollector(RunCounters, stats_enabled=lambda: read_bpf_stats_enabled(root)))
    text = generate_latest(reg).decode()
    assert 'retsnoop_bpf_program_runs_total{probe_set="bpf",program="kmulti_entry"} 3.0\n' in text
    assert 'retsnoop_bpf_program_runs_total{probe_set="vfs_reads",program="kmulti_entry"} 9.0\n' in text
    assert 'retsnoop_bpf_program_run_seconds_total{probe_set="vfs_reads",program="kmulti_entry"} 1e-06\n' in text
    assert text.count("retsnoop_bpf_stats_enabled") == 3  # HELP, TYPE and one unlabelled sample
    assert "retsnoop_bpf_stats_enabled 1.0\n" in text

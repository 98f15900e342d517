"""Start-up phases: how old the process is at main(), and `trace -v` saying where the time went.

The trace command runs on the same fakes as the agent lifecycle tests (a KernelEnv over a tiny
kallsyms, scripted tracers): the phase lines come from the real runtime, discovery and command.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.start_path import START_MODULES
from retsnoop_otel.cli import process_age_s
from retsnoop_otel.runtime.startup import Phase, StartClock, format_phases, phase_fields
from retsnoop_otel.trace.main import run_trace
from tests.fakes import World

PHASE = re.compile(r"^Phase (\S+): (\d+) ms(?: \((.*)\))?$")


def test_process_age_from_proc_self_stat(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    ticks = os.sysconf("SC_CLK_TCK")
    boot_s = time.clock_gettime(time.CLOCK_BOOTTIME)
    started = int((boot_s - 2.5) * ticks)
    # the command name may hold spaces and parentheses: fields are counted after its last ')'
    fields = ["S"] + ["0"] * 18 + [str(started)] + ["0"] * 30
    (tmp_path / "proc/self/stat").write_text(f"4242 (python (x) y) {' '.join(fields)}\n")
    age = process_age_s(str(tmp_path))
    assert age is not None and 2.4 <= age <= 2.5 + 60 / ticks
    assert process_age_s(str(tmp_path / "nowhere")) is None
    own = process_age_s()
    assert own is not None and 0 <= own < 3600


def test_fentry_attach_says_how_much_of_it_was_verification() -> None:
    """fentry's attach is mostly the kernel verifying a program pair per function: -v splits it out."""
    from types import SimpleNamespace

    from retsnoop_otel.kernel.tracer import AttachReport
    from retsnoop_otel.runtime.startup import attach_phases

    def ps(mode: str, verify_ms: float) -> SimpleNamespace:
        return SimpleNamespace(name="s", load_s=0.25, attached=1036, mode=mode,
                               report=AttachReport(attach_ms=52_816, verify_ms=verify_ms))

    assert [p.detail for p in attach_phases([ps("fentry", 31_200.4)])][1] == \
        "1036 functions, fentry, 31.2 s of it verifying a program pair per function"
    assert [p.detail for p in attach_phases([ps("kprobe", 0.0)])][1] == "1036 functions, kprobe"
    report = AttachReport(attach_ms=142)
    report.syscall_entries = 347  # the syscall preset's entries, started at the tracepoints
    preset = SimpleNamespace(name="s", load_s=0.7, attached=1445, mode="kprobe_session", report=report)
    assert [p.detail for p in attach_phases([preset])][1] == \
        "1445 functions, kprobe_session, 347 syscall entries at the sys_enter and sys_exit tracepoints"


def test_phase_lines_and_log_fields() -> None:
    phases = [Phase("python", 1.2345, "interpreter"), Phase("load", 0.5), Phase("attach", 0.25, "21 functions"),
              Phase("attach", 0.5, "second set")]
    assert format_phases(phases) == ["Phase python: 1234 ms (interpreter)", "Phase load: 500 ms",
                                     "Phase attach: 250 ms (21 functions)", "Phase attach: 500 ms (second set)"]
    assert phase_fields(phases) == {"python_ms": 1234.5, "load_ms": 500.0, "attach_ms": 750.0}
    assert StartClock(0.0, None).before_main() == []
    assert StartClock(0.0, 1.5).before_main() == [Phase("python", 1.5, "interpreter start and imports before main")]


def _phases(text: str) -> list[tuple[str, int, str]]:
    return [(m.group(1), int(m.group(2)), m.group(3) or "") for line in text.splitlines() if (m := PHASE.match(line))]


def test_verbose_dry_run_says_where_the_time_went() -> None:
    out, err = io.StringIO(), io.StringIO()
    rc = run_trace(["-v", "--dry-run", "-e", "*sys_bpf", "-a", "array_map_alloc_check"], out, err,
                   World().deps(), started=StartClock(time.monotonic() - 0.2, 1.75))
    assert rc == 0
    phases = _phases(err.getvalue())
    assert [p[0] for p in phases] == ["python", "imports", "flags", "inputs", "symbols", "discovery", "other",
                                      "dry-run"]
    assert phases[0][1] == 1750 and phases[4] == ("symbols", 250, "cached")  # what the environment measured
    assert phases[5][2] == "3 functions"  # __x64_sys_bpf, __sys_bpf, array_map_alloc_check
    assert phases[7][1] >= 200  # main() began 0.2 s before run_trace
    # "other" is what the listed phases leave of main() to the end (each line rounds to 1 ms; the fake
    # environment's symbols phase is longer than the run, so here it is nothing)
    assert abs(phases[6][1] - max(0, phases[7][1] - sum(p[1] for p in phases[1:6]))) <= 6
    assert "Receiving data" not in out.getvalue()


def test_verbose_trace_prints_phases_before_receiving_data_and_after_detaching(world: World) -> None:
    out, err = io.StringIO(), io.StringIO()
    old = signal.getsignal(signal.SIGTERM)
    stopper = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    stopper.start()
    try:
        rc = run_trace(["-v", "-e", "*sys_bpf", "-a", "array_map_alloc_check"], out, err, world.deps(),
                       started=StartClock(time.monotonic(), None))
    finally:
        stopper.cancel()
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert rc == 0
    names = [p[0] for p in _phases(err.getvalue())]
    # no "python" phase when /proc could not say; start phases, then the shutdown's after "Detaching..."
    assert names == ["imports", "flags", "inputs", "symbols", "discovery", "load", "attach", "outputs", "other",
                     "ready", "detach", "drain", "flush"]
    attach = next(p for p in _phases(err.getvalue()) if p[0] == "attach")
    assert attach[2] == "3 functions, kprobe"
    assert out.getvalue().startswith("Receiving data...\n") and "Detaching... DONE in" in out.getvalue()


@pytest.mark.parametrize("argv", [["--dry-run", "-e", "*sys_bpf"]])
def test_without_verbose_no_phase_lines(argv: list[str]) -> None:
    err = io.StringIO()
    assert run_trace(argv, io.StringIO(), err, World().deps()) == 0
    assert "Phase " not in err.getvalue()


def test_the_trace_command_starts_without_the_exporters_and_metrics_libraries() -> None:
    """Imports are the largest phase of `trace` under emulation: what only OTLP export, /metrics or the
    agent's log bridge need is imported when they are used."""
    import subprocess
    import sys
    heavy = ("grpc", "google.protobuf", "opentelemetry", "prometheus_client", "logging", "platform", "socket",
             "uuid", "yaml", "ssl", "http.server")
    code = ("import sys, retsnoop_otel.cli, retsnoop_otel.trace.main; "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []


def test_the_start_path_imports_neither_dataclasses_nor_inspect() -> None:
    """dataclasses pulls inspect, ast, dis and tokenize: 0.5 s of a 3 s start under emulation."""
    code = f"import sys, importlib\nfor m in {START_MODULES!r}: importlib.import_module(m)\n" \
           "print(sorted({'dataclasses', 'inspect'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"

"""Inputs are expanded once (issue 44 point 3): `@file` globs, -n/-N name files and -J spec files become values where
the flags or the agent's YAML are parsed, and injected probes are resolved against the kernel once, with the probe
set's functions. One start reads each file it names exactly once, whichever command and however many keys or flags
name the file; a reload is a new start and reads them once again.

Every open of a file under the test's directory is counted (os.open, as inputs/files reads, and open()/io.open, as
the -J spec files and the tracefs format files are read), while a whole start runs over the fakes of tests/fakes.py.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.kernel import inject_attach, tracefs
from retsnoop_otel.runtime.requests import Requests
from retsnoop_otel.trace.main import run_trace
from tests.fakes import World

FORMAT = Path(__file__).resolve().parents[1] / "fixtures" / "tracefs" / "events/syscalls/sys_exit_bpf/format"


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Counter[str]]:
    """The test's input files, and a count of the opens of each file under tmp_path from here on. Injected probes
    resolve against a tracefs under tmp_path (its format file counted too), on a kernel said to have BPF cookies."""
    files = {"entry": "# entry functions\n*sys_bpf\n", "allow": "array_map_alloc_check\nbpf_check\n",
             "deny": "vfs_read\n", "funcs": "bpf_*\n", "comms": "bash\nsshd\n",
             "probes": "# the bpf syscall's exit\ntp:syscalls:sys_exit_bpf\nkprobe:bpf_check\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    events = tmp_path / "tracefs" / "events" / "syscalls" / "sys_exit_bpf"
    events.mkdir(parents=True)
    shutil.copy(FORMAT, events / "format")
    monkeypatch.setattr(tracefs, "find_tracefs", lambda _root="/": tmp_path / "tracefs")
    monkeypatch.setattr(inject_attach, "check_kernel", lambda _specs: None)

    opens: Counter[str] = Counter()
    under = str(tmp_path) + os.sep

    def count(path: object) -> None:
        try:
            name = os.fsdecode(os.fspath(path))  # type: ignore[arg-type]
        except TypeError:  # a file descriptor
            return
        if name.startswith(under):
            opens[name[len(under):]] += 1

    real_os_open, real_open, real_io_open = os.open, builtins.open, io.open

    def os_open(path, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202 - os.open's own signature
        count(path)
        return real_os_open(path, *a, **kw)

    def open_(file, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        count(file)
        return real_open(file, *a, **kw)

    def io_open(file, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        count(file)
        return real_io_open(file, *a, **kw)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", io_open)
    return tmp_path, opens


INPUTS = ("entry", "allow", "deny", "funcs", "comms", "probes", "tracefs/events/syscalls/sys_exit_bpf/format")


def test_an_agent_start_and_a_reload_read_each_file_once(inputs: tuple[Path, Counter[str]], world: World) -> None:
    d, opens = inputs
    config = d / "agent.yaml"
    config.write_text(f"""\
probe_sets:
  - name: bpf_errors
    entry: ['@{d}/entry']
    allow: ['@{d}/allow', bpf_prog_load]
    deny: '@{d}/deny'
    filters: {{comms: [bash]}}
    inject: ['@{d}/probes']
  - name: prog_load
    entry: [bpf_prog_load]
    allow: ['@{d}/allow']
    deny: ['@{d}/deny']
    mode: calls
    inject: ['@{d}/probes', 'kprobe:bpf_prog_alloc']
exporter:
  otlp: {{endpoint: "http://127.0.0.1:4318"}}
metrics:
  listen: "127.0.0.1:0"
  functions: ['@{d}/funcs', '@{d}/funcs']
""")
    opens.clear()
    agent = Agent(str(config), world.deps(), EventLog(io.StringIO()))
    try:
        agent.start()
        bpf_errors, prog_load = agent.runtime.probe_sets  # type: ignore[union-attr]
        assert bpf_errors.cfg.entry == ("*sys_bpf",)  # the globs as values: what the files hold
        assert bpf_errors.cfg.allow == ("array_map_alloc_check", "bpf_check", "bpf_prog_load")
        assert prog_load.cfg.deny == ("vfs_read",)
        assert agent.runtime.config.metrics.functions == ("bpf_*", "bpf_*")  # type: ignore[union-attr]
        assert [p.spec.text for p in bpf_errors.probes] == ["tp:syscalls:sys_exit_bpf", "kprobe:bpf_check"]
        assert [p.spec.text for p in prog_load.probes] == ["tp:syscalls:sys_exit_bpf", "kprobe:bpf_check",
                                                           "kprobe:bpf_prog_alloc"]
        # two sets inject the same tracepoint: its format is read once, with the kernel's other facts
        assert opens == {"agent.yaml": 1, "entry": 1, "allow": 1, "deny": 1, "funcs": 1, "probes": 1,
                         "tracefs/events/syscalls/sys_exit_bpf/format": 1}
        opens.clear()
        world.env_loads = 0
        assert agent.reload() is True  # SIGHUP: the config and what it names are read anew, once
        assert world.env_loads == 1  # the kernel cannot say it is unchanged (World.kernel_state): read again too
        assert opens == {"agent.yaml": 1, "entry": 1, "allow": 1, "deny": 1, "funcs": 1, "probes": 1,
                         "tracefs/events/syscalls/sys_exit_bpf/format": 1}
    finally:
        if agent.runtime is not None:
            agent.runtime.shutdown(0.5)


@pytest.mark.parametrize("mode", [["--dry-run", "-v"], ["-v"], []], ids=["dry-run-v", "v", "attach"])
def test_a_trace_start_reads_each_file_once(inputs: tuple[Path, Counter[str]], monkeypatch: pytest.MonkeyPatch,
                                            mode: list[str]) -> None:
    d, opens = inputs
    monkeypatch.setattr(Requests, "install", lambda self, reload: setattr(self, "stop", True) or self)
    world, out, err = World(), io.StringIO(), io.StringIO()
    opens.clear()
    argv = ["-e", f"@{d}/entry", "-a", f"@{d}/allow", "-a", f"@{d}/allow", "-d", f"@{d}/deny", "-n", f"@{d}/comms",
            "-N", f"@{d}/comms", "-J", f"@{d}/probes", "-J", f"@{d}/probes", *mode]
    assert run_trace(argv, out, err, world.deps(out)) == 0, err.getvalue()
    assert opens == {"entry": 1, "allow": 1, "deny": 1, "comms": 1, "probes": 1,
                     "tracefs/events/syscalls/sys_exit_bpf/format": 1}
    if "--dry-run" in mode:
        assert world.tracers == [] and "Would inject 2 probes:" in out.getvalue()
    else:
        (tracer,) = world.tracers
        assert [p.spec.text for p in tracer.cfg.inject] == ["tp:syscalls:sys_exit_bpf", "kprobe:bpf_check"]
        assert {f.name for f in tracer.funcs} >= {"__x64_sys_bpf", "array_map_alloc_check", "bpf_check"}
        assert "vfs_read" not in {f.name for f in tracer.funcs}


def test_every_input_file_of_the_tests_is_counted(inputs: tuple[Path, Counter[str]]) -> None:
    """The counting itself: each way the inputs are read shows up (so the tests above cannot pass by missing one)."""
    d, opens = inputs
    from retsnoop_otel.capture.inject import read_format, read_spec_file
    from retsnoop_otel.inputs.files import read_text
    read_text(d / "entry", "glob file", 1 << 20, ValueError)
    read_spec_file(str(d / "probes"))
    read_format(d / "tracefs", "syscalls", "sys_exit_bpf")
    assert opens == {"entry": 1, "probes": 1, "tracefs/events/syscalls/sys_exit_bpf/format": 1}
    assert set(opens) < set(INPUTS)

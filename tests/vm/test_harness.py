"""The guest batch runner and its Context, exercised natively on the host (no VM, a few seconds)."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.vm import guest_batch
from tests.vm.guest_batch import Context, Proc, discover, run_batch

FAKE_A = """
from tests.vm.guest_batch import budget

def helper():
    return 1

def scenario_second_defined_first():
    pass

@budget(1)
def scenario_zz_slow(ctx):
    p = ctx.spawn(["sleep", "300"])
    (ctx_out / "slow.pid").write_text(str(p.pid))
    import time
    time.sleep(60)
    return {}

def scenario_ok(ctx):
    p = ctx.spawn(["sleep", "300"])
    return {"series": ctx.kernel_series, "tmpdir": ctx.tmpdir, "left_running": p.pid, "obj": object()}

def scenario_raises(ctx):
    raise ValueError("boom in the guest")

def scenario_not_a_dict(ctx):
    return [1]
"""

FAKE_B = """
from tests.vm.guest_batch import Context as scenario_imported_not_ours

def scenario_b(ctx):
    rc, out, err = ctx.run("echo out; echo err >&2; exit 3", timeout=30)
    return {"rc": rc, "out": out, "err": err}
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture
def fake_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    name = f"fakescen_{request.node.name.replace('[', '_').replace(']', '_')}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a_first.py").write_text(f"from pathlib import Path\nctx_out = Path({str(tmp_path)!r})\n" + FAKE_A)
    (pkg / "b_second.py").write_text(FAKE_B)
    (pkg / "_private.py").write_text("def scenario_hidden(ctx):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RETSNOOP_OTEL_KERNEL_SERIES", "6.12")
    return name


def test_discover_orders_by_file_then_definition(fake_pkg: str) -> None:
    found = discover(fake_pkg, default_budget=42)
    assert [s.name for s in found] == ["second_defined_first", "zz_slow", "ok", "raises", "not_a_dict", "b"]
    assert {s.name: s.budget_s for s in found}["zz_slow"] == 1
    assert {s.name: s.budget_s for s in found}["ok"] == 42


def test_discover_rejects_duplicate_names(fake_pkg: str, tmp_path: Path) -> None:
    (tmp_path / fake_pkg / "c_third.py").write_text("def scenario_ok(ctx):\n    return {}\n")
    with pytest.raises(ValueError, match="'ok' defined in both"):
        discover(fake_pkg)


def test_batch_isolates_failures_and_enforces_budgets(fake_pkg: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    scenarios = [s for s in discover(fake_pkg) if s.name != "second_defined_first"]
    start = time.monotonic()
    summary = run_batch(scenarios, out, release="test-release")
    assert time.monotonic() - start < 30
    statuses = {n: s["status"] for n, s in summary["scenarios"].items()}
    assert statuses == {"zz_slow": "timeout", "ok": "ok", "raises": "error", "not_a_dict": "error", "b": "ok"}
    assert json.loads((out / guest_batch.SUMMARY_FILE).read_text()) == summary
    assert summary["release"] == "test-release"

    ok = json.loads((out / "ok.json").read_text())
    assert ok["series"] == "6.12" and Path(ok["tmpdir"]).is_dir() and ok["obj"].startswith("<object")
    assert not _alive(ok["left_running"])  # cleaned up after the scenario returned
    assert not _alive(int((tmp_path / "slow.pid").read_text()))  # killed with the over-budget scenario
    assert "budget of 1 s" in json.loads((out / "zz_slow.json").read_text())["error"]
    assert "ValueError: boom in the guest" in json.loads((out / "raises.json").read_text())["error"]
    assert "expected dict" in json.loads((out / "not_a_dict.json").read_text())["error"]
    assert json.loads((out / "b.json").read_text()) == {"rc": 3, "out": "out\n", "err": "err\n"}


def test_proc_wait_for_line_consumes_lines(tmp_path: Path) -> None:
    script = "import time\nprint('start target', flush=True)\ntime.sleep(0.5)\nprint('ready', flush=True)\n" \
             "time.sleep(0.5)\nprint('target 42', flush=True)\ntime.sleep(30)\n"
    proc = Proc([sys.executable, "-c", script], None, str(tmp_path))
    try:
        assert proc.wait_for_line(r"ready", timeout=20)
        m = proc.wait_for_line(r"target (\d+)", timeout=20)  # not the 'start target' line before 'ready'
        assert m.group(1) == "42"
        assert proc.wait_output_settled(0.5, timeout=10)
        assert proc.output() == "start target\nready\ntarget 42\n"
        with pytest.raises(TimeoutError, match="no match within"):
            proc.wait_for_line(r"never", timeout=0.5)
    finally:
        assert proc.terminate(timeout=10) == -signal.SIGTERM


def test_proc_exit_before_match_and_env(tmp_path: Path) -> None:
    proc = Proc("echo $EXTRA_VAR; echo oops >&2; exit 7", {"EXTRA_VAR": "from-env"}, str(tmp_path))
    with pytest.raises(TimeoutError, match=r"process exited \(7\)"):
        proc.wait_for_line(r"never", timeout=20)
    assert proc.output() == "from-env\noops\n"
    assert proc.returncode == 7


def test_proc_settle_reports_busy_output(tmp_path: Path) -> None:
    proc = Proc([sys.executable, "-c", "import time\nwhile True:\n    print('x', flush=True)\n    time.sleep(0.05)"],
                None, str(tmp_path))
    try:
        assert proc.wait_for_line("x", timeout=20)
        assert proc.wait_output_settled(1.0, timeout=1.5) is False
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL


def test_terminate_escalates_to_kill(tmp_path: Path) -> None:
    proc = Proc([sys.executable, "-c", textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('armed', flush=True)
        time.sleep(60)
    """)], None, str(tmp_path))
    proc.wait_for_line("armed", timeout=20)
    assert proc.terminate(timeout=0.5) == -signal.SIGKILL


def test_context_run_timeout_and_env(tmp_path: Path) -> None:
    ctx = Context("t", str(tmp_path), env={"RETSNOOP_OTEL_KERNEL_SERIES": "6.1", "RETSNOOP_OTEL_VMLINUX": "/x"})
    assert (ctx.kernel_series, ctx.vmlinux) == ("6.1", "/x")
    assert Context("t", str(tmp_path), env={}).vmlinux is None
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        ctx.run("echo partial; sleep 30", timeout=0.5)

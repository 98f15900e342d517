"""The guest batch runner and its Context, exercised natively on the host (no VM, a few seconds); and the
host side's reading of a guest kernel crash (tests/vm/guest_crash.py) from recorded consoles."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.vm import batch_lines, guest_batch, guest_crash, guest_stall
from tests.vm.guest_batch import Context, Proc, discover, run_batch

CRASHES = Path(__file__).resolve().parents[1] / "fixtures" / "guest_crash"

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


# --- guest kernel crashes -------------------------------------------------------------------------------------------
# 7.2-user_funcs.out: tests/vm/run's output of a real 7.2 boot under TCG (scenario output left out): the first attempt
# died while booting (Oops: int3 in sched_clock_cpu) and tests/vm/run booted again; the second ran the batch until an
# Oops: int3 in __schedule, at the start of user_funcs. 7.2-user_funcs.console: the end of that attempt's console.log.
# 6.1-sysrq.*: the same from tests/vm/test_crash_drill.py's first boot (a panic on purpose, in crash_drill).
OUT_72 = (CRASHES / "7.2-user_funcs.out").read_text()
CONSOLE_72 = (CRASHES / "7.2-user_funcs.console").read_bytes().decode()  # CRLF kept
ORDER_72 = [p.name for line in guest_crash.last_boot(OUT_72).splitlines()
            if (p := batch_lines.parse(line)) and p.started]  # the scenarios the attempt started, in order


def _vm_output(batch: str, console: str | None, release: str = "6.1.0-56-amd64") -> str:
    """A tests/vm/run output: one attempt, the batch's lines, then an exit code or (console given) a VM that
    stopped without one and its console tail."""
    end = "tests/vm/run: command exited 0; VM ran 30 s\n" if console is None else \
        f"tests/vm/run: VM stopped after 30 s while running the command without an exit code; last console lines:\n" \
        f"{console}"
    return f"tests/vm/run: booting {release} (TCG), timeout 1000 s\n[vm] {release} x86_64, 2 CPUs, up 9 s\n{batch}{end}"


def test_a_crash_is_found_in_the_console_tail_with_the_scenario_it_hit() -> None:
    crash = guest_crash.detect(OUT_72)
    assert crash is not None
    assert (crash.line, crash.scenario, crash.release) == ("Oops: int3: 0000 [#1] SMP NOPTI", "user_funcs",
                                                           "7.2.13+deb14-amd64")
    assert (crash.rip, crash.comm) == ("__schedule+0x2a7/0x1070", "kworker/u8:4")
    assert crash.headline == "Oops: int3: 0000 [#1] SMP NOPTI (RIP __schedule+0x2a7/0x1070, in kworker/u8:4)"
    assert crash.during == "during scenario 'user_funcs'"
    lines = crash.excerpt.splitlines()
    # from the Oops to the end of its report, then (the register dump printed again left out) the panic
    assert lines[0] == "[ 1602.131234] Oops: int3: 0000 [#1] SMP NOPTI"
    assert lines[-3:] == ["[ 1602.137884] ---[ end trace 0000000000000000 ]---", "[...]",
                          "[ 1602.138695] Kernel panic - not syncing: Fatal exception in interrupt"]
    assert " schedule+0x27/0xa0" in crash.excerpt and "virtme" not in crash.excerpt


def test_the_whole_console_is_read_when_there_is_one() -> None:
    """console.log (CRLF line ends, as QEMU's serial port writes them) holds what the 60-line tail may cut off."""
    assert "\r\n" in CONSOLE_72
    crash = guest_crash.detect(OUT_72, CONSOLE_72)
    assert crash == guest_crash.detect(OUT_72)
    assert "\r" not in crash.excerpt
    # the tail of a report longer than 60 lines has lost its first line: the console file still has it
    cut = OUT_72[:OUT_72.index("[ 1602.131234] Oops")] + OUT_72[OUT_72.index("[ 1602.133702]"):]
    assert guest_crash.detect(cut).line == "Kernel panic - not syncing: Fatal exception in interrupt"
    assert guest_crash.detect(cut, CONSOLE_72).line == "Oops: int3: 0000 [#1] SMP NOPTI"


def test_a_crash_before_the_last_attempt_is_over() -> None:
    """The first attempt's boot crash is tests/vm/run's business (it booted again): it is listed as such and never
    taken for the crash of the last attempt."""
    (boot,) = guest_crash.boot_crashes(OUT_72)
    assert (boot.line, boot.scenario, boot.rip, boot.comm) == ("Oops: int3: 0000 [#2] SMP NOPTI", None,
                                                               "sched_clock_cpu+0x9/0x230", "swapper/0")
    assert boot.during == "before any scenario started"
    last = guest_crash.last_boot(OUT_72)
    assert "Oops: int3: 0000 [#2]" not in last and guest_crash.running_scenario(last) == "user_funcs"
    ran = OUT_72[:OUT_72.rindex("[batch] user_funcs: start")] + "[batch] done in 1600.0 s; not ok: none\n" \
        "tests/vm/run: command exited 0; VM ran 1613 s\n"
    assert guest_crash.detect(ran) is None and len(guest_crash.boot_crashes(ran)) == 1


def test_only_a_crash_boots_again_and_only_for_the_scenarios_without_an_outcome() -> None:
    statuses = {n: {"status": "ok"} for n in ORDER_72}
    statuses["agent_faults"] = {"status": "error"}  # failed: has its outcome, never runs again
    statuses["agent_ready"] = {"status": "timeout"}
    order = [*ORDER_72, "user_stack_wait", "wheel_install"]
    assert order.index("user_funcs") == len(ORDER_72) - 1
    del statuses["user_funcs"]
    crash, again = guest_crash.assess(order, statuses, OUT_72)
    assert crash is not None and crash.scenario == "user_funcs"
    assert again == ["user_funcs", "user_stack_wait", "wheel_install"]
    # the same scenarios left without a crash in the console (the VM timed out, QEMU was killed): no new boot
    quiet = OUT_72[:OUT_72.index("[ 1602.131234]")]
    assert guest_crash.assess(order, statuses, quiet) == (None, [])
    # a crash in a batch that finished every scenario leaves nothing to run
    assert guest_crash.assess(ORDER_72, {n: {"status": "ok"} for n in ORDER_72}, OUT_72, CONSOLE_72) == (None, [])


def test_a_panic_without_an_oops() -> None:
    """6.1.0-56-amd64 panicked by `echo c > /proc/sysrq-trigger` (recorded by tests/vm/test_crash_drill.py): no Oops
    and no kernel RIP (the one in the dump is user space's, 0033:), the panic line leads."""
    out = (CRASHES / "6.1-sysrq.out").read_text()
    console = (CRASHES / "6.1-sysrq.console").read_bytes().decode()
    for crash in (guest_crash.detect(out), guest_crash.detect(out, console)):
        assert crash is not None
        assert (crash.line, crash.scenario, crash.release) == ("Kernel panic - not syncing: sysrq triggered crash",
                                                               "crash_drill", "6.1.0-56-amd64")
        assert crash.headline == "Kernel panic - not syncing: sysrq triggered crash (in python)"
        assert " sysrq_handle_crash+0x16/0x20" in crash.excerpt
        assert len(crash.excerpt.splitlines()) == guest_crash.MAX_EXCERPT
    assert guest_crash.assess(["crash_drill_before", "crash_drill", "crash_drill_after"],
                              {"crash_drill_before": {"status": "ok"}}, out, console)[1] == ["crash_drill",
                                                                                            "crash_drill_after"]


@pytest.mark.parametrize(("console", "line"), [
    ("[   12.5] BUG: kernel NULL pointer dereference, address: 0000000000000008\n"
     "[   12.6] #PF: supervisor read access\n[   12.7] Oops: 0000 [#1] PREEMPT SMP NOPTI\n",
     "BUG: kernel NULL pointer dereference, address: 0000000000000008"),
    ("[   40.0] int3: 0000 [#1] SMP NOPTI\n[   40.0] RIP: 0010:__schedule+0x2a7/0x1070\n",  # before 6.9: no "Oops:"
     "int3: 0000 [#1] SMP NOPTI"),
    ("[    3.0] general protection fault, probably for non-canonical address 0xdead000000000122: 0000 [#1] SMP\n",
     "general protection fault, probably for non-canonical address 0xdead000000000122: 0000 [#1] SMP"),
    ("[    3.0] kernel BUG at mm/slub.c:435!\n", "kernel BUG at mm/slub.c:435!"),
    ("[   21.0] Unable to handle kernel NULL pointer dereference at virtual address 0000000000000008\n"
     "[   21.0] Internal error: Oops: 0000000096000004 [#1] PREEMPT SMP\n",  # arm64
     "Unable to handle kernel NULL pointer dereference at virtual address 0000000000000008"),
    ("[   70.0] BUG: soft lockup - CPU#1 stuck for 23s! [python:301]\n[   90.0] BUG: workqueue lockup - pool cpus=0\n",
     None),  # watchdog reports: the kernel goes on
    ("[    9.0] virtme-ng-init: starting script\n", None),
])
def test_crash_lines(console: str, line: str | None) -> None:
    crash = guest_crash.detect(_vm_output("[batch] smoke: start (budget 300 s)\n", console))
    assert (crash.line if crash else None) == line
    if crash:
        assert crash.scenario == "smoke" and crash.release == "6.1.0-56-amd64"
        assert crash.excerpt.splitlines()[0].endswith(line)


def test_crash_words_in_the_batch_output_are_not_a_crash() -> None:
    """Only the console counts: a scenario printing 'BUG:' or 'Kernel panic' is not the kernel crashing."""
    batch = "[batch] a: start (budget 60 s)\nBUG: the scenario's own words\nKernel panic - not syncing: quoted\n"
    assert guest_crash.detect(_vm_output(batch, "[    9.0] virtme-ng-init: starting script\n")) is None
    assert guest_crash.detect(_vm_output(batch, None)) is None
    done = batch + "[batch] a: ok in 3.0 s\n[batch] b: start (budget 60 s)\n"
    crash = guest_crash.detect(_vm_output(done, "[   50.0] Kernel panic - not syncing: Fatal exception\n"))
    assert crash is not None and crash.scenario == "b"
    before = _vm_output("[batch] 2 scenarios, discovered in 7.0 s\n", "[    5.0] Oops: int3: 0000 [#1] SMP NOPTI\n")
    assert guest_crash.detect(before).scenario is None


def test_a_crash_before_the_first_scenario_is_told_from_one_between_scenarios() -> None:
    """Only a crash before the attempt's batch started a scenario is one nothing of ours can have caused
    (tests/vm/conftest.py boots again after it without using up the fresh boot a scenario crash gets)."""
    oops = "[    5.0] Oops: int3: 0000 [#1] SMP NOPTI\n"
    for batch in ("", "[batch] 2 scenarios, discovered in 7.0 s\n"):  # booting; the batch getting ready
        crash = guest_crash.detect(_vm_output(batch, oops))
        assert crash.before_scenarios and (crash.scenario, crash.after) == (None, None)
        assert crash.during == "before any scenario started"
    between = guest_crash.detect(_vm_output("[batch] a: start (budget 60 s)\n[batch] a: ok in 3.0 s\n", oops))
    assert not between.before_scenarios and (between.scenario, between.after) == (None, "a")
    assert between.during == "after scenario 'a', before the next one started"
    during = guest_crash.detect(_vm_output("[batch] a: start (budget 60 s)\n", oops))
    assert not during.before_scenarios and (during.scenario, during.after) == ("a", None)
    (boot,) = guest_crash.boot_crashes(OUT_72)  # tests/vm/run's first attempt of the recorded run
    assert boot.before_scenarios and guest_crash.attempts(OUT_72) == 2


def test_the_batch_progress_lines_read_back_as_printed() -> None:
    assert batch_lines.parse(batch_lines.start("soak", 1800)) == batch_lines.Progress("soak", True, budget_s=1800)
    assert batch_lines.parse(batch_lines.end("soak", "timeout", 1800.04)) == \
        batch_lines.Progress("soak", False, status="timeout")
    for other in ("[batch] 2 scenarios, discovered in 0.1 s", "[batch] done in 9.0 s; not ok: none", "[soak] start"):
        assert batch_lines.parse(other) is None


def test_a_silent_guest_is_stopped_after_its_scenarios_budget_and_the_margin() -> None:
    stall = guest_stall.Stall(boot_s=60, margin_s=0.5, poll_s=0.1)
    stall.saw("[batch] 2 scenarios, discovered in 0.1 s\n")
    assert stall.allowed_s == 60  # still booting: the boot's margin
    stall.saw("[batch] soak: start (budget 1 s)\n")
    assert (stall.scenario, stall.allowed_s) == ("soak", 1.0)
    stall.saw("[soak] a line of its own\n")
    assert stall.allowed_s == 1.0
    proc = subprocess.Popen(["sleep", "60"])
    t0 = time.monotonic()
    stall.watch(proc)
    assert proc.wait(10) == -signal.SIGTERM
    assert time.monotonic() - t0 >= 1.4  # its budget and the margin, from its last line
    assert "no output for" in stall.why and "(soak;" in stall.why


def test_a_guest_between_scenarios_may_not_be_silent_beyond_the_margin() -> None:
    stall = guest_stall.Stall(boot_s=600, margin_s=0.3, poll_s=0.1)
    stall.saw("[batch] soak: start (budget 900 s)\n")
    stall.saw("[batch] soak: ok in 3.0 s\n")
    assert (stall.scenario, stall.allowed_s) == ("after soak", 0.0)
    proc = subprocess.Popen(["sleep", "60"])
    stall.watch(proc)
    assert proc.wait(10) == -signal.SIGTERM and "after soak" in stall.why


def test_a_guest_that_ends_is_not_stopped() -> None:
    stall = guest_stall.Stall(boot_s=0, margin_s=0, poll_s=0.05)
    proc = subprocess.Popen(["true"])
    proc.wait()
    stall.done.set()
    stall.watch(proc)
    assert stall.why == ""


def test_a_guest_that_ignores_the_stop_is_killed_after_the_grace() -> None:
    stall = guest_stall.Stall(boot_s=0, margin_s=0.2, poll_s=0.1, grace_s=0.5)
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                             "print('ignoring', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ignoring\n"
    stall.saw("ignoring\n")
    stall.watch(proc)
    assert proc.wait(10) == -signal.SIGKILL and "booting" in stall.why
    proc.stdout.close()

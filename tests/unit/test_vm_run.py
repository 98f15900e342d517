"""tests/vm/run boots again when the guest died before the command started, and only then; the VM fixtures
(tests/vm/conftest.py) boot once more after a guest kernel crash, and only then: once after crashes during a
scenario, again after each one before any scenario, within MAX_BOOTS boots in all.

A fake `vng` stands in for virtme-ng: it plays a guest that dies while booting (no out.log, no exit code),
one that runs the command (out.log, then rc), or one that dies while the command runs.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import subprocess
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "vm" / "run"



def _args(**given: object) -> argparse.Namespace:
    """tests/vm/run's parsed arguments: no network forwards or hostname unless given."""
    return argparse.Namespace(**{"hostname": None, "forward_to_host": [], "forward_from_host": [], "disk": [], **given})

def _load():
    loader = importlib.machinery.SourceFileLoader("vm_run", str(RUN))
    spec = importlib.util.spec_from_loader("vm_run", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture()
def vm_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    module = _load()
    boots = tmp_path / "boots"
    plan = tmp_path / "plan"  # one word per boot: die | ok | crash

    def fake_vng(vmlinuz: Path, guest, rwdir: Path, cpus: int, *network) -> list[str]:
        return ["sh", "-c", f"""
            n=$(( $(cat {boots} 2>/dev/null || echo 0) + 1 )); echo $n > {boots}
            what=$(sed -n "${{n}}p" {plan})
            echo "[ 1.77] booting, attempt $n"
            case $what in
              ok) echo hello > {rwdir}/out.log; echo 0 > {rwdir}/rc ;;
              crash) echo started > {rwdir}/out.log ;;
              *) echo "Kernel panic - not syncing: Fatal exception in interrupt" ;;
            esac"""]

    monkeypatch.setattr(module, "vng_command", fake_vng)
    monkeypatch.setattr(module, "fetch_kernel", lambda series, dbg: (tmp_path / "vmlinuz-6.12.0", "6.12.0"))
    monkeypatch.setattr(module, "ensure_host_modules", lambda kdir, release: None)
    monkeypatch.setattr(module, "precompile", lambda: None)
    args = _args(kernel="6.12", dbg=False, cpus=2, timeout=60.0, rwdir=None, command=["true"],
                 boot_attempts=module.BOOT_ATTEMPTS)

    def run(*outcomes: str, attempts: int = module.BOOT_ATTEMPTS) -> tuple[int, int]:
        plan.write_text("\n".join(outcomes) + "\n")
        boots.unlink(missing_ok=True)
        args.boot_attempts = attempts
        rc = module.run_vm(args, tmp_path / "rw")
        return rc, int(boots.read_text())

    return module, run


def test_a_guest_that_died_booting_is_booted_once_more(vm_run, capsys: pytest.CaptureFixture[str]) -> None:
    _module, run = vm_run
    assert run("die", "ok") == (0, 2)
    err = capsys.readouterr().err
    assert "died while booting, before the command started: booting once more" in err
    assert "Kernel panic" in err  # the first boot's console tail is still shown


def test_twice_dead_while_booting_is_a_failure(vm_run) -> None:
    module, run = vm_run
    assert run("die", "die", "ok") == (module.EXIT_NO_RC, 2)


def test_a_command_that_started_is_never_run_twice(vm_run) -> None:
    module, run = vm_run
    assert run("crash", "ok") == (module.EXIT_NO_RC, 1)
    assert run("ok", "ok") == (0, 1)
    assert run("crash", "ok", attempts=3) == (module.EXIT_NO_RC, 1)


def test_boot_attempts_bounds_the_boots(vm_run) -> None:
    """tests/vm/conftest.py says how many boots a call may still make (its MAX_BOOTS counts these too)."""
    module, run = vm_run
    assert module.BOOT_ATTEMPTS == 2
    assert run("die", "ok", attempts=1) == (module.EXIT_NO_RC, 1)
    assert run("die", "die", "ok", attempts=3) == (0, 3)
    assert run("die", "die", "die", "ok", attempts=3) == (module.EXIT_NO_RC, 3)
    assert module.parse_args(["--boot-attempts", "3", "--", "true"]).boot_attempts == 3
    assert module.parse_args(["--", "true"]).boot_attempts == module.BOOT_ATTEMPTS
    with pytest.raises(SystemExit):
        module.parse_args(["--boot-attempts", "0", "--", "true"])


def test_the_guest_binds_the_repo_python_and_cache_from_the_cached_export(tmp_path: Path) -> None:
    module = _load()
    trees = module.cached_trees()
    assert trees[0] == module.REPO
    assert any((t / "bin").is_dir() and t != module.REPO for t in trees)  # the venv's base Python
    if Path("/usr/bin/python3").exists():  # and Debian's, which the benches run ours under (start_compare --python)
        assert Path("/usr/bin/python3").resolve() in trees
        assert any(t.name.startswith("python3.") and (t / "os.py").is_file() for t in trees)
    args = _args(kernel="6.12", command=["true"])
    script = module.guest_script(args, module.Guest("amd64", module.REPO, tmp_path / "rw"), tmp_path / "rw", None)
    assert f"cache=loose {module.CACHED_TAG} {module.CACHED_MOUNT}" in script
    assert f"mount --bind {module.CACHED_MOUNT}{module.REPO} {module.REPO}" in script
    # the shell's working directory is taken again from the cached mount, after the binds
    assert script.index(f"mount --bind {module.CACHED_MOUNT}{module.REPO}") < script.rindex(f"cd {module.REPO}")
    vng = " ".join(module.vng_command(Path("vmlinuz"), module.Guest("amd64", module.REPO, tmp_path), tmp_path, 1))
    assert f"mount_tag={module.CACHED_TAG}" in vng and "--cpus 1" in vng


def test_a_read_write_folder_inside_a_cached_tree_keeps_that_tree_uncached(tmp_path: Path) -> None:
    """The bind would hide the read-write mount under it (the guest could not write its results)."""
    module = _load()
    args = _args(kernel="6.12", command=["true"])
    rw = module.REPO / "build" / "rw"
    script = module.guest_script(args, module.Guest("amd64", module.REPO, rw), rw, None)
    assert f"mount --bind {module.CACHED_MOUNT}{module.REPO} " not in script


def test_an_arm64_guest_boots_its_own_root_and_sees_host_paths_where_they_are_mounted(tmp_path: Path) -> None:
    """Emulated arm64: the Debian arm64 root, the repo and the shared folder at fixed guest paths, the aarch64
    package before the repo's tests, and the command's host paths rewritten to the guest's."""
    module = _load()
    guest = module.Guest("arm64", Path("/mnt/repo"), Path("/mnt/rw"), tmp_path / "root")
    host_rw = tmp_path / "rw"
    args = _args(kernel="7.2-arm64", command=["python", "-m", "tests.vm.guest_batch", "--out",
                                                          str(host_rw / "results")])
    script = module.guest_script(args, guest, host_rw, None)
    assert "python -m tests.vm.guest_batch --out /mnt/rw/results" in script, script
    assert "export PYTHONPATH=/mnt/repo/build/arm64-site:/mnt/repo" in script and "PYTHONSAFEPATH=1" in script
    assert str(module.VENV_BIN) not in script and module.CACHED_MOUNT not in script
    assert "> /mnt/rw/out.log" in script and "\ncd / || exit 1\n" in script
    vng = module.vng_command(Path("vmlinuz"), guest, host_rw, 2)
    assert vng[vng.index("--arch") + 1] == "arm64" and vng[vng.index("--root") + 1] == str(tmp_path / "root")
    assert f"/mnt/repo={module.REPO}" in vng and f"/mnt/rw={host_rw}" in vng and "--disable-kvm" in vng
    assert "--qemu-opts=-cpu max,pauth-impdef=on" in vng


OOPS = ("[ 1602.131234] Oops: int3: 0000 [#1] SMP NOPTI\n"
        "[ 1602.133702] CPU: 1 UID: 0 PID: 411 Comm: kworker/u8:4 Not tainted 7.2.13+deb14-amd64 #1 PREEMPT(lazy)\n"
        "[ 1602.135403] RIP: 0010:__schedule+0x2a7/0x1070\n"
        "[ 1602.137884] ---[ end trace 0000000000000000 ]---\n"
        "[ 1602.138695] Kernel panic - not syncing: Fatal exception in interrupt\n")
QUIET = "[    9.0] virtme-ng-init: starting script (console fallback)\n"
BOOT_OOPS = ("[    2.474970] Oops: int3: 0000 [#2] SMP NOPTI\n"  # the recorded 7.2 crash while booting
             "[    2.475161] RIP: 0010:sched_clock_cpu+0x9/0x230\n"
             "[    2.475234] CPU: 1 UID: 0 PID: 1 Comm: swapper/0 Tainted: G      D             7.2.13+deb14-amd64 #1\n"
             "[    2.475577] Kernel panic - not syncing: Fatal exception in interrupt\n")
BOOT_CRASH = (None, BOOT_OOPS)  # a boot that died before the command started


def _boots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *plan: tuple[dict[str, str] | None, str | None]):
    """VmBatches whose boots are scripted, one (statuses the boot ends with, console or None) per boot: a boot
    writes those scenarios' results, prints their [batch] lines and, with a console, starts the next scenario it
    was given and stops without an exit code (that console in tests/vm/run's output and in console.log); with
    the statuses None, it stops before the batch started, and tests/vm/run boots again by itself (the next boot
    of the plan, in the same call) while the call's boot attempts allow. `boots` gets the scenarios each boot was
    given, `batches.calls` the boot attempts each call of tests/vm/run was allowed."""
    import json
    from types import SimpleNamespace

    from tests.vm import conftest as vm_conftest
    from tests.vm import guest_batch

    scenarios = [SimpleNamespace(name=n, module=f"tests.vm.scenarios.{n}", budget_s=10, peers=())
                 for n in ("a", "b", "c")]
    monkeypatch.setattr(guest_batch, "discover", lambda: scenarios)
    monkeypatch.setattr(vm_conftest.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "rw"))
    monkeypatch.setattr(vm_conftest, "CRASH_LOG", tmp_path / "test-logs" / "guest-crashes.txt")
    (tmp_path / "rw").mkdir()
    boots: list[list[str]] = []
    calls: list[int] = []

    def boot_once(self, series, wanted, rwdir, results, attempts):
        calls.append(attempts)
        out = ""
        for attempt in range(1, attempts + 1):
            rc, out = boot(wanted, rwdir, results, out)
            if rc is not None:
                break
            if attempt < attempts:
                out += "tests/vm/run: the guest died while booting, before the command started: booting once more\n"
        (rwdir / "batch.log").write_text(out)
        return 125 if rc is None else rc, out

    def boot(wanted, rwdir, results, out):
        """One boot: (its exit code or None: died before the command started, the output so far)."""
        assert len(boots) < len(plan), f"boot {len(boots) + 1} is not in the plan"
        statuses, console = plan[len(boots)]
        boots.append([s.name for s in wanted])
        (rwdir / "console.log").unlink(missing_ok=True)
        out += "tests/vm/run: booting 7.2.13+deb14-amd64 (TCG), timeout 100 s\n"
        if statuses is None:
            (rwdir / "console.log").write_text(console)
            return None, (out + "tests/vm/run: VM stopped after 9 s before the command started (boot failure?) "
                          f"without an exit code; last console lines:\n{console}")
        for name, status in statuses.items():
            results.mkdir(exist_ok=True)
            (results / f"{name}.json").write_text(json.dumps({"n": name} if status == "ok" else {"error": "boom"}))
            summary = json.loads((results / guest_batch.SUMMARY_FILE).read_text()) \
                if (results / guest_batch.SUMMARY_FILE).exists() and name != next(iter(statuses)) else {}
            summary = {"release": "7.2.13+deb14-amd64",
                       "scenarios": {**summary.get("scenarios", {}), name: {"status": status, "seconds": 1.0}}}
            (results / guest_batch.SUMMARY_FILE).write_text(json.dumps(summary))
            out += f"[batch] {name}: start (budget 10 s)\n[batch] {name}: {status} in 1.0 s\n"
        if console is None:
            return 0, out + "tests/vm/run: command exited 0; VM ran 30 s\n"
        if len(statuses) < len(wanted):
            out += f"[batch] {wanted[len(statuses)].name}: start (budget 10 s)\n"
        (rwdir / "console.log").write_text(console)
        return 125, (out + "tests/vm/run: VM stopped after 30 s while running the command without an exit code; "
                     f"last console lines:\n{console}")

    monkeypatch.setattr(vm_conftest.VmBatches, "_boot_once", boot_once)
    batches = vm_conftest.VmBatches(None, {"7.2": {"a", "b", "c"}}, parallel=False)
    batches._say = lambda line: None
    batches.calls = calls
    return batches, boots


def test_a_guest_kernel_crash_runs_the_crashed_scenario_and_those_after_it_in_a_fresh_boot(monkeypatch, tmp_path):
    batches, boots = _boots(monkeypatch, tmp_path, ({"a": "ok"}, OOPS), ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["b", "c"]]
    assert {k: v["status"] for k, v in batch.statuses.items()} == {"a": "ok", "b": "ok", "c": "ok"}
    assert batch["b"] == {"n": "b"} and batch.crash is None
    assert "booted again after the guest kernel crashed during scenario 'b'" in batch.log
    # still reported: the terminal summary's line and build/test-logs/guest-crashes.txt; the crashed boot's logs kept
    (line,) = batches.crashes
    assert line == ("kernel 7.2 (7.2.13+deb14-amd64): guest kernel crashed during scenario 'b': Oops: int3: 0000 [#1] "
                    "SMP NOPTI (RIP __schedule+0x2a7/0x1070, in kworker/u8:4); recovered: a fresh boot ran the "
                    "scenarios left")
    log = (tmp_path / "test-logs" / "guest-crashes.txt").read_text()
    assert line in log and "    [ 1602.138695] Kernel panic - not syncing: Fatal exception in interrupt" in log
    assert (tmp_path / "rw" / "batch-crashed.log").exists() and (tmp_path / "rw" / "console-crashed.log").exists()


def test_a_failed_scenario_is_never_run_again(monkeypatch, tmp_path):
    batches, boots = _boots(monkeypatch, tmp_path, ({"a": "error"}, OOPS), ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["b", "c"]]
    with pytest.raises(AssertionError, match="scenario 'a' on 7.2.13\\+deb14-amd64: error"):
        batch["a"]


def test_a_guest_that_stopped_without_a_crash_is_not_booted_again(monkeypatch, tmp_path):
    batches, boots = _boots(monkeypatch, tmp_path, ({"a": "ok"}, QUIET))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"]] and set(batch.statuses) == {"a"} and batch.crash is None
    with pytest.raises(AssertionError, match="scenario 'b' has no result on 7.2 .*tests/vm/run exit 125"):
        batch["b"]
    assert not batches.crashes and not (tmp_path / "test-logs").exists()


def test_a_second_crash_fails_the_crashed_scenario_naming_the_crash_and_the_rest_as_not_run(monkeypatch, tmp_path):
    batches, boots = _boots(monkeypatch, tmp_path, ({"a": "ok"}, OOPS), ({}, OOPS.replace("kworker/u8:4", "python")))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["b", "c"]]  # no third boot
    assert batch["a"] == {"n": "a"}
    with pytest.raises(AssertionError) as crashed:
        batch["b"]
    msg = str(crashed.value)
    assert msg.startswith("the guest kernel crashed during scenario 'b' on 7.2 (7.2.13+deb14-amd64): Oops: int3: 0000 "
                          "[#1] SMP NOPTI (RIP __schedule+0x2a7/0x1070, in python)\n(a first boot had crashed during "
                          "scenario 'b': Oops: int3: 0000 [#1] SMP NOPTI (RIP __schedule+0x2a7/0x1070, in "
                          "kworker/u8:4); this was the fresh boot after it)\n[ 1602.131234] Oops: int3")
    assert "Kernel panic - not syncing: Fatal exception in interrupt\n(tests/vm/run exit 125; logs in" in msg
    with pytest.raises(AssertionError, match="^scenario 'c' on 7.2 \\(7.2.13\\+deb14-amd64\\) not run: the guest "
                                             "kernel crashed during scenario 'b': Oops: int3"):
        batch.raw("c")
    assert [line.rsplit("; ", 1)[1] for line in batches.crashes] == ["the fresh boot crashed too (below)",
                                                                     "NOT recovered (no further boot)"]


def test_crashes_before_any_scenario_boot_again_without_using_up_the_fresh_boot(monkeypatch, tmp_path):
    """tests/vm/run boots again by itself once; when that one dies too, the kernel boots again here, and a later
    crash during a scenario still has its fresh boot: boot crash, boot crash, scenario crash, all results."""
    batches, boots = _boots(monkeypatch, tmp_path, BOOT_CRASH, BOOT_CRASH, ({"a": "ok"}, OOPS),
                            ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["a", "b", "c"], ["a", "b", "c"], ["b", "c"]]
    assert batches.calls == [2, 2, 2]
    assert {k: v["status"] for k, v in batch.statuses.items()} == {"a": "ok", "b": "ok", "c": "ok"}
    assert batch.crash is None and batch.boots == 4 and batch["b"] == {"n": "b"}
    assert [c.during for c in batch.crashes] == ["before any scenario started", "before any scenario started",
                                                 "during scenario 'b'"]
    # every crash is listed, in order, with what followed it
    assert [line.split(": ", 1)[1].split(" (RIP")[0] for line in batches.crashes] == [
        "guest kernel crashed before any scenario started: Oops: int3: 0000 [#2] SMP NOPTI",
        "guest kernel crashed before any scenario started: Oops: int3: 0000 [#2] SMP NOPTI",
        "guest kernel crashed during scenario 'b': Oops: int3: 0000 [#1] SMP NOPTI"]
    assert [line.rsplit("; ", 1)[1] for line in batches.crashes] == [
        "tests/vm/run booted again by itself", "the fresh boot crashed too (below)",
        "recovered: a fresh boot ran the scenarios left"]
    log = (tmp_path / "test-logs" / "guest-crashes.txt").read_text()
    assert all(line in log for line in batches.crashes) and log.count("sched_clock_cpu") == 4  # 2 lines, 2 excerpts
    assert {p.name for p in (tmp_path / "rw").glob("*-crashed*.log")} == {
        "batch-crashed.log", "console-crashed.log", "batch-crashed-2.log", "console-crashed-2.log"}


def test_the_recorded_run_three_boot_crashes_and_a_scenario_crash_is_recovered_in_five_boots(monkeypatch, tmp_path):
    """As the 7.2 run that failed: tests/vm/run's two boots died booting, the next call's first boot too and its
    second crashed in a scenario. The fresh boot for that crash is the fifth boot, the last one allowed: it may not
    boot twice."""
    batches, boots = _boots(monkeypatch, tmp_path, BOOT_CRASH, BOOT_CRASH, BOOT_CRASH, ({"a": "ok"}, OOPS),
                            ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert len(boots) == 5 and boots[-1] == ["b", "c"] and batches.calls == [2, 2, 1]
    assert batch.crash is None and batch.boots == 5 and all(batch[n] == {"n": n} for n in ("a", "b", "c"))
    assert len(batch.crashes) == len(batches.crashes) == 4


def test_a_boot_crash_in_the_fresh_boot_does_not_use_it_up(monkeypatch, tmp_path):
    batches, boots = _boots(monkeypatch, tmp_path, ({"a": "ok"}, OOPS), BOOT_CRASH, BOOT_CRASH,
                            ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["b", "c"], ["b", "c"], ["b", "c"]] and batches.calls == [2, 2, 2]
    assert batch.crash is None and batch["c"] == {"n": "c"}


def test_the_bound_on_boots_ends_crashes_before_any_scenario(monkeypatch, tmp_path):
    """A kernel that dies booting every time: MAX_BOOTS boots, tests/vm/run's own included, then a failure that
    names the crashes and the bound."""
    from tests.vm import conftest as vm_conftest

    assert vm_conftest.MAX_BOOTS == 5
    batches, boots = _boots(monkeypatch, tmp_path, *[BOOT_CRASH] * 5, ({"a": "ok", "b": "ok", "c": "ok"}, None))
    with pytest.raises(RuntimeError) as failed:
        batches._boot("7.2")
    assert len(boots) == 5 and batches.calls == [2, 2, 1]
    msg = str(failed.value)
    assert msg.startswith("VM batch on kernel 7.2 produced no results: the guest kernel crashed before any scenario "
                          "started: Oops: int3: 0000 [#2] SMP NOPTI (RIP sched_clock_cpu+0x9/0x230, in swapper/0); in "
                          "the boot after it, again before any scenario started: Oops: int3")
    assert msg.partition("\n")[0].count("before any scenario started") == 5
    assert "; no further boot: 5 boots, the most one kernel's batch gets\n[    2.474970] Oops: int3" in msg
    assert "(tests/vm/run exit 125, 5 boots, " in msg
    assert batches.crashes[-1].endswith("; NOT recovered (no further boot: 5 boots, the most one kernel's batch gets)")
    assert len(batches.crashes) == 5


def test_a_scenario_crash_when_the_boots_are_spent_fails_naming_the_bound(monkeypatch, tmp_path):
    batches, boots = _boots(monkeypatch, tmp_path, *[BOOT_CRASH] * 4, ({"a": "ok"}, OOPS),
                            ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert len(boots) == 5 and batches.calls == [2, 2, 1] and batch.boots == 5  # no sixth boot
    assert batch["a"] == {"n": "a"}
    with pytest.raises(AssertionError) as crashed:
        batch["b"]
    msg = str(crashed.value)
    assert msg.startswith("the guest kernel crashed during scenario 'b' on 7.2 (7.2.13+deb14-amd64): Oops: int3: 0000 "
                          "[#1] SMP NOPTI (RIP __schedule+0x2a7/0x1070, in kworker/u8:4)\n(an earlier boot had crashed "
                          "before any scenario started: Oops: int3: 0000 [#2] SMP NOPTI (RIP sched_clock_cpu")
    assert msg.count("(an earlier boot had crashed before any scenario started") == 4
    assert "\n(no further boot: 5 boots, the most one kernel's batch gets)\n[ 1602.131234] Oops: int3" in msg
    with pytest.raises(AssertionError) as not_run:
        batch.raw("c")
    assert str(not_run.value).startswith("scenario 'c' on 7.2 (7.2.13+deb14-amd64) not run: the guest kernel crashed "
                                         "during scenario 'b': Oops: int3")
    assert str(not_run.value).endswith("\n(no further boot: 5 boots, the most one kernel's batch gets)")
    assert batches.crashes[-1].endswith("; NOT recovered (no further boot: 5 boots, the most one kernel's batch gets)")


def test_crashes_during_scenarios_get_one_fresh_boot_whatever_boots_are_left(monkeypatch, tmp_path):
    """Boot crashes in between change nothing: the second crash during a scenario is final."""
    batches, boots = _boots(monkeypatch, tmp_path, ({"a": "ok"}, OOPS), BOOT_CRASH, ({}, OOPS),
                            ({"b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert len(boots) == 3 and batch.boots == 3
    with pytest.raises(AssertionError, match="^the guest kernel crashed during scenario 'b' .*\n\\(an earlier boot "
                                             "had crashed during scenario 'b'.*\n\\(an earlier boot had crashed "
                                             "before any scenario started.*\n\\[ 1602.131234\\] Oops"):
        batch["b"]
    assert batches.crashes[-1].endswith("; NOT recovered (no further boot)")


def test_a_crash_tests_vm_run_booted_again_after_is_recorded(monkeypatch, tmp_path):
    """A guest that died booting and came up at tests/vm/run's second attempt: nothing to run again, but listed."""
    batches, boots = _boots(monkeypatch, tmp_path, BOOT_CRASH, ({"a": "ok", "b": "ok", "c": "ok"}, None))
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["a", "b", "c"]] and batches.calls == [2] and batch.crash is None
    assert batch.boots == 2 and len(batch.crashes) == 1
    (line,) = batches.crashes
    assert "crashed before any scenario started: Oops: int3" in line
    assert line.endswith("; tests/vm/run booted again by itself")


def test_tests_vm_run_is_told_how_many_boots_it_may_make(monkeypatch, tmp_path):
    """The command line conftest builds is one tests/vm/run accepts, with the boots left."""
    from types import SimpleNamespace

    from tests.vm import conftest as vm_conftest

    seen: list[list[str]] = []
    monkeypatch.setattr(vm_conftest.subprocess, "Popen", _batch_popen(seen))
    batches = vm_conftest.VmBatches(None, {}, parallel=False)
    batches._say = lambda line: None
    scenario = SimpleNamespace(name="a", module="tests.vm.scenarios.a", budget_s=10, peers=())
    assert batches._boot_once("6.12", [scenario], tmp_path, tmp_path / "results", 1) == (0, "[batch] done\n")
    args = _load().parse_args(seen[0][1:])
    assert args.boot_attempts == 1 and args.kernel == "6.12"


def _batch_popen(seen: list[list[str]], events: list[str] | None = None) -> type:
    """A stand-in for tests/vm/run's process: records its command line (and "run" in `events`), prints the batch's
    last line and exits 0."""

    class Popen:
        def __init__(self, cmd, **kwargs):
            if events is not None:
                events.append("run")
            seen.append(cmd)
            self.stdout, self.returncode = iter(["[batch] done\n"]), 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    return Popen


def test_a_boot_whose_scenario_names_jaeger_forwards_the_guest_to_a_host_jaeger(monkeypatch, tmp_path):
    """peers=("jaeger",): one Jaeger on the host for the boot, the guest's OTLP/HTTP and query ports forwarded to
    its own, stopped once tests/vm/run returns; the guest finds its ends in RETSNOOP_OTEL_TO_HOST."""
    from types import SimpleNamespace

    from tests.peers import jaeger as peers_jaeger
    from tests.vm import conftest as vm_conftest
    from tests.vm import host_forwards

    events: list[str] = []

    class Jaeger:
        def __init__(self, decision_wait: str, sample_percent: int) -> None:
            events.append(f"start {sample_percent}")
            self.ports = {"otlp_http": 40001, "query_http": 40002}

        def stop(self) -> int:
            events.append("stop")
            return 0

    seen: list[list[str]] = []
    Popen = _batch_popen(seen, events)
    monkeypatch.setattr(peers_jaeger, "Jaeger", Jaeger)
    monkeypatch.setattr(vm_conftest.subprocess, "Popen", Popen)
    batches = vm_conftest.VmBatches(None, {}, parallel=False)
    batches._say = lambda line: None
    scenarios = [SimpleNamespace(name="a", module="tests.vm.scenarios.a", budget_s=10, peers=("jaeger",)),
                 SimpleNamespace(name="b", module="tests.vm.scenarios.b", budget_s=10, peers=())]
    assert batches._boot_once("6.12", scenarios, tmp_path, tmp_path / "results", 1) == (0, "[batch] done\n")
    assert events == ["start 100", "run", "stop"]
    args = _load().parse_args(seen[0][1:])
    assert sorted((f.guest_addr, f.guest_port, f.host_port) for f in args.forward_to_host) == [
        ("10.0.2.100", host_forwards.JAEGER_OTLP_HTTP, 40001), ("10.0.2.100", host_forwards.JAEGER_QUERY, 40002)]
    assert args.command[args.command.index("--only") + 1] == "a,b"
    monkeypatch.setenv("RETSNOOP_OTEL_TO_HOST", "40001=10.0.2.100:4318 40002=10.0.2.100:16686")
    assert host_forwards.guest_url(host_forwards.JAEGER_QUERY) == "http://10.0.2.100:16686"
    monkeypatch.setenv("RETSNOOP_OTEL_TO_HOST", "")
    with pytest.raises(RuntimeError, match="no forward to the host at guest port 4318"):
        host_forwards.guest_url(host_forwards.JAEGER_OTLP_HTTP)


def test_a_disk_image_is_attached_to_a_native_guest_and_refused_elsewhere(tmp_path: Path, capsys) -> None:
    """--disk: bench/local_disk_image.sh's image as the guest's virtio-blk disk (issue 48's local-disk starts)."""
    module = _load()
    img = tmp_path / "local.img"
    img.write_bytes(b"\0" * 512)
    args = module.parse_args(["--disk", str(img), "--", "true"])
    assert args.disk == [img]
    vng = module.vng_command(Path("vmlinuz"), module.Guest("amd64", module.REPO, tmp_path), tmp_path, 2,
                             disks=args.disk)
    assert f"--disk={img.resolve()}" in vng
    assert not any(a.startswith("--disk") for a in module.vng_command(Path("vmlinuz"),
                                                                     module.Guest("amd64", module.REPO, tmp_path),
                                                                     tmp_path, 2))
    for argv, why in ((["--disk", str(tmp_path / "missing.img")], "is not a file"),
                      (["--kernel", "7.2-arm64", "--disk", str(img)], "native kernels only")):
        with pytest.raises(SystemExit):
            module.parse_args([*argv, "--", "true"])
        assert why in capsys.readouterr().err


def test_the_local_disk_image_refuses_a_tree_whose_virtualenv_is_not_a_link(tmp_path: Path) -> None:
    """The guest binds the image's tree over the tree's path: a real .venv there would be bound to a link to itself
    (the run failed in the guest with "Too many levels of symbolic links"), so the image is refused on the host."""
    tree = tmp_path / "tree"
    (tree / ".venv").mkdir(parents=True)
    script = Path(__file__).resolve().parents[2] / "bench" / "local_disk_image.sh"
    run = subprocess.run(["bash", str(script), str(tree), str(tmp_path / "local.img")], capture_output=True, text=True)
    assert run.returncode == 2
    assert ".venv is not a link: measure a worktree" in run.stderr
    assert not (tmp_path / "local.img").exists()

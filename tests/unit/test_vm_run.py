"""tests/vm/run boots again when the guest died before the command started, and only then.

A fake `vng` stands in for virtme-ng: it plays a guest that dies while booting (no out.log, no exit code),
one that runs the command (out.log, then rc), or one that dies while the command runs.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "vm" / "run"



def _args(**given: object) -> argparse.Namespace:
    """tests/vm/run's parsed arguments: no network forwards or hostname unless given."""
    return argparse.Namespace(**{"hostname": None, "forward_to_host": [], "forward_from_host": [], **given})

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
    args = _args(kernel="6.12", dbg=False, cpus=2, timeout=60.0, rwdir=None, command=["true"])

    def run(*outcomes: str) -> tuple[int, int]:
        plan.write_text("\n".join(outcomes) + "\n")
        boots.unlink(missing_ok=True)
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


def test_the_guest_binds_the_repo_python_and_cache_from_the_cached_export(tmp_path: Path) -> None:
    module = _load()
    trees = module.cached_trees()
    assert trees[0] == module.REPO
    assert any((t / "bin").is_dir() and t != module.REPO for t in trees)  # the venv's base Python
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


def _fake_boots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, crash_text: str):
    """VmBatches whose boots are scripted: the first writes one scenario's result and dies with `crash_text`,
    a second one writes the rest."""
    import json
    from types import SimpleNamespace

    from tests.vm import conftest as vm_conftest
    from tests.vm import guest_batch

    scenarios = [SimpleNamespace(name=n, module=f"tests.vm.scenarios.{n}", budget_s=10) for n in ("a", "b", "c")]
    monkeypatch.setattr(guest_batch, "discover", lambda: scenarios)
    monkeypatch.setattr(vm_conftest.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    boots: list[list[str]] = []

    def boot_once(self, series, wanted, rwdir, results):
        boots.append([s.name for s in wanted])
        results.mkdir(exist_ok=True)
        (rwdir / "batch.log").write_text("")
        done = {s.name: {"status": "ok"} for s in (wanted[:1] if len(boots) == 1 else wanted)}
        for name in done:
            (results / f"{name}.json").write_text(json.dumps({"n": name}))
        (results / guest_batch.SUMMARY_FILE).write_text(json.dumps({"release": "7.2.13", "scenarios": done}))
        return (3, crash_text) if len(boots) == 1 else (0, "")

    monkeypatch.setattr(vm_conftest.VmBatches, "_boot_once", boot_once)
    batches = vm_conftest.VmBatches(None, {"7.2": {"a", "b", "c"}}, parallel=False)
    batches._say = lambda line: None
    return batches, boots


def test_a_guest_killed_by_a_code_patching_int3_runs_the_scenarios_left_in_a_new_boot(monkeypatch, tmp_path):
    batches, boots = _fake_boots(monkeypatch, tmp_path, "[   83.262144] Oops: int3: 0000 [#1] SMP NOPTI\n")
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"], ["b", "c"]]
    assert {k: v["status"] for k, v in batch.statuses.items()} == {"a": "ok", "b": "ok", "c": "ok"}
    assert "booted again after a TCG code-patching crash" in batch.log and "Oops: int3" in batch.log


def test_any_other_guest_death_is_not_retried(monkeypatch, tmp_path):
    batches, boots = _fake_boots(monkeypatch, tmp_path, "Kernel panic - not syncing: Fatal exception\n")
    batch = batches._boot("7.2")
    assert boots == [["a", "b", "c"]] and set(batch.statuses) == {"a"}  # b and c: no result, reported missing

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

    def fake_vng(vmlinuz: Path, guest, rwdir: Path, cpus: int) -> list[str]:
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
    args = argparse.Namespace(kernel="6.12", dbg=False, cpus=2, timeout=60.0, rwdir=None, command=["true"])

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
    args = argparse.Namespace(kernel="6.12", command=["true"])
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
    args = argparse.Namespace(kernel="6.12", command=["true"])
    rw = module.REPO / "build" / "rw"
    script = module.guest_script(args, module.Guest("amd64", module.REPO, rw), rw, None)
    assert f"mount --bind {module.CACHED_MOUNT}{module.REPO} " not in script


def test_an_arm64_guest_boots_its_own_root_and_sees_host_paths_where_they_are_mounted(tmp_path: Path) -> None:
    """Emulated arm64: the Debian arm64 root, the repo and the shared folder at fixed guest paths, the aarch64
    package before the repo's tests, and the command's host paths rewritten to the guest's."""
    module = _load()
    guest = module.Guest("arm64", Path("/mnt/repo"), Path("/mnt/rw"), tmp_path / "root")
    host_rw = tmp_path / "rw"
    args = argparse.Namespace(kernel="7.2-arm64", command=["python", "-m", "tests.vm.guest_batch", "--out",
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

"""Run every VM scenario in one boot and store each result as JSON for the host-side tests.

Booting a kernel under TCG costs 20-40 s and guest Python is ~30x slower than the host, so the
pytest fixtures in tests/vm/conftest.py boot each kernel once and run this module in it:

    python -m tests.vm.guest_batch --out DIR [--only NAME,...]

It imports every module of tests/vm/scenarios/ (file name order) and calls each function named
`scenario_*` (definition order) with a `Context`. The returned dict, which must be JSON-serialisable
(other values are stored with str()), is written to DIR/<name>.json, where <name> is the function
name without the `scenario_` prefix. If the scenario raises or overruns its budget, the file holds
{"error": "<traceback or reason>"} instead, and the batch goes on with the next scenario.
DIR/_batch.json records per-scenario status ("ok", "error", "timeout"), duration and budget.

Writing a scenario (guest side) and its test (host side):

    # tests/vm/scenarios/foo.py
    from tests.vm.guest_batch import budget

    @budget(900)                      # seconds; default DEFAULT_BUDGET_S; peers=("jaeger",): a host backend
    def scenario_foo(ctx) -> dict:
        rc, out, err = ctx.run(["bpftool", "version"], timeout=60)
        return {"rc": rc, "out": out}

    # tests/vm/test_foo.py
    @pytest.mark.vm
    def test_foo(vm_batch):          # parametrized over the kernels; or vm_batch_61 / vm_batch_612
        assert vm_batch["foo"]["rc"] == 0

Each scenario runs in its own forked process and process group, so a scenario that overruns is
killed together with everything it spawned; processes it leaves behind are killed when it returns.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.procs import Command, Proc  # Proc: what Context.spawn returns
from tests.vm import batch_lines

DEFAULT_BUDGET_S = 300.0
SCENARIO_PREFIX = "scenario_"
SCENARIO_PACKAGE = "tests.vm.scenarios"
SUMMARY_FILE = "_batch.json"


def budget(seconds: float, peers: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: give a scenario its own time budget (the default is DEFAULT_BUDGET_S), and the backends it needs
    on the host (`peers`, names of tests/vm/host_forwards.PEERS): the boot that runs it starts them and forwards
    the guest to them.

    A budget is about ten times what the scenario takes in a guest alone on this 2-core machine, and at least
    DEFAULT_BUDGET_S: slack for a loaded machine, while a scenario that hangs costs minutes, not the CI run."""

    def mark(fn: Callable) -> Callable:
        fn.budget_s = float(seconds)
        fn.peers = tuple(peers)
        return fn

    return mark


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str
    func: Callable
    budget_s: float
    peers: tuple[str, ...] = ()


def discover(package: str = SCENARIO_PACKAGE, default_budget: float = DEFAULT_BUDGET_S,
             modules: set[str] | None = None) -> list[Scenario]:
    """All scenario_* functions of the package's modules (or of those named), in file order then definition order.
    Naming them keeps a guest from importing what it does not run (the arm64 root has no pytest)."""
    pkg = importlib.import_module(package)
    pkg_dir = Path(pkg.__file__).parent
    found: list[Scenario] = []
    seen: dict[str, str] = {}
    for path in sorted(pkg_dir.glob("*.py")):
        if path.name.startswith("_") or (modules is not None and path.stem not in modules):
            continue
        mod = importlib.import_module(f"{package}.{path.stem}")
        funcs = [f for n, f in vars(mod).items()
                 if n.startswith(SCENARIO_PREFIX) and inspect.isfunction(f) and f.__module__ == mod.__name__]
        funcs.sort(key=lambda f: f.__code__.co_firstlineno)
        for f in funcs:
            name = f.__name__.removeprefix(SCENARIO_PREFIX)
            if name in seen:
                raise ValueError(f"scenario name {name!r} defined in both {seen[name]} and {mod.__name__}")
            seen[name] = mod.__name__
            found.append(Scenario(name, mod.__name__, f, float(getattr(f, "budget_s", default_budget)),
                                  tuple(getattr(f, "peers", ()))))
    return found


class Context:
    """What a scenario gets: command helpers, kernel facts and a private temporary directory.

    Attributes: `name` (scenario name), `kernel_series` (such as "5.10" or "7.2", from
    RETSNOOP_OTEL_KERNEL_SERIES), `vmlinux` (path of the DWARF vmlinux or None, from
    RETSNOOP_OTEL_VMLINUX), `tmpdir` (an empty directory on the guest's writable /tmp).
    Commands run in the repo root; a str command goes through the shell, a list does not.
    """

    def __init__(self, name: str, tmpdir: str, env: dict[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.name = name
        self.tmpdir = tmpdir
        self.kernel_series = env.get("RETSNOOP_OTEL_KERNEL_SERIES", "")
        self.vmlinux: str | None = env.get("RETSNOOP_OTEL_VMLINUX") or None
        self.cwd = str(Path(__file__).resolve().parents[2])
        self._procs: list[Proc] = []

    def run(self, cmd: Command, timeout: float = 120, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """Run to completion; returns (rc, stdout, stderr). Raises TimeoutError after killing it. `env` entries are
        added to the guest environment."""
        try:
            res = subprocess.run(cmd, shell=isinstance(cmd, str), stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, errors="replace", timeout=timeout, cwd=self.cwd,
                                 env={**os.environ, **env} if env else None)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            raise TimeoutError(f"{cmd!r} did not finish within {timeout:g} s; stdout so far:\n{out[-2000:]}") from None
        return res.returncode, res.stdout, res.stderr

    def spawn(self, cmd: Command, env: dict[str, str] | None = None, stdin: bool = False) -> Proc:
        """Start a background process; `env` entries are added to the guest environment."""
        proc = Proc(cmd, env, self.cwd, stdin=stdin)
        self._procs.append(proc)
        return proc

    def bpf_prog_ids(self) -> list[dict]:
        """Loaded BPF programs as [{"id", "name", "type"}] from `bpftool -j prog list`."""
        rc, out, err = self.run(["bpftool", "-j", "prog", "list"], timeout=120)
        if rc != 0:
            raise RuntimeError(f"bpftool -j prog list failed ({rc}): {err.strip()}")
        progs = json.loads(out or "[]")
        return [{"id": p.get("id"), "name": p.get("name", ""), "type": p.get("type", "")} for p in progs]

    def log(self, msg: str) -> None:
        """A progress line in the batch output (streamed to the host while the batch runs)."""
        print(f"[{self.name}] {msg}", flush=True)

    def cleanup(self) -> None:
        """Stop whatever the scenario left running."""
        for proc in self._procs:
            if proc.returncode is None:
                proc.terminate(timeout=30)


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _run_in_child(sc: Scenario, out: Path) -> None:
    """Child side: own process group, run the scenario, write its result file, exit."""
    os.setpgid(0, 0)
    tmpdir = tempfile.mkdtemp(prefix=f"{sc.name}-")
    ctx = Context(sc.name, tmpdir)
    code = 0
    try:
        result = sc.func(ctx)
        if not isinstance(result, dict):
            raise TypeError(f"scenario returned {type(result).__name__}, expected dict")
    except BaseException:  # every failure must become a result, never stop the batch
        result = {"error": traceback.format_exc()}
        code = 1
    try:
        ctx.cleanup()
    finally:
        _write_json(out / f"{sc.name}.json", result)
    sys.stdout.flush()
    os._exit(code)


def run_one(sc: Scenario, out: Path) -> tuple[str, float]:
    """Run a scenario in a forked child within its budget; returns (status, seconds)."""
    start = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _run_in_child(sc, out)
    try:
        os.setpgid(pid, pid)  # also here, so that a kill right after fork reaches the group
    except OSError:
        pass
    status = None
    while status is None:
        done, wstatus = os.waitpid(pid, os.WNOHANG)
        if done:
            ok = os.waitstatus_to_exitcode(wstatus) == 0
            status = "ok" if ok else "error"
        elif time.monotonic() - start > sc.budget_s:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            _write_json(out / f"{sc.name}.json", {"error": f"scenario exceeded its budget of {sc.budget_s:g} s"})
            status = "timeout"
        else:
            time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)  # anything the scenario spawned and left behind
    except ProcessLookupError:
        pass
    if not (out / f"{sc.name}.json").exists():
        _write_json(out / f"{sc.name}.json", {"error": "scenario process died without a result"})
        status = "error"
    return status, time.monotonic() - start


def run_batch(scenarios: Iterable[Scenario], out: Path, release: str = "") -> dict:
    """Run scenarios one after the other; returns (and writes) the batch summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"release": release or os.uname().release,
                     "series": os.environ.get("RETSNOOP_OTEL_KERNEL_SERIES", ""), "scenarios": {}}
    for sc in scenarios:
        print(batch_lines.start(sc.name, sc.budget_s), flush=True)
        status, secs = run_one(sc, out)
        summary["scenarios"][sc.name] = {"status": status, "seconds": round(secs, 1), "budget_s": sc.budget_s,
                                         "module": sc.module}
        print(batch_lines.end(sc.name, status, secs), flush=True)
        _write_json(out / SUMMARY_FILE, summary)
    _write_json(out / SUMMARY_FILE, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.vm.guest_batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for <name>.json and _batch.json")
    p.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    p.add_argument("--modules", default="", help="comma-separated scenario modules to import (default: all)")
    p.add_argument("--package", default=SCENARIO_PACKAGE, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    modules = {m.strip() for m in args.modules.split(",") if m.strip()} or None
    scenarios = discover(args.package, modules=modules)
    if args.only:
        wanted = {n.strip().removeprefix(SCENARIO_PREFIX) for n in args.only.split(",") if n.strip()}
        unknown = wanted - {s.name for s in scenarios}
        if unknown:
            p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
        scenarios = [s for s in scenarios if s.name in wanted]
    print(f"[batch] {len(scenarios)} scenarios, discovered in {time.monotonic() - t0:.1f} s", flush=True)
    summary = run_batch(scenarios, args.out)
    bad = [n for n, s in summary["scenarios"].items() if s["status"] != "ok"]
    print(f"[batch] done in {time.monotonic() - t0:.1f} s; not ok: {', '.join(bad) or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host side of the VM tests: boot each kernel once per pytest run and run in it the scenarios its tests read.

The kernels boot one after the other, two guest CPUs each (--vm-parallel: side by side, one CPU each).
Fixtures (all session-scoped, sharing one cache, so a kernel boots at most once per run):
- `vm_batch`: parametrized over the kernels of the test's `kernels` marker (default: the newest; ids are series
  such as `5.10`, `7.2`), less those left out with --vm-kernels;
- `vm_batch_510`, `vm_batch_61`, `vm_batch_612`, `vm_batch_newest`: one kernel each;
- `vm_batch_arm64`: the newest arm64 kernel, emulated, with a Debian arm64 root and the aarch64 wheel.
What each boot proves is decided by the tests: a kernel's batch runs the scenario modules (tests/vm/scenarios/X.py)
of the test modules (tests/vm/test_X.py) that asked for that kernel, so every scenario runs on the newest kernel
and the others run what their markers name. Four kernels, one boot each, within CI's time. A boot whose scenarios
name host peers (`guest_batch.budget(..., peers=...)`) starts them on the host and forwards the guest to them
(tests/vm/host_forwards.py); the others have no network.
Each returns a `VmBatch`: a read-only mapping scenario name -> result dict (the name is the guest
function's name without `scenario_`). Looking up a scenario that raised, overran its budget or never
ran fails the test with the guest traceback; `raw(name)` returns the stored dict unchecked.

If the VM does not boot or the batch produces no summary, every test using that kernel fails (as a
setup error) with the tail of the VM output: VM tests never skip.

When the guest kernel crashes (an Oops or panic in the console, tests/vm/guest_crash.py; under TCG the emulator's
live code patching has been seen to do it), the kernel boots once more for the crashed scenario and those that
had not run; their results take the missing ones' place, and the crash is still reported: a line in the
terminal summary and in build/test-logs/guest-crashes.txt. If it crashes again during a scenario, the crashed
scenario's test fails naming the crash and its console lines, and the tests of the scenarios after it say they
did not run because of it. A crash before that boot's batch started a scenario (while booting: nothing of ours
had run in that kernel) does not use up that one fresh boot: it boots again, as tests/vm/run does by itself for a
guest that died before the command started. Either way a kernel's batch gets at most MAX_BOOTS boots in all,
tests/vm/run's own included; a crash when they are spent is final like a second crash in a scenario. A scenario
that merely failed never runs again. Tests that use these fixtures get the `vm` marker automatically; deselect
them only with -m 'not vm'.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.conftest import HOST_KERNELS, VM_KERNELS  # noqa: E402
from tests.vm import guest_batch, guest_crash, guest_stall, host_forwards  # noqa: E402 - needs the repo root on sys.path
from tests.vm.guest_crash import GuestCrash  # noqa: E402

OLDEST, NEWEST = HOST_KERNELS[0], HOST_KERNELS[-1]
ARM64 = next(k for k in VM_KERNELS if k.endswith("-arm64"))
DBG_KERNELS = ("6.1",)  # booted with their DWARF vmlinux (':path' globs, file:line)
FIXTURE_KERNEL = {"vm_batch_510": "5.10", "vm_batch_61": "6.1", "vm_batch_612": "6.12", "vm_batch_newest": NEWEST,
                  "vm_batch_arm64": ARM64}
ROLES = {"oldest": (OLDEST,), "newest": (NEWEST,), "all": HOST_KERNELS}
BOOT_MARGIN_S = 900.0  # boot (20-40 s under TCG) + guest Python start-up and imports, generously
STALL_MARGIN_S = 600.0  # beyond a scenario's budget, silence from the guest means it hangs (guest_stall)
LOG_TAIL = 80
STASH = pytest.StashKey["VmBatches"]()
WANTED = pytest.StashKey[dict]()  # series -> the scenario modules its collected tests read
KERNELS_ORDER = list(VM_KERNELS).index
PARALLEL_SLOWDOWN = 2.0  # budgets are for a guest alone with two CPUs
CRASH_DRILL = "RETSNOOP_OTEL_VM_CRASH_DRILL"  # =1: tests/vm/test_crash_drill.py runs (it panics a 6.1 guest)
CRASH_LOG = REPO / "build" / "test-logs" / "guest-crashes.txt"  # the run's guest kernel crashes (make test clears it)
# Boots of one kernel's batch in all, counting each of tests/vm/run's own (its "booting" lines; it is told how many
# it may make): one recorded 7.2 run crashed three times while booting and once in a scenario, which five covers.
MAX_BOOTS = 5
RUN_BOOT_ATTEMPTS = 2  # tests/vm/run's own boots per call when the guest dies before the command started


def _tail(text: str, n: int = LOG_TAIL) -> str:
    return "\n".join(text.splitlines()[-n:])


class VmBatch(Mapping):
    """The results of one kernel's batch, read from the JSON files the guest wrote."""

    def __init__(self, series: str, results_dir: Path, log: str, run_rc: int, seconds: float,
                 crash: GuestCrash | None = None, crashes: tuple[GuestCrash, ...] = (), boots: int = 1,
                 stopped: str = "") -> None:
        self.series = series
        self.results_dir = results_dir
        self.log = log
        self.run_rc = run_rc
        self.seconds = seconds
        self.crash = crash  # the crash that left scenarios without a result (after the fresh boots, if any)
        self.crashes = crashes  # every crash of this kernel's boots in order, tests/vm/run's own too; `crash` last
        self.boots = boots  # how many times the guest booted, tests/vm/run's own boots included
        self.stopped = stopped  # why no boot followed `crash` when MAX_BOOTS was why, else ''
        self.summary = json.loads((results_dir / guest_batch.SUMMARY_FILE).read_text())
        self.release: str = self.summary.get("release", "")
        self.statuses: dict[str, dict] = self.summary.get("scenarios", {})
        # Read everything now: the files do not have to outlive the boot.
        self.results = {p.stem: json.loads(p.read_text()) for p in results_dir.glob("*.json")
                        if p.name != guest_batch.SUMMARY_FILE}

    def at_least(self, major: int, minor: int) -> bool:
        """The booted kernel is that version or newer (what a kernel has is decided by its release)."""
        return tuple(int(x) for x in self.release.split("-")[0].split(".")[:2]) >= (major, minor)

    def raw(self, name: str) -> dict:
        """The stored dict of a scenario, including {"error": ...} ones."""
        key = name.removeprefix(guest_batch.SCENARIO_PREFIX)
        if key not in self.results:
            if self.crash is not None:
                raise AssertionError(self.crash_message(key))
            raise AssertionError(f"scenario {key!r} has no result on {self.series} ({self.release}); "
                                 f"tests/vm/run exit {self.run_rc}; batch output tail:\n{_tail(self.log)}")
        return self.results[key]

    def crash_message(self, key: str) -> str:
        """Why `key` has no result when the guest kernel crashed: it crashed in it, or the crash came first."""
        crash = self.crash
        assert crash is not None
        where = f"{self.series} ({crash.release or self.release})"
        earlier = [c for c in self.crashes if c is not crash]
        if len(earlier) == 1:
            first = earlier[0]
            before = f"\n(a first boot had crashed {first.during}: {first.headline}; this was the fresh boot after it)"
        else:
            before = "".join(f"\n(an earlier boot had crashed {c.during}: {c.headline})" for c in earlier)
        if self.stopped:
            before += f"\n(no further boot: {self.stopped})"
        if crash.scenario == key:
            return (f"the guest kernel crashed during scenario {key!r} on {where}: {crash.headline}{before}\n"
                    f"{crash.excerpt}\n(tests/vm/run exit {self.run_rc}; logs in {self.results_dir.parent})")
        return (f"scenario {key!r} on {where} not run: the guest kernel crashed {crash.during}: "
                f"{crash.headline}{before}")

    def __getitem__(self, name: str) -> dict:
        key = name.removeprefix(guest_batch.SCENARIO_PREFIX)
        result = self.raw(key)
        status = self.statuses.get(key, {}).get("status", "missing from _batch.json")
        if status != "ok":
            raise AssertionError(f"scenario {key!r} on {self.release}: {status}\n{result.get('error', result)}")
        return result

    def __iter__(self) -> Iterator[str]:
        return iter(self.statuses)

    def __len__(self) -> int:
        return len(self.statuses)


class VmBatches:
    """Boots the kernels on first request and caches each outcome (success or failure) for the session.

    With `parallel`, the first request boots every kernel the selected tests need at once, one guest CPU
    each (two guests of two CPUs on a two-core host spin on each other's preempted locks); otherwise one
    kernel at a time, two CPUs each, the default: under one-CPU guests most of prometheus_e2e's 1 s
    scrapes time out (9% made it in one 6.12 run). Boots run on threads; their progress lines are
    printed by the test thread while it waits for a batch."""

    def __init__(self, config: pytest.Config, wanted: dict[str, set[str]], parallel: bool) -> None:
        self.config = config
        self.wanted = wanted
        self.parallel = parallel
        self.done: dict[str, VmBatch | str] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lines: queue.Queue[str] = queue.Queue()
        self._procs: list[subprocess.Popen] = []
        self.crashes: list[str] = []  # one line per guest kernel crash, for the terminal summary
        self.t0 = _test_t0()

    def get(self, series: str) -> VmBatch:
        for s in ([*self.wanted, series] if self.parallel else [series]):
            if s not in self._threads:
                self._threads[s] = threading.Thread(target=self._run, args=(s,), name=f"vm-{s}", daemon=True)
                self._threads[s].start()
        thread = self._threads[series]
        while thread.is_alive():
            thread.join(0.5)
            self.say_pending()
        self.say_pending()
        outcome = self.done[series]
        if isinstance(outcome, str):
            pytest.fail(outcome, pytrace=False)
        return outcome

    def _run(self, series: str) -> None:
        try:
            self.done[series] = self._boot(series)
        except Exception as e:  # noqa: BLE001 - any failure becomes that kernel's failure, reported by get()
            self.done[series] = str(e) if isinstance(e, RuntimeError) else f"VM batch on {series}: {e!r}"

    def stop(self) -> None:
        """A session that ends before a batch does (-x, ^C) stops its VM: tests/vm/run kills QEMU on SIGTERM."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for thread in self._threads.values():
            thread.join(30)

    def _say(self, line: str) -> None:
        """A progress line stamped with the time since `make test` began (RETSNOOP_OTEL_TEST_T0, else since this
        session began): CI shows only the output's tail, and the stamps there say where the time went."""
        body = line.lstrip("\n")
        self._lines.put(f"{line[:len(line) - len(body)]}{_elapsed(self.t0)} {body}")

    def say_pending(self) -> None:
        """Progress on the terminal even while pytest captures output (a batch takes minutes)."""
        capman = self.config.pluginmanager.getplugin("capturemanager")
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        while not self._lines.empty():
            line = self._lines.get_nowait()
            if capman is None or reporter is None:
                continue
            with capman.global_and_fixture_disabled():
                reporter.write_line(line)

    def _boot(self, series: str) -> VmBatch:
        modules = self.wanted.get(series, set())
        scenarios = [s for s in guest_batch.discover() if s.module.rsplit(".", 1)[-1] in modules]
        if only := os.environ.get("RETSNOOP_OTEL_VM_ONLY", ""):  # development: a subset of the scenarios
            scenarios = [s for s in scenarios if s.name in only.split(",")]
        if not scenarios:
            raise RuntimeError(f"no scenario to run on kernel {series} (modules asked for: {sorted(modules)})")
        # Not under pytest's basetemp: concurrent pytest runs prune old basetemps while a batch runs.
        rwdir = Path(tempfile.mkdtemp(prefix=f"retsnoop-otel-vm-{series}-"))
        results = rwdir / "results"
        start = time.monotonic()
        order = [s.name for s in scenarios]
        rc, text, crash, crashes, boots, stopped = self._boots(series, scenarios, order, rwdir, results)
        seconds = time.monotonic() - start
        if not (results / guest_batch.SUMMARY_FILE).exists():
            why = ""
            if crashes:  # all of them, in order; the excerpt of the last, when it is what stopped the batch
                why = "the guest kernel crashed " + "; in the boot after it, again ".join(
                    f"{c.during}: {c.headline}" for c in crashes)
                if crash is not None:
                    why += f"; no further boot: {stopped or 'a crash during a scenario gets one fresh boot'}\n" \
                           f"{crash.excerpt}\n"
                else:
                    why += " "
            raise RuntimeError(f"VM batch on kernel {series} produced no results: {why}(tests/vm/run exit {rc}, "
                               f"{boots} boots, {seconds:.0f} s; kept {rwdir}). Output tail:\n{_tail(text)}")
        batch = VmBatch(series, results, text, rc, seconds, crash, tuple(crashes), boots, stopped)
        if rc == 0 and not crashes and all(s["status"] == "ok" for s in batch.statuses.values()):
            shutil.rmtree(rwdir, ignore_errors=True)  # otherwise kept for a look at batch.log/console.log
        return batch

    def _boots(self, series: str, scenarios: list, order: list[str], rwdir: Path, results: Path
               ) -> tuple[int, str, GuestCrash | None, list[GuestCrash], int, str]:
        """Boot until the batch has run, booting again after a guest kernel crash for the scenarios it left.

        A crash in a boot whose batch had started a scenario earns one fresh boot in all; one before the batch
        started any (guest_crash.GuestCrash.before_scenarios: the guest crashed while booting, nothing of ours had
        run in it) does not count against that, like those tests/vm/run boots again after by itself. At most
        MAX_BOOTS boots in all, tests/vm/run's own included (it is told how many it may still make).

        Returns tests/vm/run's last exit code, the output of every boot, the crash that left scenarios without a
        result (None: none did), every crash in order, the number of boots, and '' or why MAX_BOOTS stopped it."""
        pending, text, done = scenarios, "", {}
        crashes: list[GuestCrash] = []
        boots = scenario_crashes = crashed_calls = 0
        last: GuestCrash | None = None  # the previous boot's crash: recorded once the boot after it is over
        while True:
            rc, out = self._boot_once(series, pending, rwdir, results, min(RUN_BOOT_ATTEMPTS, MAX_BOOTS - boots))
            boots += max(1, guest_crash.attempts(out))
            text = out if last is None else \
                f"{text}\n[vm {series}] booted again after the guest kernel crashed {last.during}\n{out}"
            done = {**done, **_summary(results)}
            if done and last is not None:
                _write_summary(results, done)
            crash, again = guest_crash.assess(order, done, out, _read(rwdir / "console.log"))
            if last is not None:
                left = guest_crash.unfinished(order, done)
                self._record(series, last, rwdir, "recovered: a fresh boot ran the scenarios left" if not left
                             else "the fresh boot crashed too (below)" if crash is not None
                             else f"the fresh boot left {len(left)} scenarios without a result")
            for retried in guest_crash.boot_crashes(out):
                crashes.append(retried)
                self._record(series, retried, rwdir, "tests/vm/run booted again by itself")
            if crash is None:
                return rc, text, None, crashes, boots, ""
            crashes.append(crash)
            if not crash.before_scenarios:
                scenario_crashes += 1
            if scenario_crashes > 1 or boots >= MAX_BOOTS:
                stopped = "" if scenario_crashes > 1 else f"{boots} boots, the most one kernel's batch gets"
                because = f": {stopped}" if stopped else ""
                self._say(f"[vm {series}] the guest kernel crashed {'again, ' if len(crashes) > 1 else ''}"
                          f"{crash.during}: {crash.headline}; no further boot{because}")
                self._record(series, crash, rwdir, f"NOT recovered (no further boot{because})")
                return rc, text, crash, crashes, boots, stopped
            # A fresh boot for the crashed scenario and those after it; the crashed boot's logs are kept.
            why = ("a crash before any scenario does not use up the fresh boot a scenario crash gets"
                   if crash.before_scenarios else "the one fresh boot a crash during a scenario gets")
            self._say(f"[vm {series}] the guest kernel crashed {crash.during}: {crash.headline}; booting again "
                      f"for the {len(again)} scenarios without a result ({why}; {boots} of at most {MAX_BOOTS} "
                      f"boots so far)")
            crashed_calls += 1
            for log in ("batch", "console"):  # batch-crashed.log, then batch-crashed-2.log...
                if (rwdir / f"{log}.log").exists():
                    suffix = "" if crashed_calls == 1 else f"-{crashed_calls}"
                    (rwdir / f"{log}.log").rename(rwdir / f"{log}-crashed{suffix}.log")
            pending, last = [s for s in scenarios if s.name in again], crash

    def _record(self, series: str, crash: GuestCrash, rwdir: Path, outcome: str) -> None:
        """A crash for the terminal summary and build/test-logs/guest-crashes.txt."""
        line = f"kernel {series} ({crash.release}): guest kernel crashed {crash.during}: {crash.headline}; {outcome}"
        self.crashes.append(line)
        try:
            CRASH_LOG.parent.mkdir(parents=True, exist_ok=True)
            with open(CRASH_LOG, "a") as f:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                f.write(f"{stamp} {line} (logs in {rwdir})\n{textwrap.indent(crash.excerpt, '    ')}\n\n")
        except OSError as e:
            self._say(f"[vm {series}] could not write {CRASH_LOG}: {e}")

    def _boot_once(self, series: str, scenarios: list, rwdir: Path, results: Path, attempts: int) -> tuple[int, str]:
        """One call of tests/vm/run running `scenarios`, which boots at most `attempts` times (again only when the
        guest died before the command started): its exit code and its output."""
        timeout = BOOT_MARGIN_S + sum(s.budget_s for s in scenarios)
        if self.parallel:
            timeout *= PARALLEL_SLOWDOWN
        cmd = [str(REPO / "tests" / "vm" / "run"), "--kernel", series, "--timeout", f"{timeout:.0f}",
               "--rwdir", str(rwdir), "--cpus", "1" if self.parallel else "2", "--boot-attempts", str(attempts)]
        if series in DBG_KERNELS:
            cmd.append("--dbg")
        peers = {p for s in scenarios for p in s.peers}
        self._say(f"\n[vm {series}] booting for {len(scenarios)} scenarios (timeout {timeout:.0f} s, "
                  f"{'beside the other kernels, ' if self.parallel else ''}"
                  f"{'host peers ' + ', '.join(sorted(peers)) + ', ' if peers else ''}log {rwdir / 'batch.log'})")
        # the host's backends for this boot only: a fresh boot after a crash finds none of the crashed one's data
        with host_forwards.started(peers) as forwards:
            cmd += [*forwards, "--", "python", "-m", "tests.vm.guest_batch", "--out", str(results),
                    "--only", ",".join(s.name for s in scenarios),
                    "--modules", ",".join(sorted({s.module.rsplit(".", 1)[-1] for s in scenarios}))]
            return self._run_vm(series, cmd, rwdir)

    def _run_vm(self, series: str, cmd: list[str], rwdir: Path) -> tuple[int, str]:
        """tests/vm/run's exit code and output, which goes to batch.log and, its progress lines, to the terminal.

        A guest that goes silent for longer than the scenario running in it may take (the guest kills a scenario at
        its budget and says so) is stopped: a hung guest kernel costs that much, not the boot's whole timeout."""
        lines: list[str] = []
        stall = guest_stall.Stall(BOOT_MARGIN_S, STALL_MARGIN_S * (PARALLEL_SLOWDOWN if self.parallel else 1.0))
        with open(rwdir / "batch.log", "w") as log, subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", cwd=REPO) as proc:
            self._procs.append(proc)
            watchdog = threading.Thread(target=stall.watch, args=(proc,), name=f"vm-{series}-stall", daemon=True)
            watchdog.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                stall.saw(line)
                lines.append(line)
                log.write(line)
                log.flush()
                if line.startswith(("[batch]", "tests/vm/run:", "[vm]")):
                    self._say(f"[vm {series}] {line.rstrip()}")
            stall.done.set()  # its output ended: tests/vm/run exits (the `with` waits for it)
        if stall.why:
            line = f"[vm {series}] stopped the VM: {stall.why}\n"
            self._say(line.rstrip())
            log_line = f"tests/vm/conftest.py: {line}"
            with open(rwdir / "batch.log", "a") as log:
                log.write(log_line)
            lines.append(log_line)
        return proc.returncode, "".join(lines)


def _test_t0() -> float:
    """When `make test` began (its Makefile passes the epoch seconds), else now."""
    try:
        return float(os.environ["RETSNOOP_OTEL_TEST_T0"])
    except (KeyError, ValueError):
        return time.time()


def _elapsed(t0: float) -> str:
    m, s = divmod(max(0, int(time.time() - t0)), 60)
    return f"+{m}:{s:02d}"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _summary(results: Path) -> dict[str, dict]:
    """The scenarios' statuses a batch wrote so far (guest_batch rewrites its summary after each one)."""
    path = results / guest_batch.SUMMARY_FILE
    return json.loads(path.read_text()).get("scenarios", {}) if path.exists() else {}


def _write_summary(results: Path, scenarios: dict[str, dict]) -> None:
    path = results / guest_batch.SUMMARY_FILE
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary["scenarios"] = scenarios
    path.write_text(json.dumps(summary, indent=1))


def _kernels_of(marker: pytest.Mark | None) -> list[str]:
    names = marker.args if marker is not None else ("newest",)
    kernels = [k for n in names for k in ROLES.get(n, (n,))]
    if unknown := [k for k in kernels if k not in VM_KERNELS]:
        raise pytest.UsageError(f"kernels marker: unknown series {unknown} (known: {', '.join(VM_KERNELS)})")
    return sorted(set(kernels), key=KERNELS_ORDER)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "vm_batch" in metafunc.fixturenames:
        kernels = _kernels_of(metafunc.definition.get_closest_marker("kernels"))
        metafunc.parametrize("vm_batch", kernels, ids=kernels, indirect=True, scope="session")


def _item_kernels(item: pytest.Item) -> set[str]:
    kernels = {k for f, k in FIXTURE_KERNEL.items() if f in getattr(item, "fixturenames", ())}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "vm_batch" in callspec.params:
        kernels.add(callspec.params["vm_batch"])
    return kernels


def _scenario_module(item: pytest.Item) -> str:
    """tests/vm/test_X.py reads the results of tests/vm/scenarios/X.py"""
    return item.path.stem.removeprefix("test_")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark VM-fixture users `vm` (before -m filtering) and drop kernels not in --vm-kernels, and the crash drill
    unless asked for (its scenario panics the guest)."""
    chosen = {k.strip() for k in config.getoption("--vm-kernels").split(",")}
    drill = os.environ.get(CRASH_DRILL) == "1"
    keep, drop = [], []
    for item in items:
        kernels = _item_kernels(item)
        if kernels:
            item.add_marker(pytest.mark.vm)
        crash_drill = item.get_closest_marker("crash_drill") is not None and not drill
        (drop if kernels - chosen or crash_drill else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """What each kernel's boot must run, after every deselection: the scenario modules of the tests left."""
    wanted: dict[str, set[str]] = {}
    for item in session.items:
        for series in _item_kernels(item):
            wanted.setdefault(series, set()).add(_scenario_module(item))
    session.config.stash[WANTED] = dict(sorted(wanted.items(), key=lambda kv: KERNELS_ORDER(kv[0])))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """How long each boot + batch took and each scenario's status: the numbers CI cost depends on."""
    batches = config.stash.get(STASH, None)
    if batches is None or not batches.done:
        return
    batches.say_pending()
    terminalreporter.section("VM batches")
    for series, outcome in list(batches.done.items()):
        if isinstance(outcome, str):
            terminalreporter.write_line(f"kernel {series}: FAILED to produce results")
            continue
        kept = f"; files kept in {outcome.results_dir.parent}" if outcome.results_dir.exists() else ""
        parts = ", ".join(f"{n} {s['status']} {s['seconds']:.0f}s" for n, s in outcome.statuses.items())
        boots = f" ({outcome.boots} boots)" if outcome.boots > 1 else ""
        terminalreporter.write_line(f"kernel {series} ({outcome.release}): boot + batch {outcome.seconds:.0f} s"
                                    f"{boots}; {parts}{kept}")
    for line in batches.crashes:
        terminalreporter.write_line(line, yellow=True, bold=True)
    if batches.crashes:
        terminalreporter.write_line(f"(guest kernel crashes, with their console lines: {CRASH_LOG})")


def pytest_unconfigure(config: pytest.Config) -> None:
    batches = config.stash.get(STASH, None)
    if batches is not None:
        batches.stop()


@pytest.fixture(scope="session")
def vm_batches(pytestconfig: pytest.Config) -> VmBatches:
    if STASH not in pytestconfig.stash:
        pytestconfig.stash[STASH] = VmBatches(pytestconfig, pytestconfig.stash.get(WANTED, {}),
                                              pytestconfig.getoption("--vm-parallel"))
    return pytestconfig.stash[STASH]


@pytest.fixture(scope="session")
def vm_batch(request: pytest.FixtureRequest, vm_batches: VmBatches) -> VmBatch:
    """Parametrized by pytest_generate_tests over the test's `kernels` marker."""
    return vm_batches.get(request.param)


@pytest.fixture(scope="session")
def vm_batch_510(vm_batches: VmBatches) -> VmBatch:
    return vm_batches.get("5.10")


@pytest.fixture(scope="session")
def vm_batch_61(vm_batches: VmBatches) -> VmBatch:
    return vm_batches.get("6.1")


@pytest.fixture(scope="session")
def vm_batch_612(vm_batches: VmBatches) -> VmBatch:
    return vm_batches.get("6.12")


@pytest.fixture(scope="session")
def vm_batch_newest(vm_batches: VmBatches) -> VmBatch:
    return vm_batches.get(NEWEST)


@pytest.fixture(scope="session")
def vm_batch_arm64(vm_batches: VmBatches) -> VmBatch:
    return vm_batches.get(ARM64)

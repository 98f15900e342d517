"""Ctrl-C while the command's modules load (issue 47.2, found by bench/blackbox.py): it ended in the traceback of
whatever import it landed in, exit 1; it must end as a Ctrl-C at start-up does, 130, with nothing said."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the package imported as the console script imports it (argv[0] its name), then a Ctrl-C in the middle of an
# import that follows (a module whose body sends it, as a user's key press lands in a module being loaded)
LOADING = """
import os, signal, sys, tempfile
sys.argv[0] = {argv0!r}
import retsnoop_otel
d = tempfile.mkdtemp()
open(os.path.join(d, "slow_module.py"), "w").write("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\n")
sys.path.insert(0, d)
import slow_module
print("survived")
"""


def _load(argv0: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LOADING.format(argv0=argv0)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False, env={"PYTHONPATH": str(REPO)})


def test_ctrl_c_while_the_command_loads_is_130_and_silent() -> None:
    for argv0 in ("/usr/local/bin/retsnoop-otel", "-m"):  # the console script; python -m retsnoop_otel
        out = _load(argv0)
        assert (out.returncode, out.stdout, out.stderr) == (130, "", ""), out


def test_a_program_importing_the_package_keeps_its_ctrl_c() -> None:
    out = _load("/usr/bin/pytest")
    assert out.returncode != 0 and "KeyboardInterrupt" in out.stderr and "survived" not in out.stdout, out


def test_main_hands_ctrl_c_back_to_python_once_loaded(monkeypatch) -> None:
    """From cli.main on, Ctrl-C raises KeyboardInterrupt again, which main turns into 130 after its clean-up."""
    import retsnoop_otel
    from retsnoop_otel import cli
    seen = []
    monkeypatch.setattr(cli, "_run", lambda *a: seen.append(signal.getsignal(signal.SIGINT)) or 0)
    old = signal.signal(signal.SIGINT, retsnoop_otel.interrupted_while_loading)
    try:
        assert cli.main(["simfail"]) == 0  # trace and features install their StartSignals (they raise it too)
    finally:
        signal.signal(signal.SIGINT, old)
    assert seen == [signal.default_int_handler]

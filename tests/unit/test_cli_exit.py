"""The installed command leaves through cli.run: main's code, its output flushed, no interpreter teardown."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from retsnoop_otel import __version__

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retsnoop_otel", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=False)


def test_output_to_a_pipe_is_flushed_before_the_process_ends() -> None:
    """A pipe is block-buffered: without run()'s flush, os._exit would drop what main printed."""
    p = _run("--version")
    assert p.returncode == 0, p.stderr
    assert __version__ in p.stdout
    helped = _run("trace", "--help")
    assert helped.returncode == 0 and "--entry" in helped.stdout and helped.stdout.endswith("\n"), helped.stderr


def test_main_s_exit_codes_come_through() -> None:
    bad_flag = _run("trace", "-e", "x", "--no-such-flag")
    assert bad_flag.returncode == 2 and "--no-such-flag" in bad_flag.stderr
    unknown = _run("frobnicate")
    assert unknown.returncode == 2


def test_the_console_script_is_run() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["retsnoop-otel"] == "retsnoop_otel.cli:run"

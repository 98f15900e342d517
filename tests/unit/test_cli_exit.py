"""The installed command leaves the process at once when main() returns (cli.run, issue 48.2), yet loses nothing
Python's own exit would have finished: threads that are not daemons, buffered log records, buffered output."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import logging, logging.handlers, sys, threading, time
    from pathlib import Path
    from retsnoop_otel import cli
    out = Path(sys.argv[1])

    def late_writer():
        time.sleep(0.5)
        (out / "thread.txt").write_text("joined")

    def fake_main():
        threading.Thread(target=late_writer).start()  # not a daemon: the interpreter would wait for it
        target = logging.FileHandler(out / "log.txt")
        logging.getLogger("x").addHandler(logging.handlers.MemoryHandler(1000, target=target))
        logging.getLogger("x").warning("buffered record")  # written only when the handler is flushed
        sys.stdout.write("buffered output")  # a pipe: block-buffered, not flushed yet
        return 3

    cli.main = fake_main
    cli.run()
    """)


def test_run_exits_with_mains_code_after_threads_logs_and_output(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    assert res.stdout == "buffered output"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert "buffered record" in (tmp_path / "log.txt").read_text()


def test_python_m_and_the_installed_script_use_run() -> None:
    """Both ways in go through run(): `python -m retsnoop_otel` and the console script of pyproject.toml."""
    repo = Path(__file__).resolve().parents[2]
    assert "run()" in (repo / "retsnoop_otel" / "__main__.py").read_text()
    assert 'retsnoop-otel = "retsnoop_otel.cli:run"' in (repo / "pyproject.toml").read_text()

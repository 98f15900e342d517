"""Child processes whose output tests and harnesses wait on: `Proc`.

One reader thread per child appends each output line under a Condition as soon as it arrives, so a
wait never misses lines that came in one burst (a select() on a buffered text pipe does: lines that
readline() already pulled into Python's buffer are invisible to select() until more output comes).
Used by the VM batch (tests/vm/guest_batch.py, `Context.spawn`) and the demo (tests/demo.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

Command = Sequence[str] | str


def without_system_libbpf(cmd: Sequence[str]) -> list[str]:
    """`cmd` in a mount namespace of its own where every libbpf.so file of the system's reads as empty: what runs
    there can only use the libbpf built with the package (Debian 12 ships 1.1, Ubuntu 22.04 0.5, some hosts none)."""
    hide = ("for f in /usr/lib/*/libbpf.so.* /lib/*/libbpf.so.* /usr/lib/libbpf.so.* /usr/lib64/libbpf.so.*; do "
            '[ -f "$f" ] && [ ! -L "$f" ] && mount --bind /dev/null "$f"; done; '
            "python3 -c 'import ctypes; ctypes.CDLL(\"libbpf.so.1\")' 2>/dev/null && echo HOST-LIBBPF-LOADS; "
            'exec "$@"')
    return ["unshare", "-m", "sh", "-c", hide, "sh", *cmd]


class Proc:
    """A background process; stdout and stderr are merged and collected line by line.

    `cmd` as a str goes through the shell, a list does not; `env` entries are added to this process's
    environment. `echo`, if given, is called from the reader thread with each line (newline included)
    before the line becomes visible to the wait methods, so what was echoed precedes what a caller prints
    after a wait returns. With `stdin=True`, `send` writes lines to the process (else it reads /dev/null).
    """

    def __init__(self, cmd: Command, env: dict[str, str] | None = None, cwd: str | None = None, *,
                 echo: Callable[[str], None] | None = None, stdin: bool = False) -> None:
        self.cmd = cmd
        self._lines: list[str] = []
        self._cursor = 0
        self._last_output = time.monotonic()
        self._cond = threading.Condition()
        self._eof = False
        self._echo = echo
        self.popen = subprocess.Popen(cmd, shell=isinstance(cmd, str),
                                      stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                                      env={**os.environ, **(env or {})}, text=True, errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None, "started without stdin=True"
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit code, or None while running (negative: killed by that signal)."""
        return self.popen.poll()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if self._echo is not None:
                try:
                    self._echo(line)
                except Exception:  # a broken echo must not stop the collection
                    pass
            with self._cond:
                self._lines.append(line)
                self._last_output = time.monotonic()
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def output(self) -> str:
        """Everything the process printed so far (stdout and stderr interleaved)."""
        with self._cond:
            return "".join(self._lines)

    def skip_output(self) -> None:
        """Consume every line received so far: the next wait_for_line looks only at later lines."""
        with self._cond:
            self._cursor = len(self._lines)

    def wait_for_line(self, regex: str, timeout: float) -> re.Match:
        """Wait for an output line matching `regex` (re.search) and return the match.

        Lines are consumed like `expect` does: each call looks only at lines after the line the
        previous successful call matched, so waiting for a name that also appeared in start-up
        output does not return early. Raises TimeoutError (with the output tail) when `timeout`
        passes or the process exits first.
        """
        pattern = re.compile(regex)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                while self._cursor < len(self._lines):
                    line = self._lines[self._cursor]
                    self._cursor += 1
                    m = pattern.search(line)
                    if m:
                        return m
                if self._eof:
                    why = f"process exited ({self.popen.wait()})"
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    why = f"no match within {timeout:g} s"
                    break
                self._cond.wait(min(left, 1.0))
        tail = "".join(self._lines[-30:])
        raise TimeoutError(f"{why} waiting for /{regex}/ from {self.cmd!r}; output tail:\n{tail}")

    def wait_output_settled(self, quiet_seconds: float, timeout: float) -> bool:
        """Wait until the process printed nothing for `quiet_seconds` (or exited).

        Under TCG, symbolizing one deep stack can take seconds: use this rather than a fixed sleep
        before stopping a tracer. Returns False if output was still flowing after `timeout`.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._eof:
                quiet_until = self._last_output + quiet_seconds
                now = time.monotonic()
                if now >= quiet_until:
                    return True
                if now >= deadline:
                    return False
                self._cond.wait(min(quiet_until, deadline) - now)
        return True

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it exits on its own within `timeout`; None if it is still running."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout: float = 30, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (background processes inherit SIGINT ignored: send SIGINT only to programs that install
        their own handler), SIGKILL after `timeout`; returns rc."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        self._reader.join(5)
        return rc

    def kill(self) -> int:
        """SIGKILL and reap; returns rc."""
        if self.popen.poll() is None:
            self.popen.kill()
        rc = self.popen.wait()
        self._reader.join(5)
        return rc


def remove_cgroups(dirs: Sequence[object], tries: int = 20, wait_s: float = 0.5) -> None:
    """rmdir each cgroup (children first: give them in that order); a cgroup goes only once its last
    process has exited, which a killed process takes a moment to do."""
    for d in dirs:
        for _ in range(tries):
            try:
                os.rmdir(d)  # type: ignore[arg-type]
                break
            except OSError:
                time.sleep(wait_s)

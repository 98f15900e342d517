"""One run of the installed `retsnoop-otel` as a user would type it, measured: exit code, output, wall time and
peak memory (its maximum resident set, from GNU time), with a hard timeout so a hang is a finding, not a stuck
test.

A case names the files it needs under `files`; their contents are text, {"hex": ...} bytes, or one of the kinds
a user may point at by mistake ({"kind": "fifo" | "dir" | "devzero" | "devnull" | "symlink-devzero" | "big"}).
In arguments, environment values and file contents, "{tmp}" is the case's own directory and "{rep:TEXT:N}" is
TEXT N times (so that the corpus stays small).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMAND = Path(sys.executable).with_name("retsnoop-otel")  # the console script pip installed into the venv
# the package of this checkout: an editable install made from another checkout (a git worktree's) would run that one
REPO = Path(__file__).resolve().parents[1]
# GNU time forks the command from its own small process and reports the command's peak RSS: the wait4() of
# this (large) pytest process would also count what fork() copied of it before the exec (302 MB in make test).
PEAK_MEMORY = ("/usr/bin/time", "-f", "%M", "-o")
# In a user namespace of its own the command holds no capability over the host's kernel: whatever the host
# allows, valid input ends at the privilege check, and nothing can be attached (util-linux's unshare execs it).
UNPRIVILEGED = ("unshare", "--user")
CORPUS = Path(__file__).parent / "fixtures" / "fuzz_corpus.jsonl"  # the reproducers of every class found so far
TIMEOUT_S = 15.0  # a hang detector (a refusal takes ~0.2 s), generous for a loaded two-core CI host
# valid input ends here on a host without the privileges or the kernel to trace
TRACING_REFUSED = ("needs root or the CAP_BPF and CAP_PERFMON capabilities", "kernel functions cannot be traced here")
KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # nothing else of the caller's (no OTEL_* of the host)


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, object] = field(default_factory=dict)
    # "refused": exit 2; "valid": reaches this host's kernel refusal; "warned": that too, after a warning about an
    # OTEL_* variable it ignores; "either"
    expect: str = "refused"
    secret: str = ""  # a value that must never be echoed
    why: str = ""
    # where stdout and stderr go: "" a file the outcome reads, "full" /dev/full, "closed" a pipe whose reader left
    stdout: str = ""
    stderr: str = ""

    def show(self) -> str:
        streams = "".join(f" {name}={kind}" for name, kind in (("stdout", self.stdout), ("stderr", self.stderr))
                          if kind)
        return (f"argv={list(self.argv)!r} env={self.env!r} files={ {k: _short(v) for k, v in self.files.items()} }"
                + streams)


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True)
class Outcome:
    code: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    max_rss_mb: float


_REPEAT = re.compile(r"\{rep:([^:{}]*):(\d+)\}")


def expand(text: str, tmp: Path) -> str:
    return _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), text.replace("{tmp}", str(tmp)))


def _place(tmp: Path, name: str, content: object) -> None:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(expand(content, tmp))
        return
    assert isinstance(content, dict), content
    if "hex" in content:
        path.write_bytes(bytes.fromhex(content["hex"]))
        return
    kind = content["kind"]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind in ("devzero", "devnull", "symlink-devzero"):
        os.symlink("/dev/null" if kind == "devnull" else "/dev/zero", path)
    elif kind == "big":  # a regular file of `size` bytes of one repeated line
        line = content.get("line", "x\n").encode()
        with open(path, "wb") as f:
            f.write(line * (int(content["size"]) // len(line) + 1))
    else:
        raise ValueError(f"unknown file kind {kind!r}")


def run_case(case: Case, tmp: Path, timeout_s: float) -> Outcome:
    """Runs `retsnoop-otel ARGV` in `tmp`, stdin from /dev/null, killed after `timeout_s`."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name, content in case.files.items():
        _place(tmp, name, content)
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env["PYTHONPATH"] = str(REPO)
    env.update({k: expand(v, tmp) for k, v in case.env.items()})
    out_path, err_path, rss_path = tmp / ".stdout", tmp / ".stderr", tmp / ".maxrss"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        argv = [*PEAK_MEMORY, str(rss_path), *UNPRIVILEGED, str(COMMAND), *(expand(a, tmp) for a in case.argv)]
        targets = [_target(case.stdout, out.fileno()), _target(case.stderr, err.fileno())]
        try:
            proc = subprocess.Popen(argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL, stdout=targets[0],
                                    stderr=targets[1], process_group=0)  # a timeout kills what it started too
        finally:
            for fd, own in zip(targets, (out.fileno(), err.fileno()), strict=True):
                if fd != own:
                    os.close(fd)
    try:
        code: int | None = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    seconds = time.monotonic() - t0
    return Outcome(code, _text(out_path), _text(err_path), seconds, _peak_mb(rss_path))


def _target(kind: str, own: int) -> int:
    """The descriptor a stream of the command gets: its file (`own`), /dev/full, or a pipe already read to its end
    and closed by its reader (a `head` that left). The caller closes what is not `own` once the command has it."""
    if kind == "full":
        return os.open("/dev/full", os.O_WRONLY)
    if kind == "closed":
        r, w = os.pipe()
        os.close(r)
        return w
    assert kind == "", kind
    return own


def _peak_mb(path: Path) -> float:
    """GNU time's %M (KiB), the last line of its -o file (a line about a failing exit may come first)."""
    lines = _text(path).split() if path.exists() else []
    return int(lines[-1]) / 1024 if lines and lines[-1].isdigit() else 0.0


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "replace")


def config_paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every key and list index of a config (nested dicts and lists), as paths from the top: the places a
    mutation can hit (the fuzz's generated configs, the black-box bench's)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in [(*prefix, k), *config_paths(v, (*prefix, k))]]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in [(*prefix, i), *config_paths(v, (*prefix, i))]]
    return []


def load_corpus() -> list[Case]:
    cases = []
    for line in CORPUS.read_text().splitlines():
        d = json.loads(line)
        cases.append(Case(tuple(d["argv"]), d.get("env", {}), d.get("files", {}), d.get("expect", "refused"),
                          d.get("secret", ""), d["why"], d.get("stdout", ""), d.get("stderr", "")))
    return cases

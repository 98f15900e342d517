"""Every `retsnoop-otel` command line the documentation shows, run with the real command on this host (issue 43).

A page that shows a command a user copies must show one the tool takes: each runs here (from the repo root, its
paths as a host has them: /etc/retsnoop-otel/agent.yaml is the shipped config/agent.yaml), and none may be
refused as bad input (exit 2, a usage line). This host refuses kernel tracing, so a command that would trace
exits 1 here with that one line, which is fine; where the page shows what the command printed (a line starting
`retsnoop-otel:` right after it), the run must print that very line when the line is about the input (exit 2)
or an environment warning, neither of which depends on the kernel. The files a command names are made where it
expects them (the user-functions guide's /tmp/ua), or in a folder that stands for theirs (the web-tls guide's
/etc/tls). The PromQL the pages show is run by a real Prometheus in tests/test_dashboard_traces.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.dashboard_files import DOC_PAGES, REPO

TIMEOUT_S = 60.0  # a command that runs (traces user functions, serves) is stopped then: it was not refused
HOST_PATHS = {"/etc/retsnoop-otel/agent.yaml": "config/agent.yaml"}
WEB_DIR = "/etc/tls"  # where the web-tls guide's files are: made in a folder of the test's, which stands for it
_CMD = re.compile(r"^(?:\$ )?(?:sudo )?(?:\w+=\S+ )*(?:sudo )?(?:\S*/)?retsnoop-otel (?!:)")


class DocCommand(NamedTuple):
    where: str
    line: str
    shown: str  # the `retsnoop-otel: ...` line printed under it on the page, or ""


def doc_commands() -> list[DocCommand]:
    out: list[DocCommand] = []
    for pattern in DOC_PAGES:
        for page in sorted(REPO.glob(pattern)):
            rel = str(page.relative_to(REPO))
            text = page.read_text()
            lines, fence, i = text.splitlines(), None, 0
            while i < len(lines):
                line = lines[i]
                if line.startswith("```"):
                    fence = None if fence is not None else line[3:].strip()
                elif fence in ("", "sh", "bash", "console", "shell") and _CMD.match(line.strip()):
                    full = line.strip().removeprefix("$ ")
                    while full.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        full = full[:-1] + " " + lines[i].strip()
                    nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
                    out.append(DocCommand(f"{rel}:{i + 1}", full, nxt if nxt.startswith("retsnoop-otel") and
                                          re.match(r"retsnoop-otel(?: agent)?: ", nxt) else ""))
                i += 1
            for m in re.finditer(r"`((?:sudo )?retsnoop-otel [^`]+)`", text):
                words = m.group(1).split()
                if len(words) > 2 + (words[0] == "sudo"):  # `retsnoop-otel trace` names a command, it is no line
                    out.append(DocCommand(f"{rel} (inline)", " ".join(words), ""))
    return out


def _argv(line: str) -> tuple[dict[str, str], list[str]] | None:
    """(environment, arguments after retsnoop-otel); None for a line with a placeholder (FILE, ...)."""
    words = shlex.split(line, comments=True)
    env: dict[str, str] = {}
    while words and (words[0] == "sudo" or re.fullmatch(r"\w+=\S*", words[0])):
        word = words.pop(0)
        if word != "sudo":
            key, _, value = word.partition("=")
            env[key] = value
    assert words and words[0].endswith("retsnoop-otel"), line
    args = [HOST_PATHS.get(w, w) for w in words[1:]]
    if any(w in ("FILE", "...", "PID") or w.startswith("<") for w in args):
        return None
    return env, args


COMMANDS = doc_commands()


def test_the_pages_show_commands() -> None:
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.fixture(scope="module")
def user_app() -> None:
    """The application of the user-functions guide, where the guide has it (/tmp/ua)."""
    subprocess.run(["gcc", "-O1", "-g", "-o", "/tmp/ua", str(REPO / "tests" / "native" / "user_app.c")], check=True)


@pytest.fixture(scope="module")
def web_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The web-tls guide's refused web configs: a key_file that is not the key of its certificate, a bcrypt cost
    past the bound."""
    from tests.tls_certs import make_ca
    d = tmp_path_factory.mktemp("tls")
    make_ca(d, "server")
    make_ca(d, "other")  # another key pair: its key does not match server.crt
    (d / "web.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n")
    (d / "web-hash.yml").write_text("basic_auth_users:\n  alice: $2b$31$" + "N" * 53 + "\n")  # cost 31
    return d


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.where} {c.line[:60]}" for c in COMMANDS])
def test_a_documented_command_is_taken(cmd: DocCommand, user_app: None, web_dir: Path) -> None:
    parsed = _argv(cmd.line)
    if parsed is None:
        assert re.search(r"\b(FILE|PID)\b|\.\.\.|<", cmd.line)  # a form with a placeholder, not a line to run
        return
    env, args = parsed
    cwd = web_dir if "--web.config.file" in args else REPO
    try:
        res = subprocess.run([sys.executable, "-m", "retsnoop_otel", *args], cwd=cwd, capture_output=True,
                             text=True, timeout=TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    except subprocess.TimeoutExpired:
        return  # it ran (a trace of user functions, a server): taken
    said = [line.replace(str(web_dir), WEB_DIR) for line in res.stderr.splitlines() if line.startswith("retsnoop-otel")]
    if cmd.shown and (res.returncode == 2 or ": warning: " in cmd.shown):
        assert cmd.shown in said, (cmd, res.stderr[-2000:])
        return
    assert res.returncode != 2 and "usage:" not in res.stderr, (cmd, res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]


def test_an_input_error_the_pages_show_is_what_the_tool_says() -> None:
    """At least the refusals of bad input the host guide shows are compared line for line (exit 2)."""
    shown = [c for c in COMMANDS if c.shown and " warning: " not in c.shown]
    assert len(shown) >= 3, shown


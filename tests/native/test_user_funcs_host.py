"""User-space functions on this host (issue 35): its kernel refuses kernel-function tracing but runs uprobes, so the
command line traces tests/native/user_app.c's handle_request() tree here, in each user attach mode, as text, --json
and OTLP spans at a real receiver; filters apply; bad specs get one line. The same tree with the syscall and the
kernel chain under handle_request runs in the VM (tests/vm/test_user_funcs.py): kernel functions need kprobes or
fentry, which this host lacks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.otlp_json import attributes
from tests.otlp_json import spans as otlp_spans
from tests.procs import Proc

SRC = Path(__file__).resolve().parent / "user_app.c"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("user_app") / "user_app"
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-o", str(out), str(SRC)], check=True)
    return str(out)


def specs(app: str) -> list[str]:
    return ["-e", f"u:{app}:handle_request", "-a", f"u:{app}:parse_request", "-a", f"u:{app}:find_handler=null"]


def trace(args: list[str], run_app: list[str], settle: float = 1.0,
          env: dict[str, str] | None = None) -> tuple[str, int, list[str]]:
    """(tracer output, its exit code, what the app printed): the app runs once the tracer is attached."""
    tracer = Proc([sys.executable, "-m", "retsnoop_otel", "trace", *args], env=env)
    try:
        tracer.wait_for_line(r"Receiving data|retsnoop-otel: (?!warning: )", timeout=60)
        printed = subprocess.run(run_app, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
        tracer.wait_output_settled(settle, timeout=30)
    finally:
        rc = tracer.terminate(timeout=30)
    return tracer.output(), rc, printed


def _table(out: str) -> list[str]:
    m = re.findall(r"^→ handle_request \[user_app\]\n.*?^← handle_request \[user_app\]\s+\[-EINVAL\].*?$", out,
                   re.M | re.S)
    return m


@pytest.mark.parametrize("mode", ["uprobe_session", "uprobe_multi", "uprobe"])
def test_the_application_tree_in_each_user_attach_mode(app: str, mode: str) -> None:
    out, rc, printed = trace([*specs(app), "--user-attach", mode, "-T", "-v"], [app, "2", "50"])
    assert printed == ["request 1 -> -22", "request 2 -> -22"]
    assert f"Using user attach mode {mode}" in out
    tables = _table(out)
    assert len(tables) == 2, out
    for t in tables:
        rows = t.splitlines()
        assert re.fullmatch(r"    ↔ parse_request \[user_app\]\s+\[0\]\s+[\d.]+us", rows[1]), t
        assert re.fullmatch(r"    ↔ find_handler \[user_app\]\s+\[0x[0-9a-f]+\]\s+[\d.]+us", rows[2]), t
    assert rc == 0 and "Detaching... DONE" in out


def test_features_offers_the_user_modes_that_attach_here() -> None:
    """The test above attaches in all three modes on this host's kernel (6.13+): `features` offers them all, with
    uprobe.session, the mode auto chooses, first."""
    out = subprocess.run([sys.executable, "-m", "retsnoop_otel", "features"], capture_output=True, text=True,
                         timeout=120).stdout
    row = next(line for line in out.splitlines() if line.split()[:1] == ["user_functions"])
    assert row.split(None, 2)[1:] == ["yes", "uprobe.session, uprobe.multi, single uprobes (default uprobe.session)"]
    assert "User-space functions (u:BINARY:GLOB): possible; uprobe.session" in out


def test_json_and_the_stack_say_the_binary_and_the_source_line(app: str) -> None:
    out, rc, _ = trace([*specs(app), "--json"], [app, "1"])
    objs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    (session,) = [o for o in objs if "origins" not in o]  # then the origin table at stop
    assert [o["origins"][0]["origin"] for o in objs if "origins" in o] == ["handle_request"], objs
    (head,) = session["chain"]
    assert head["function"] == "handle_request" and head["error"] == "EINVAL" and head["binary"] == app
    line = int(head["source"].rsplit(":", 1)[1])
    assert head["source"] == f"{SRC}:{line}" and "handle_request(int n)" in SRC.read_text().splitlines()[line - 1]
    out, rc, _ = trace(specs(app), [app, "1"])
    assert re.search(rf"^\s+\d+us \[-EINVAL\]  handle_request \[user_app\]  \({re.escape(str(SRC))}:{line}\)$",
                     out, re.M), out


def test_otlp_spans_nest_at_a_real_receiver(app: str, tmp_path: Path) -> None:
    out_file = tmp_path / "otlp.jsonl"
    receiver = Proc([sys.executable, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0",
                     "--out", str(out_file)])
    try:
        port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=60).group(1))
        trace([*specs(app), "--otlp-endpoint", f"http://127.0.0.1:{port}"], [app, "1"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (out_file.exists() and out_file.read_text().strip()):
            time.sleep(0.2)
    finally:
        receiver.terminate()
    spans = otlp_spans([json.loads(x) for x in out_file.read_text().splitlines() if x.strip()])
    (root,) = [s for s in spans if not s.get("parentSpanId")]
    assert root["name"] == "handle_request" and root["attrs"]["error.type"] == "EINVAL"
    assert root["status"]["code"] == "STATUS_CODE_ERROR" and root["attrs"]["retsnoop.binary"] == app
    assert root["attrs"]["code.file.path"] == str(SRC) and root["attrs"]["retsnoop.return_kind"] == "int32"
    kids = {s["name"]: s for s in spans if s.get("parentSpanId") == root["spanId"]}
    assert set(kids) == {"parse_request", "find_handler"}
    assert kids["find_handler"]["attrs"]["retsnoop.return_kind"] == "null"
    assert "error.type" not in kids["find_handler"]["attrs"]
    assert kids["parse_request"]["attrs"]["retsnoop.result"] == "0"


def _console_spans(out: str) -> list[dict]:
    """The spans of the OTLP/JSON lines OTEL_TRACES_EXPORTER=console printed (the Collector's file format: hex
    ids, integer enums), each with its `attrs`."""
    head = '{"resourceSpans"'  # at the start of a line, or after "Detaching... " when sent at the end
    docs = [json.loads(line[line.index(head):]) for line in out.splitlines() if head in line]
    return [{**s, "attrs": attributes(s.get("attributes", []))} for d in docs for rs in d["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]


def _receiver(tmp_path: Path) -> tuple[Proc, int, Path]:
    out_file = tmp_path / "otlp.jsonl"
    receiver = Proc([sys.executable, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0",
                     "--out", str(out_file)])
    return receiver, int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=60).group(1)), out_file


def test_the_console_exporter_prints_the_spans_as_otlp_json_lines(app: str, tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER=console: each export request as one OTLP/JSON line on stdout, the same nested spans
    as at a receiver; console alone replaces the OTLP export (the endpoint variable's receiver gets nothing)."""
    receiver, port, out_file = _receiver(tmp_path)
    try:
        out, rc, _ = trace(specs(app), [app, "1"], env={"OTEL_TRACES_EXPORTER": "console",
                                                        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
        time.sleep(1)
    finally:
        receiver.terminate()
    assert rc == 0 and "warning" not in out, out
    spans = _console_spans(out)
    (root,) = [s for s in spans if not s.get("parentSpanId")]
    assert root["name"] == "handle_request" and root["attrs"]["error.type"] == "EINVAL"
    assert root["status"]["code"] == 2 and len(root["traceId"]) == 32 and len(root["spanId"]) == 16  # hex ids
    kids = {s["name"] for s in spans if s.get("parentSpanId") == root["spanId"]}
    assert kids == {"parse_request", "find_handler"}
    assert re.search(r"handle_request \[user_app\]", out)  # the trace command's own output stays
    assert not (out_file.exists() and out_file.read_text().strip())  # nothing sent over OTLP


def test_bad_variables_are_warned_about_once_and_the_next_source_applies(app: str, tmp_path: Path) -> None:
    """otlp,console plus an exporter this tool has not; a per-signal endpoint that is no URL falls back to the
    generic one; a sampler is not used: one warning each, then the spans go to the receiver and the console."""
    receiver, port, out_file = _receiver(tmp_path)
    env = {"OTEL_TRACES_EXPORTER": "otlp,console,zipkin", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    try:
        out, rc, _ = trace(specs(app), [app, "1"], env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (out_file.exists() and out_file.read_text().strip()):
            time.sleep(0.2)
    finally:
        receiver.terminate()
    assert rc == 0, out
    warnings = [line for line in out.splitlines() if line.startswith("retsnoop-otel: warning: ")]
    assert [w.split(": ")[2].split("=")[0] for w in warnings] == [
        "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER"], warnings
    assert warnings[0].endswith("'zipkin' is not an exporter this tool has (otlp, console, none); left out, "
                                "otlp,console used"), warnings[0]
    assert warnings[1].endswith("not a valid URL (Invalid IPv6 URL); write it like http://collector:4318 (IPv6: "
                                "http://[::1]:4317); ignored, as if unset"), warnings[1]
    sent = otlp_spans([json.loads(x) for x in out_file.read_text().splitlines() if x.strip()])
    printed = _console_spans(out)
    assert sorted(s["name"] for s in sent) == sorted(s["name"] for s in printed) == [
        "find_handler", "handle_request", "parse_request"]


def test_pid_and_comm_filters_apply_to_user_sessions(app: str, tmp_path: Path) -> None:
    other = tmp_path / "other_app"
    other.write_bytes(Path(app).read_bytes())
    other.chmod(0o755)
    both = ["sh", "-c", f"{app} 1 & {other} 1; wait"]
    out, _, _ = trace([*specs(app), "-n", "user_app"], both)
    assert len(re.findall(r"TID/PID \d+/\d+ \((\S+)/", out)) == 1 and "(user_app/user_app)" in out, out
    out, _, _ = trace([*specs(app), "-N", "user_app"], both)
    assert "TID/PID" not in out, out  # the copy is another binary: its functions are not attached at all


@pytest.mark.parametrize(("spec", "says"), [
    ("u:{app}:no_such_function", "Entry glob 'u:{app}:no_such_function' doesn't match any function of {app}"),
    ("u:{app}:handle_request=sometimes", "unknown error rule 'sometimes'"),
    ("u:/nonexistent/app:f", "'/nonexistent/app': no such file"),
    ("u:libnothere.so.9:f", "'libnothere.so.9': not found in PATH or ld.so's search path"),
])
def test_bad_user_specs_get_one_line_and_exit_2(app: str, spec: str, says: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "retsnoop_otel", "trace", "-e", spec.format(app=app)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1 and says.format(app=app) in proc.stderr, proc.stderr


def test_a_binary_that_is_no_regular_file_says_what_it_is_in_one_line_and_exit_2(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to("loop")
    for path, why in ((str(tmp_path), "is a directory"), (str(tmp_path / "fifo"), "not a regular file (a FIFO)"),
                      ("/dev/null", "not a regular file (a character device)"),
                      (str(tmp_path / "loop"), "too many levels of symbolic links")):
        proc = subprocess.run([sys.executable, "-m", "retsnoop_otel", "trace", "-e", f"u:{path}:f"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert proc.stderr == f"retsnoop-otel: '{path}': {why} (give the path of an executable or shared library)\n"


def _mapped_libc() -> str:
    """This machine's libc.so.6, as this process mapped it (/lib/x86_64-linux-gnu/libc.so.6 on Debian's x86-64)."""
    with open("/proc/self/maps") as f:
        return next(os.path.realpath(p) for line in f if os.path.basename(p := line.split()[-1]) == "libc.so.6")


def _dynsym(path: str) -> dict[str, int]:
    """readelf's .dynsym: name as it prints it (with @VERSION or @@VERSION) -> address, for the functions."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return {r[7]: int(r[1], 16) for r in rows if len(r) >= 8 and r[3] in ("FUNC", "IFUNC") and r[6] != "UND"}


def test_libc_libc_so_and_libc_so_6_are_this_machines_libc(tmp_path: Path) -> None:
    """Debian's libc.so (beside libc.so.6, in the same directory) is a GNU ld script: `libc` and `libc.so` mean the
    SONAME'd libc.so.6, as ld.so's cache says, not that text file."""
    from retsnoop_otel.symbols.user_funcs import resolve_binary
    libc = _mapped_libc()
    assert [resolve_binary(name) for name in ("libc", "libc.so", "libc.so.6")] == [libc] * 3
    proc = subprocess.run([sys.executable, "-m", "retsnoop_otel", "trace", "-e", "u:libc.so:getpid", "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and f"    getpid [u:{libc}]  errors: errno" in proc.stdout, proc
    # the cache is read as ldconfig prints it
    from retsnoop_otel.symbols.user_funcs import _ld_cache
    ldconfig = next(p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p))
    printed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=True).stdout.splitlines()[1:]
    assert {(n, p) for n, p, _h in _ld_cache("/")} == \
        {(line.split()[0], line.split(" => ")[1]) for line in printed if " => " in line}


def test_libc_weak_and_versioned_aliases_name_one_function(tmp_path: Path) -> None:
    """glibc's getpid is a weak alias of its global __getpid (one address, two names, each versioned in .dynsym:
    getpid@@GLIBC_2.2.5); realpath@@GLIBC_2.3 is what `realpath` binds to now, realpath@GLIBC_2.2.5 the old one kept
    for programs linked before 2.3. A glob matches any name of an address; the address is attached once."""
    from retsnoop_otel.symbols.user_funcs import UserFuncError, discover_user
    libc = _mapped_libc()
    syms = _dynsym(libc)

    def found(*globs: str, deny: tuple[str, ...] = ()) -> list[tuple[str, int]]:
        funcs, _ = discover_user([f"u:libc.so.6:{g}" for g in globs], [], [f"u:libc.so.6:{d}" for d in deny], 1,
                                 lines=False)
        assert {f.binary for f in funcs} == {libc}
        return [(f.name, f.addr) for f in funcs]

    getpid = syms["__getpid@@GLIBC_2.2.5"]
    assert syms["getpid@@GLIBC_2.2.5"] == getpid
    assert found("getpid") == [("getpid", getpid)] and found("__getpid") == [("__getpid", getpid)]
    assert found("getpid@@GLIBC_2.2.5") == [("getpid@@GLIBC_2.2.5", getpid)]
    assert found("*getpid") == [("getpid", getpid)]  # two names, one function, named without the underscores
    assert found("getpid", "__getpid", "getpid@*") == [("getpid", getpid)]  # the first name given, once
    with pytest.raises(UserFuncError, match="^every user entry function was denied: u:libc.so.6:getpid$"):
        found("getpid", deny=("__getpid",))  # a deny matches any name of the address too
    assert found("realpath") == [("realpath", syms["realpath@@GLIBC_2.3"])]
    assert found("realpath@GLIBC_2.2.5") == [("realpath@GLIBC_2.2.5", syms["realpath@GLIBC_2.2.5"])]
    assert syms["realpath@GLIBC_2.2.5"] != syms["realpath@@GLIBC_2.3"]


def test_a_kernel_glob_beside_user_functions_says_why_this_host_cannot(app: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "retsnoop_otel", "trace", *specs(app), "-a", "*sys_bpf"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert "kernel functions cannot be traced here" in proc.stderr


def test_user_sessions_join_the_application_trace_that_called_them(tmp_path: Path) -> None:
    """tests/native/ctx_writer.c publishes OTel thread context, then each thread's handle_request() (a local symbol)
    calls libsimkern's sk_syscall(), which fails: the user session is a child of the thread's own span."""
    here = Path(__file__).parent
    cc = ["gcc", "-O1", "-g", "-Wall"]
    subprocess.run([*cc, "-shared", "-fPIC", "-o", str(tmp_path / "libsimkern.so"), str(here / "simkern.c")],
                   check=True)
    writer = str(tmp_path / "writer_exe")
    subprocess.run([*cc, "-rdynamic", "-o", writer, str(here / "ctx_writer.c"), "-lpthread", "-ldl"], check=True)
    out_file = tmp_path / "otlp.jsonl"
    receiver = Proc([sys.executable, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0",
                     "--out", str(out_file)])
    try:
        port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=60).group(1))
        tracer = Proc([sys.executable, "-m", "retsnoop_otel", "trace", "-e", f"u:{writer}:handle_request",
                       "-a", f"u:{tmp_path}/libsimkern.so:sk_*", "--otlp-endpoint", f"http://127.0.0.1:{port}"])
        try:
            tracer.wait_for_line(r"Receiving data", timeout=60)
            app = Proc([writer, "valid", "2", "sim"], env={"SIMKERN": str(tmp_path / "libsimkern.so")}, stdin=True)
            try:
                app.wait_for_line(r"ready pid=", timeout=30)
                time.sleep(1.5)  # the exec watch finds where it keeps its thread context (a check within 1 s)
                for n in (1, 2):
                    app.send("go")
                    app.wait_for_line(rf"done {n}", timeout=30)
            finally:
                app.terminate(timeout=30)
            tracer.wait_output_settled(1, timeout=30)
        finally:
            tracer.terminate(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and out_file.read_text().count('"handle_request"') < 4 if \
                out_file.exists() else True:
            time.sleep(0.2)
    finally:
        receiver.terminate()
    rounds = re.findall(r"round (\d+) tid=(\d+) trace=([0-9a-f]{32}) span=([0-9a-f]{16}) ret=(-?\d+)", app.output())
    assert len(rounds) == 4 and all(r[4] == "-22" for r in rounds), app.output()
    spans = otlp_spans([json.loads(x) for x in out_file.read_text().splitlines() if x.strip()])
    roots = [s for s in spans if s["name"] == "handle_request"]
    got = sorted((s["attrs"]["thread.id"], s["trace"], s["parent"]) for s in roots)
    assert got == sorted((int(tid), trace, span) for _, tid, trace, span, _ in rounds), got
    for root in roots:  # the library's functions under it, in its trace
        kids = [s["name"] for s in spans if s["parent"] == root["id"]]
        assert kids == ["sk_syscall"] and root["attrs"]["error.type"] == "EINVAL", kids

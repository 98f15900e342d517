"""The thread-context reader end to end on the host: real BPF programs (uprobes on libsimkern.so, which
ctx_writer calls from its threads), the real locator, watcher and user-stack symbolizer.

The VM scenario (tests/vm/scenarios/app_context.py) repeats the important cases on kernel functions with
the agent and a real OTLP receiver; these run in seconds, so every writer variant is covered here.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest

from retsnoop_otel.appctx.process_readers import AppSources
from retsnoop_otel.appctx.watch import SWEEP_S, AppWatcher
from retsnoop_otel.capture import records
from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.capture.records import AppExecRec, AppProbeRec
from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.user_funcs import in_binary

HERE = Path(__file__).parent
FUNCS = [TracedFunc(0, "sk_syscall", 0, RetKind.SIGNED, True), TracedFunc(1, "sk_check", 0, RetKind.INT32, False)]
ROUND = re.compile(r"round (\d+) tid=(\d+) trace=([0-9a-f]{32}) span=([0-9a-f]{16}) ret=(-?\d+)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("ctx")
    cc = ["gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Werror"]
    subprocess.run([*cc, "-shared", "-fPIC", "-o", str(d / "libsimkern.so"), str(HERE / "simkern.c")], check=True)
    subprocess.run([*cc, "-shared", "-fPIC", "-mtls-dialect=gnu2", "-o", str(d / "libctxlib.so"),
                    str(HERE / "ctxlib.c")], check=True)
    subprocess.run([*cc, "-rdynamic", "-o", str(d / "writer_exe"), str(HERE / "ctx_writer.c"), "-lpthread", "-ldl"],
                   check=True)
    subprocess.run([*cc, "-DCTX_LIB", "-o", str(d / "writer_lib"), str(HERE / "ctx_writer.c"), f"-L{d}", "-lctxlib",
                    f"-Wl,-rpath,{d}", "-lpthread", "-ldl"], check=True)
    return {"dir": str(d), "exe": str(d / "writer_exe"), "lib": str(d / "writer_lib"),
            "simkern": str(d / "libsimkern.so")}


class Run:
    """One writer process under one tracer, driven round by round."""

    def __init__(self, built: dict[str, str], variant: str, mode: str, threads: int, user_stacks: bool = False,
                 app_context: bool = True) -> None:
        self.proc = subprocess.Popen([built[variant], mode, str(threads), "sim"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "SIMKERN": built["simkern"]})
        assert self.proc.stdout is not None and self.proc.stdin is not None
        ready = self.proc.stdout.readline()
        assert ready.startswith("ready pid="), ready
        self.pid = int(ready.split("=")[1])
        self.threads = threads
        self.ids: dict[int, dict[int, tuple[int, int]]] = {}  # round -> tid -> (trace id, span id)
        self.sessions: list = []
        self.watcher = AppWatcher(AppSources.from_proc("/proc", user_stacks), time.monotonic, EventLog(level="error"),
                                  read_app=app_context)
        self.tracer = Tracer(in_binary(FUNCS, built["simkern"]),
                             CaptureConfig(mode="", user_mode="uprobe", pids=[self.pid], app_context=app_context,
                                           user_stacks=user_stacks))
        self.tracer.load()
        self.tracer.attach(strict=True)
        self.watcher.set_targets([self.tracer])
        assembler = SessionAssembler()

        def on_record(rec):
            if isinstance(rec, AppProbeRec):
                self.watcher.asked(rec.tgid)
            elif (s := assembler.feed(rec)) is not None:  # out once its user stack is symbolized, in order
                self.watcher.hold(None, self.watcher.annotate(s))
        self.tracer.open_ring_buffer(on_record)

    def round(self) -> list:
        """One round: every thread makes the call once; returns that round's sessions."""
        before = len(self.sessions)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, "the writer exited"
            if line.startswith("done"):
                break
            m = ROUND.match(line)
            assert m, line
            self.ids.setdefault(int(m[1]), {})[int(m[2])] = (int(m[3], 16), int(m[4], 16))
        while self.tracer.poll(20):
            pass
        self.sessions.extend(s for _, s in self.watcher.due(wait=True))
        self.watcher.service()
        return self.sessions[before:]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(10)
        self.tracer.close()
        self.watcher.close()


@pytest.fixture
def run(built):
    runs: list[Run] = []

    def start(*args, **kw) -> Run:
        runs.append(Run(built, *args, **kw))
        return runs[-1]
    yield start
    for r in runs:
        r.close()


@pytest.mark.parametrize("variant", ["exe", "lib"])
def test_each_thread_joins_its_own_context(run, variant):
    """TLS in the executable (-rdynamic) and in a TLSDESC library: the first round only asks about the
    process; from the second on, each session carries the context its own thread held."""
    r = run(variant, "valid", 3)
    first = r.round()
    assert len(first) == 3 and all(s.app is None for s in first)  # the process was not located yet
    second = r.round()
    assert len(second) == 3
    for s in second:
        assert s.app is not None and s.app.status == "ok" and s.app.sampled, s.app
        assert (s.app.trace_id, s.app.span_id) == r.ids[2][s.tid]
        assert s.app.attrs == b"\x00\x0a/users/:id" and not s.app.attrs_cut
    assert len({s.app.trace_id for s in second}) == 3
    assert r.watcher.counters.sessions["linked"] == 3 and r.watcher.counters.processes_publishing == 1


@pytest.mark.parametrize("mode,status", [("invalid", "invalid"), ("null", "no_record"), ("unsampled", "ok"),
                                         ("badptr", "fault"), ("pagedout", "fault")])
def test_unusable_contexts_are_reported_as_such(run, mode, status):
    """Unreadable user memory (an unmapped pointer, a record whose page is not present: BPF cannot fault
    it in) is a fault with its errno; the session itself arrives like any other."""
    r = run("exe", mode, 1)
    r.round()
    (s,) = r.round()
    assert s.app is not None and s.app.status == status, s.app
    assert s.app.usable == (mode == "unsampled") and not s.app.sampled
    assert s.is_err and (s.app.error == 14) == (status == "fault")  # EFAULT


def test_a_corrupt_size_is_cut_and_the_session_still_arrives(run):
    r = run("lib", "bigsize", 1)
    r.round()
    (s,) = r.round()
    assert s.app is not None and s.app.status == "ok" and s.app.attrs_cut and len(s.app.attrs) == 612
    assert s.app.trace_id == r.ids[2][s.tid][0]


def app_targets(tracer: Tracer) -> dict[int, tuple[int, int, int, int]]:
    """The kernel's app_targets map as the watcher left it: tgid -> (tp_offset, offset, modid, flags)."""
    m = tracer._map("app_targets")
    out = {}
    for key in list(m.keys()):
        value = m.lookup(key)
        if value is not None:
            out[struct.unpack("<I", key)[0]] = records.APP_TLS.unpack(value)
    return out


def test_process_without_thread_context_is_marked_as_such(run):
    r = run("exe", "valid", 1)
    r.round()
    assert app_targets(r.tracer)[r.pid][3] == 0  # located: flags 0
    r.watcher.asked(os.getpid())  # pytest's own process has no otel_thread_ctx_v1
    for _ in range(200):  # a check that runs past its turn's 10 ms goes on at the next (pytest maps many libraries)
        r.watcher.service()
        if os.getpid() in app_targets(r.tracer):
            break
    assert app_targets(r.tracer)[os.getpid()][3] == 1  # APP_TLS_NONE


def test_exited_process_is_forgotten(run):
    r = run("exe", "valid", 1)
    r.round()
    assert r.pid in app_targets(r.tracer)
    assert r.proc.stdin is not None
    r.proc.stdin.close()
    r.proc.wait(10)
    time.sleep(SWEEP_S + 0.05)
    r.watcher.service()
    assert r.pid not in app_targets(r.tracer)


def test_user_stacks_name_the_writers_functions_in_order(run):
    r = run("exe", "valid", 1, user_stacks=True, app_context=False)
    r.round()
    (s,) = r.round()
    assert s.app is None and s.ustack, "no user stack taken"
    names = [f.function for f in s.user_frames if not f.inlined]
    # taken when the session ends (here in the uretprobe: the ip is the return site in the caller), innermost
    # first, then the callers by frame pointers
    assert names[:3] == ["make_failing_call", "handle_request", "worker"], names
    by_name = {f.function: f for f in s.user_frames}
    assert by_name["worker"].module.endswith("writer_exe") and by_name["worker"].file.endswith("ctx_writer.c")
    assert by_name["handle_request"].line is not None


@pytest.mark.parametrize("variant", ["exe", "lib"])
def test_a_process_started_after_the_tracer_is_located_from_its_exec(built, variant):
    """The exec hook (raw tracepoint sched_process_exec, allowed on this host) reports the writer as it starts,
    the watcher locates the variable while no session of it ran yet, and its first session joins its trace.
    The probe set's comm filter applies to the hook: other programs exec'd meanwhile are not reported."""
    name = os.path.basename(built[variant])
    watcher = AppWatcher(AppSources.from_proc("/proc", False), time.monotonic, EventLog(level="error"))
    tracer = Tracer(in_binary(FUNCS, built["simkern"]), CaptureConfig(mode="", user_mode="uprobe", comms=[name],
                                         app_context=True))
    sessions, execs, probes = [], [], []
    assembler = SessionAssembler()

    def on_record(rec):
        if isinstance(rec, AppExecRec):
            execs.append(rec.tgid)
            watcher.born(rec.tgid)
        elif isinstance(rec, AppProbeRec):
            probes.append(rec.tgid)
            watcher.asked(rec.tgid)
        elif (s := assembler.feed(rec)) is not None:
            sessions.append(watcher.annotate(s))

    def turn():
        tracer.poll(20)
        watcher.service()
    proc = None
    try:
        tracer.load()
        tracer.attach(strict=True)
        watcher.set_targets([tracer])
        watcher._backlog = []  # the processes running before: not this test's
        tracer.open_ring_buffer(on_record)
        subprocess.run(["true"], check=True)  # not in the filter: not reported
        proc = subprocess.Popen([built[variant], "valid", "2", "sim"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "SIMKERN": built["simkern"]})
        assert proc.stdout is not None and proc.stdin is not None
        deadline = time.monotonic() + 60
        while watcher.counters.exec_watches["located"] == 0 and time.monotonic() < deadline:
            turn()
        assert execs == [proc.pid], execs
        assert watcher.counters.exec_watches["located"] == 1, watcher.counters.exec_watches
        assert app_targets(tracer)[proc.pid][3] == 0  # located (flags 0) before any session of it
        assert proc.stdout.readline().startswith("ready pid=")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        ids = {}
        while (line := proc.stdout.readline()) and not line.startswith("done"):
            m = ROUND.match(line)
            assert m, line
            ids[int(m[2])] = (int(m[3], 16), int(m[4], 16))
        deadline = time.monotonic() + 30
        while len(sessions) < 2 and time.monotonic() < deadline:
            turn()
    finally:
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)
        tracer.close()
        watcher.close()
    assert len(sessions) == 2 and probes == []  # no session had to ask
    for s in sessions:  # the first round already joins each thread's own trace
        assert s.app is not None and s.app.status == "ok" and s.app.sampled, s.app
        assert (s.app.trace_id, s.app.span_id) == ids[s.tid]


def test_python_service_through_the_publisher(built):
    """A Python service with the OTel SDK and the publisher (OTEL_PYTHON_CONTEXT): the kernel side reads
    the context of its `load_user` span through the DTV of the dlopen'ed library, with the process
    context's service.name and key map naming the record's attributes."""
    import json
    import sys

    watcher = AppWatcher(AppSources.from_proc("/proc", False), time.monotonic, EventLog(level="error"))
    tracer = Tracer(in_binary(FUNCS, built["simkern"]), CaptureConfig(mode="", user_mode="uprobe", app_context=True))
    sessions: list = []
    assembler = SessionAssembler()

    def on_record(rec):
        if isinstance(rec, AppProbeRec):
            watcher.asked(rec.tgid)
        elif (s := assembler.feed(rec)) is not None:
            sessions.append(watcher.annotate(s))
    try:
        tracer.load()
        tracer.attach(strict=True)
        watcher.set_targets([tracer])
        tracer.open_ring_buffer(on_record)
        env = {**os.environ, "SIMKERN": built["simkern"], "OTEL_PYTHON_CONTEXT": "retsnoop_thread_ctx",
               "OTEL_SERVICE_NAME": "users-service", "RETSNOOP_OTEL_THREAD_ATTRIBUTES": "user.id"}
        svc = subprocess.Popen([sys.executable, "-m", "tests.otel_service", "--call", "sim", "--requests", "5",
                                "--interval", "0.4"], stdout=subprocess.PIPE, text=True, env=env,
                               cwd=HERE.parent.parent)
        assert svc.stdout is not None
        requests = []
        for line in svc.stdout:
            requests.append(json.loads(line))
            deadline = time.monotonic() + 0.25
            while time.monotonic() < deadline:
                tracer.poll(20)
                watcher.service()
        assert svc.wait(30) == 0
        while tracer.poll(20):
            pass
    finally:
        tracer.close()
        watcher.close()
    info, *requests = requests
    assert info["context"] == "retsnoop_thread_ctx" and len(requests) == 5
    assert len(sessions) == 5
    # the first sessions may start before the process was located (its first check parses python's ELF
    # files, hundreds of milliseconds); every session after the first linked one is linked
    first = next(i for i, s in enumerate(sessions) if s.app is not None)
    linked = sessions[first:]
    assert len(linked) >= 2 and all(s.app is not None and s.app.usable for s in linked), [s.app for s in sessions]
    by_trace = {r["trace_id"]: r for r in requests}
    for s in linked:
        req = by_trace[f"{s.app.trace_id:032x}"]
        assert f"{s.app.span_id:016x}" == req["span_id"] and s.tid == req["tid"] and s.app.sampled
        assert s.app.service_name == "users-service"
        assert dict(s.app.attributes) == {"user.id": str(1000 + req["request"])}

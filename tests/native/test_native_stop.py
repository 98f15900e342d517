"""What a session in progress becomes when its tracer stops, by the real BPF object through uprobes.

A reload's handover (set_ready(False)) lets the sessions in progress end and be reported; a stop
(stop_sessions(), detach()'s first step) drops them, so that detach may remove every link at once, in any order,
without reporting a session that lost some of its probes on the way. tests/native/simkern.c's sk_wait keeps its
session open until a byte arrives on a pipe, which puts the switch exactly between a session's start and its end.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from retsnoop_otel.capture.sessions import SessionAssembler
from retsnoop_otel.kernel.capture_config import CaptureConfig
from retsnoop_otel.kernel.tracer import Tracer
from retsnoop_otel.symbols.user_funcs import in_binary
from tests.native.simkern_funcs import drive, simkern_funcs

START_WAIT_S = 60.0  # the other thread's first call: generous on a loaded machine


def test_a_stop_drops_the_sessions_in_progress_where_a_handover_reports_them(simkern):
    path, lib = simkern
    funcs = simkern_funcs()
    tracer = Tracer(in_binary(funcs, path), CaptureConfig(mode="", user_mode="uprobe", pids=[os.getpid()],
                                                           exclude_self=False))
    sessions: list = []
    asm = SessionAssembler()

    def read_all() -> None:
        while tracer.poll(50):
            pass

    def in_progress(switch: Callable[[], None]) -> None:
        """sk_wait's session started on another thread, `switch` made while it waits, then its end."""
        started = tracer.capture_stats().sessions_started
        r, w = os.pipe()
        t = threading.Thread(target=lib.sk_wait, args=(r,))
        t.start()
        deadline = time.monotonic() + START_WAIT_S
        while tracer.capture_stats().sessions_started == started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tracer.capture_stats().sessions_started == started + 1, "sk_wait's session did not start"
        switch()
        os.write(w, b"x")
        t.join()
        os.close(r)
        os.close(w)
        read_all()

    try:
        drive(tracer, lib, [], lambda rec: (s := asm.feed(rec)) and sessions.append(s))
        in_progress(lambda: tracer.set_ready(False))
        assert [[funcs[c.func_id].name for c in s.chain] for s in sessions] == [["sk_wait", "sk_create", "sk_check"]]
        lib.sk_syscall(0)  # not ready: no session starts
        read_all()
        assert len(sessions) == 1

        tracer.set_ready(True)
        in_progress(tracer.stop_sessions)
        assert len(sessions) == 1
        lib.sk_syscall(0)  # stopped: none starts either
        read_all()
        cstats = tracer.capture_stats()
        assert (cstats.sessions_started, cstats.sessions_reported, len(sessions)) == (2, 1, 1)

        tracer.set_ready(True)  # ready again: the stop is over
        lib.sk_syscall(0)
        read_all()
        assert [funcs[s.chain[-1].func_id].name for s in sessions] == ["sk_check", "sk_check"]
    finally:
        tracer.close()

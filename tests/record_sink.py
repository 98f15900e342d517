"""What the tests that drive a Tracer directly keep of its ring buffer: the finished sessions, assembled as the
runtime assembles them (capture/sessions.py), and how many records of each kind came. Shared by the native tests
(uprobes on the host, tests/native/) and the VM scenarios (kernel functions, tests/vm/scenarios/)."""

from __future__ import annotations

from collections import Counter

from retsnoop_otel.capture.records import Record
from retsnoop_otel.capture.sessions import SessionAssembler


class SessionSink:
    """The ring buffer's callback (Tracer.open_ring_buffer, tests/native/simkern_funcs.drive): one per run."""

    def __init__(self) -> None:
        self.sessions: list = []
        self.kinds: Counter = Counter()  # record class name -> records seen
        self._assembler = SessionAssembler()

    def __call__(self, rec: Record) -> None:
        self.kinds[type(rec).__name__] += 1
        if (session := self._assembler.feed(rec)) is not None:
            self.sessions.append(session)

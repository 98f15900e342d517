"""Python `logging` records of libraries into the EventLog: only the agent installs it, so the trace
command does not import `logging` at start."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from retsnoop_otel.command.logs import EventLog


class LibraryLogBridge(logging.Handler):
    """Routes a library's `logging` records (grpc's own warnings, our exporters' debug lines, in
    plain text) into the EventLog, so `logging.format: json` holds for every line. The same message
    is written at most once per `interval_s`; the next one says how many were held back."""

    def __init__(self, log: EventLog, interval_s: float = 60.0, clock: Any = time.monotonic) -> None:
        super().__init__(logging.INFO)
        self._log = log
        self._interval = interval_s
        self._clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, template) -> (last, held back)
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._guard:
            last, held = self._seen.get(key, (float("-inf"), 0))
            if now - last < self._interval:
                self._seen[key] = (last, held + 1)
                return
            if len(self._seen) >= 1024:
                self._seen.clear()
            self._seen[key] = (now, 0)
        level = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}.get(record.levelno, "error")
        fields: dict[str, Any] = {"logger": record.name}
        if held:
            fields["repeated"] = held
        try:
            msg = record.getMessage()
        except (TypeError, ValueError):
            msg = str(record.msg)
        self._log.event(level, msg, **fields)


def bridge_library_logs(log: EventLog, names: tuple[str, ...] = ("grpc", "retsnoop_otel")) -> LibraryLogBridge:
    bridge = LibraryLogBridge(log)
    for name in names:
        logger = logging.getLogger(name)
        logger.handlers[:] = [bridge]
        logger.propagate = False
    return bridge

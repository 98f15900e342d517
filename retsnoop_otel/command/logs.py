"""Structured run logs: one line per event, as `key=value` text or JSON objects (for log shippers).

Events carry fields rather than prose so that a log pipeline can filter on them (probe_set, result,
counts). The agent logs summaries of losses periodically, never one line per dropped span.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _text_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\n'):
        return text
    import json  # only when a line needs quoting or JSON: its import is 0.2 s of an emulated start
    return json.dumps(text)


class EventLog:
    """A small line logger; `configure` switches format/level at run time (config reload)."""

    def __init__(self, stream: TextIO | None = None, fmt: str = "text", level: str = "info",
                 clock: Any = time.time) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._clock = clock
        self.configure(fmt, level)

    def configure(self, fmt: str, level: str) -> None:
        if fmt not in ("text", "json") or level not in LEVELS:
            raise ValueError(f"bad log format/level {fmt!r}/{level!r}")
        self.format = fmt
        self.level = level
        self._min = LEVELS[level]

    def event(self, level: str, msg: str, **fields: Any) -> None:
        if LEVELS[level] < self._min:
            return
        now = self._clock()
        if self.format == "json":
            import json
            line = json.dumps({"ts": round(now, 6), "level": level, "msg": msg, **fields}, default=str)
        else:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
            extra = "".join(f" {k}={_text_value(v)}" for k, v in fields.items())
            line = f"{stamp} {level.upper():7s} {msg}{extra}"
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def debug(self, msg: str, **fields: Any) -> None:
        self.event("debug", msg, **fields)

    def info(self, msg: str, **fields: Any) -> None:
        self.event("info", msg, **fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self.event("warning", msg, **fields)

    def error(self, msg: str, **fields: Any) -> None:
        self.event("error", msg, **fields)

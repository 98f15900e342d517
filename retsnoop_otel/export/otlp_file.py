"""OTLP/JSON lines in a file: each request as one line, the Collector's file exporter format. Also the console
exporter of OTEL_TRACES_EXPORTER=console: the same lines on the command's stdout."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any, TextIO

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError

from retsnoop_otel.export.sending import SendResult, one_line, signal_messages


def _hex_ids(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where the protobuf JSON mapping would use base64."""
    if isinstance(obj, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                    else _hex_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


class OtlpJsonFileSender:
    """Appends each request as one OTLP/JSON line (the collector's file format: integer enums, hex ids).

    With `stream` (stdout), the lines go there, under the name `path`; the stream is flushed after each line and
    left open at shutdown."""

    def __init__(self, path: str, signal: str = "traces", stream: TextIO | None = None) -> None:
        self.path = path
        self._request_cls = signal_messages(signal)[1]
        self._lock = threading.Lock()
        self._owned = stream is None
        self._closed = False
        # kept open for the sender's life
        self._file = open(path, "a", encoding="utf-8") if stream is None else stream  # noqa: SIM115

    def send(self, body: bytes, items: int) -> SendResult:
        try:
            request = self._request_cls.FromString(body)
        except DecodeError as exc:
            return SendResult(False, error=one_line(f"cannot decode the request: {exc}"))
        doc = _hex_ids(MessageToDict(request, use_integers_for_enums=True))
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        with self._lock:
            if self._closed or self._file.closed:
                return SendResult(False, error="sender is shut down")
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                return SendResult(False, error=one_line(f"cannot write {self.path}: {exc.strerror or exc}"))
        return SendResult(True)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            if not self._owned:
                return
            try:
                self._file.close()
            except OSError:
                pass  # a failed final flush was already reported by send()

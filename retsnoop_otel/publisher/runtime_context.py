"""The OpenTelemetry runtime context that publishes each OS thread's current span (OTEP 4947).

Selected with OTEL_PYTHON_CONTEXT=retsnoop_thread_ctx (entry point group `opentelemetry_context`): the
OpenTelemetry API instantiates it when `opentelemetry.context` is first imported. It is the API's contextvars
runtime context, plus: after every attach and detach, the span now current on this thread (its trace id, span
id, trace flags and the span attributes named in RETSNOOP_OTEL_THREAD_ATTRIBUTES) is written to the thread's
record, or the record is made invalid when no valid span is current.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextvars import Token
from typing import Any

from opentelemetry.context.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

from . import native
from .process_context import configured_key_map, publish_process_context

logger = logging.getLogger(__name__)
MAX_VALUE = 255  # bytes of one attribute value (its length is one byte)

# opentelemetry.trace imports opentelemetry.context, which creates this class while it is being imported:
# get_current_span is looked up at the first attach or detach, never at import time.
_get_current_span: Callable[[Context], Any] | None = None


def _span_of(context: Context) -> Any:
    global _get_current_span
    if _get_current_span is None:
        from opentelemetry.trace import get_current_span
        _get_current_span = get_current_span
    return _get_current_span(context)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    return str(value)


def encode_attrs(attributes: Any, keys: Sequence[str]) -> bytes:
    """attrs-data for these span attributes: (key index, length, utf-8 value) per configured key present, in
    key-map order; values cut at 255 bytes on a character boundary."""
    out = bytearray()
    for index, key in enumerate(keys):
        value = attributes.get(key)
        if value is None:
            continue
        raw = _text(value).encode()
        if len(raw) > MAX_VALUE:
            raw = raw[:MAX_VALUE].decode("utf-8", "ignore").encode()
        out += bytes((index, len(raw)))
        out += raw
    return bytes(out)


class ThreadContextRuntimeContext(ContextVarsRuntimeContext):
    """ContextVarsRuntimeContext that also publishes the current span of each OS thread to out-of-process readers."""

    def __init__(self) -> None:
        super().__init__()
        lib = native.library()  # PublisherUnavailable: the API logs it and falls back to contextvars_context
        self._set = lib.otel_thread_ctx_set
        self._clear = lib.otel_thread_ctx_clear
        self._keys = configured_key_map()
        self._failed = False
        try:
            publish_process_context(key_map=self._keys)
        except Exception as e:  # thread records still work; readers without the process context cannot start
            logger.warning("retsnoop-otel: the OTEL_CTX process context was not published: %s", e)

    def attach(self, context: Context) -> Token[Context]:
        token = super().attach(context)
        self._publish(context)
        return token

    def detach(self, token: Token[Context]) -> None:
        try:
            super().detach(token)
        finally:
            self._publish(self.get_current())

    def _publish(self, context: Context) -> None:
        try:
            span = _span_of(context)
            sc = span.get_span_context()
            if not sc.is_valid:
                self._clear()
                return
            attrs = b""
            if self._keys and (attributes := getattr(span, "attributes", None)):
                attrs = encode_attrs(attributes, self._keys)
            self._set(sc.trace_id.to_bytes(16, "big"), sc.span_id.to_bytes(8, "big"), sc.trace_flags & 0xFF,
                      attrs or None, len(attrs))
        except Exception:  # never break the application's attach/detach: publish nothing rather than a stale span
            self._clear()
            if not self._failed:
                self._failed = True
                logger.warning("retsnoop-otel: the thread context could not be published", exc_info=True)

"""A non-blocking queue of encoded traces in front of one OTLP sender.

The capture loop must never wait for the network: `submit` only appends to a queue bounded in
spans (not sessions, since one session may carry thousands of spans) and drops when it is full. A
session's spans are accepted or dropped together so that no trace arrives half-built. One worker
thread joins consecutive traces into requests of up to `max_batch_spans` spans and hands the bytes
to the sender; every span ends up counted as exported or dropped (with a cause). With a
`schedule_delay_s` (OTEL_BSP_SCHEDULE_DELAY) a batch that is not full waits that long after its first
trace for more; a flush or shutdown sends it at once.
"""

import collections
import logging
import threading
import time
from typing import NamedTuple

from retsnoop_otel.export.sending import Sender
from retsnoop_otel.export.span_encoder import EncodedTrace, build_request

log = logging.getLogger(__name__)


class ExportStats(NamedTuple):
    """Counters of one sink, read by the metrics collector at scrape time (not a dataclass: dataclasses imports
    inspect, ast and dis at start)."""

    spans_exported: int
    spans_dropped: dict[str, int]  # cause -> spans
    export_errors: int = 0


class OtlpTraceSink:
    """Sends batches of encoded traces from a worker thread; `submit` never blocks."""

    def __init__(self, sender: Sender, *, max_queue_spans: int = 65536, max_batch_spans: int = 512,
                 schedule_delay_s: float = 0.0) -> None:
        self._sender = sender
        self._max_queue = max_queue_spans
        self._max_batch = max(1, max_batch_spans)
        self._delay = max(0.0, schedule_delay_s)
        self._oldest = 0.0  # when the oldest queued trace was submitted (monotonic)
        self._flushing = 0  # flush() calls waiting: a batch goes at once, full or not
        self._queue: collections.deque[EncodedTrace] = collections.deque()
        self._queued = 0  # spans in _queue
        self._in_flight = 0  # spans taken by the worker and not yet accounted
        self._cond = threading.Condition()
        self._closing = False
        self._exported = 0
        self._errors = 0
        self._dropped: dict[str, int] = {}
        self.last_error: str | None = None
        self._worker = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._worker.start()

    def submit(self, trace: EncodedTrace) -> bool:
        """Queue one session's spans; False (and counted) if they were dropped."""
        if not trace:
            return True
        with self._cond:
            if self._closing:
                self._drop("shutdown", len(trace))
                return False
            if self._queued + len(trace) > self._max_queue:
                self._drop("queue_full", len(trace))
                return False
            if not self._queue:
                self._oldest = time.monotonic()
            self._queue.append(trace)
            self._queued += len(trace)
            self._cond.notify()
        return True

    def stats(self) -> ExportStats:
        with self._cond:
            return ExportStats(self._exported, dict(self._dropped), self._errors)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far has been exported or dropped; False on timeout."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._queued and not self._in_flight, timeout)
            finally:
                self._flushing -= 1

    def shutdown(self, timeout: float = 10.0) -> None:
        """Export what is queued within `timeout`, then stop; spans still queued count as 'shutdown'."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._drop("shutdown", self._queued)
            self._queue.clear()
            self._queued = 0
            self._cond.notify_all()
        try:  # also aborts a retry wait in progress
            self._sender.shutdown()
        except Exception:  # noqa: BLE001 - a failing transport must not break the caller's exit path
            log.debug("OTLP sender shutdown failed", exc_info=True)
        self._worker.join(timeout=max(0.0, min(timeout, 5.0)))

    def _drop(self, cause: str, count: int) -> None:
        if count:
            self._dropped[cause] = self._dropped.get(cause, 0) + count

    def _take_batch(self) -> list[EncodedTrace] | None:
        """Queued traces adding up to at most max_batch spans (a bigger trace is split)."""
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._closing)
            if self._delay and self._queue:  # let the batch fill, up to the delay after its first trace
                self._cond.wait_for(lambda: self._closing or self._flushing or self._queued >= self._max_batch,
                                    max(0.0, self._oldest + self._delay - time.monotonic()))
            if not self._queue:
                return None
            first = self._queue.popleft()
            if len(first) > self._max_batch:  # the rest stays at the head
                first, rest = first.split(self._max_batch)
                self._queue.appendleft(rest)
            batch, count = [first], len(first)
            while self._queue and count + len(self._queue[0]) <= self._max_batch:
                batch.append(self._queue.popleft())
                count += len(batch[-1])
            self._queued -= count
            self._in_flight = count
            self._oldest = time.monotonic()  # what stays queued waits one delay more at most
            return batch

    def _run(self) -> None:
        while (batch := self._take_batch()) is not None:
            count = sum(len(t) for t in batch)
            try:
                result = self._sender.send(build_request(batch), count)
                ok, rejected, error = result.ok, min(result.rejected, count), result.error
            except Exception as exc:  # noqa: BLE001 - keep the worker alive whatever the transport does
                log.debug("OTLP export raised", exc_info=True)
                ok, rejected, error = False, 0, f"{type(exc).__name__}: {exc}"
            with self._cond:
                if ok:
                    self._exported += count - rejected
                    self._drop("rejected", rejected)
                else:
                    self._errors += 1
                    self._drop("export_failed", count)
                    self.last_error = error
                self._in_flight = 0
                self._cond.notify_all()

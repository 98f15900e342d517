"""What every OTLP sender shares: the Sender contract, its result, and the retry loop of the network ones."""

import random
import threading
import time
from typing import Any, NamedTuple, Protocol

from retsnoop_otel import __version__
from retsnoop_otel.export.otlp_settings import OtlpSettings

USER_AGENT = f"retsnoop-otel/{__version__}"
MAX_MESSAGE = 64 << 20
FIRST_BACKOFF_S = 1.0
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


def signal_messages(signal: str) -> tuple[str, Any, Any, str]:
    """(gRPC method, request class, response class, partial-success field) of a signal; the generated
    protobuf classes are imported here, when an exporter is built, not when the package loads."""
    if signal == "traces":
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        return ("/opentelemetry.proto.collector.trace.v1.TraceService/Export", pb.ExportTraceServiceRequest,
                pb.ExportTraceServiceResponse, "rejected_spans")
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
    return ("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", mpb.ExportMetricsServiceRequest,
            mpb.ExportMetricsServiceResponse, "rejected_data_points")


class SendResult(NamedTuple):  # not a dataclass: dataclasses imports inspect, ast and dis at start
    ok: bool
    rejected: int = 0  # items the receiver refused in a partial success (rejected_spans / rejected_data_points)
    error: str | None = None  # one line, for logs and counters (with ok=True: the partial success message)


class Sender(Protocol):
    def send(self, body: bytes, items: int) -> SendResult: ...  # body: a serialized Export*ServiceRequest
    def shutdown(self) -> None: ...  # aborts retry waits at once; later sends fail fast


def one_line(text: str, limit: int = 300) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:limit]


def partial_success(response: Any, field: str) -> SendResult:
    ps = response.partial_success
    return SendResult(True, rejected=getattr(ps, field), error=one_line(ps.error_message) or None)


class Retrying:
    """The retry loop shared by the network senders: exponential backoff from 1 s (factor 2, +/-20% jitter) or
    the server's Retry-After, all attempts inside one deadline of settings.timeout_s; waits on an Event so that
    shutdown() from another thread ends them at once."""

    def __init__(self, settings: OtlpSettings) -> None:
        self.settings = settings
        self._stopped = threading.Event()

    def send(self, body: bytes, items: int) -> SendResult:
        if self._stopped.is_set():
            return SendResult(False, error="sender is shut down")
        deadline = time.monotonic() + self.settings.timeout_s
        payload, backoff = self._encode(body), FIRST_BACKOFF_S
        while True:
            result, retry, delay = self._attempt(payload, deadline)
            if not retry:
                return result
            wait = delay if delay is not None else backoff * random.uniform(0.8, 1.2)
            backoff *= 2
            if not self._stopped.is_set() and time.monotonic() + wait >= deadline:
                return result  # the next attempt could not start before the deadline
            if self._stopped.is_set() or self._stopped.wait(wait):
                return SendResult(False, error=f"shut down before retrying: {result.error}")

    def shutdown(self) -> None:
        self._stopped.set()

    def _encode(self, body: bytes) -> bytes:
        return body

    def _attempt(self, payload: bytes, deadline: float) -> tuple[SendResult, bool, float | None]:
        """(result, retryable, server-requested delay in seconds or None)."""
        raise NotImplementedError


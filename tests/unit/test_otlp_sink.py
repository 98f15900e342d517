"""The export queue: bounded in spans, never blocking, whole traces kept or dropped, every span accounted."""

import random
import threading
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from retsnoop_otel.capture.model import Call
from retsnoop_otel.export.otlp_sink import ExportStats, OtlpTraceSink
from retsnoop_otel.export.sending import SendResult
from retsnoop_otel.export.span_encoder import SpanEncoder, build_request
from tests.fakes import OFFSET, TREE_FUNCS, tree_session
from tests.span_checks import ENVELOPE


class FakeSender:
    """Records the requests it is given, like a receiver would; optionally blocks, fails or rejects."""

    def __init__(self, result=None, gate=None):
        self.requests, self.counts, self.result, self.gate, self.shut = [], [], result, gate, False

    def send(self, body, items):
        if self.gate is not None:
            self.gate.wait(5)
        request = ExportTraceServiceRequest.FromString(body)
        assert span_count(request) == items
        self.requests.append(request)
        self.counts.append(items)
        return self.result or SendResult(True)

    def shutdown(self):
        self.shut = True


def span_count(request):
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def names(request):
    return [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def encoder():
    return SpanEncoder(TREE_FUNCS, ENVELOPE, rng=random.Random(2))


def wait_in_flight(sink):
    deadline = time.monotonic() + 5
    while sink._in_flight == 0 and time.monotonic() < deadline:  # noqa: SLF001 - our own sink's state
        time.sleep(0.001)


def test_batches_traces_into_bounded_requests_in_order():
    sender = FakeSender()
    sink = OtlpTraceSink(sender, max_batch_spans=8)
    enc = encoder()
    traces = [enc.encode(tree_session(), OFFSET) for _ in range(3)]  # 6 spans each
    big = enc.encode(tree_session(calls=[Call(0, 0, 0, 99, 0, children=[
        Call(3, 1, i, i + 1, 0) for i in range(19)])]), OFFSET)  # 20 spans: split over requests
    for t in (*traces, big):
        assert sink.submit(t)
    assert sink.flush(5)
    sink.shutdown(1)
    assert max(sender.counts) <= 8 and sum(sender.counts) == 38
    sent = [n for r in sender.requests for n in names(r)]
    assert sent == names(ExportTraceServiceRequest.FromString(build_request([*traces, big])))  # order kept
    assert sink.stats() == ExportStats(38, {}, 0) and sender.shut


def test_drops_whole_traces_when_full_without_blocking():
    gate = threading.Event()
    sink = OtlpTraceSink(FakeSender(gate=gate), max_queue_spans=10)
    enc = encoder()
    assert sink.submit(enc.encode(tree_session(), OFFSET))  # taken by the worker, which blocks in send
    wait_in_flight(sink)
    assert sink.submit(enc.encode(tree_session(), OFFSET))  # queued: 6 of 10
    assert not sink.submit(enc.encode(tree_session(), OFFSET))  # 12 > 10: dropped whole, at once
    assert sink.stats().spans_dropped == {"queue_full": 6}
    gate.set()
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(12, {"queue_full": 6}, 0)
    assert not sink.submit(enc.encode(tree_session(), OFFSET)) and sink.stats().spans_dropped["shutdown"] == 6


def test_counts_failures_rejections_and_raising_senders():
    sink = OtlpTraceSink(FakeSender(SendResult(False, error="UNAVAILABLE: down")))
    sink.submit(encoder().encode(tree_session(), OFFSET))
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(0, {"export_failed": 6}, 1) and sink.last_error == "UNAVAILABLE: down"

    sink = OtlpTraceSink(FakeSender(SendResult(True, rejected=2)))
    sink.submit(encoder().encode(tree_session(), OFFSET))
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(4, {"rejected": 2}, 0)

    class Raising(FakeSender):
        def send(self, body, items):
            raise OSError("broken pipe")

    sink = OtlpTraceSink(Raising())
    sink.submit(encoder().encode(tree_session(), OFFSET))
    assert sink.flush(5)
    sink.shutdown(1)
    assert sink.stats() == ExportStats(0, {"export_failed": 6}, 1) and "broken pipe" in sink.last_error


def test_shutdown_timeout_drops_what_is_queued():
    gate = threading.Event()
    sender = FakeSender(gate=gate)
    sink = OtlpTraceSink(sender, max_batch_spans=6)
    enc = encoder()
    sink.submit(enc.encode(tree_session(), OFFSET))
    sink.submit(enc.encode(tree_session(), OFFSET))
    assert not sink.flush(0.05)
    sink.shutdown(0.05)
    gate.set()
    assert sender.shut and sink.stats().spans_dropped.get("shutdown") in (6, 12)


def test_a_schedule_delay_gathers_a_batch_and_a_flush_sends_it_at_once():
    """OTEL_BSP_SCHEDULE_DELAY: traces submitted within the delay leave in one request, after it; a full
    batch leaves before it; flush() does not wait for it."""
    sender = FakeSender()
    sink = OtlpTraceSink(sender, max_batch_spans=12, schedule_delay_s=0.6)
    enc = encoder()
    started = time.monotonic()
    assert sink.submit(enc.encode(tree_session(), OFFSET))  # 6 spans: waits for more
    time.sleep(0.2)
    assert sender.counts == []
    assert sink.submit(enc.encode(tree_session(), OFFSET))  # 12: full, goes at once
    deadline = time.monotonic() + 5
    while not sender.counts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sender.counts == [12] and time.monotonic() - started < 0.6
    assert sink.submit(enc.encode(tree_session(), OFFSET))
    time.sleep(0.1)
    assert sender.counts == [12]  # within the delay of its first trace
    assert sink.flush(5) and sender.counts == [12, 6]
    assert sink.submit(enc.encode(tree_session(), OFFSET))
    while len(sender.counts) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sender.counts == [12, 6, 6]  # alone, after the delay
    sink.shutdown(1)

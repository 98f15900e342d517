"""Span throughput from decoded sessions to serialized OTLP requests, on one thread.

Three paths over the same sessions, measured in one run:
  stock     Tracer.start_span/end with explicit times and attributes, then the SDK's OTLP encoder
  readable  ReadableSpan objects built directly (the test oracle, tests/oracle_spans.py), then the SDK's encoder
  fast      export.span_encoder.SpanEncoder (protobuf wire format, cached constant parts), requests of <= 512
            spans: the production path (the senders send these bytes as they are)
plus `fast-cold`, which starts every pass with empty caches (a lower bound for never-seen results).

Run: .venv/bin/python -m bench.span_throughput [--sessions N] [--calls N] [--seconds S]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

from bench.harness import OFFSET, make_funcs, make_session
from retsnoop_otel.capture.model import Call, Session, TracedFunc
from retsnoop_otel.export.resource import build_resource
from retsnoop_otel.export.span_attributes import SCOPE_NAME, SCOPE_VERSION, session_attrs
from retsnoop_otel.export.span_encoder import SpanEncoder, build_request, make_envelope
from tests.oracle_spans import result_attrs, sdk_resource, sdk_status, session_to_spans

BATCH = 512  # spans per export request, the sink's default
class _Collect(SpanProcessor):
    """Keeps ended spans for the encoder; the lightest processor possible, so only the SDK is measured."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def stock_path(funcs: dict[int, TracedFunc], resource, symbolize) -> Callable[[list[Session]], int]:
    """What an instrumentation would do: one Tracer span per call, ended with its kernel times."""
    provider = TracerProvider(resource=sdk_resource(resource))
    sink = _Collect()
    provider.add_span_processor(sink)
    tracer = provider.get_tracer(SCOPE_NAME, SCOPE_VERSION)
    attrs_cache: dict = {}

    def attrs_of(fid: int, raw: int | None):
        key = (fid, raw)
        if key not in attrs_cache:
            attrs, status = result_attrs(funcs[fid], raw, False)
            attrs_cache[key] = attrs, sdk_status(status)
        return attrs_cache[key]

    def emit(call: Call, ctx, parent_end: int) -> None:
        raw = call.result if call.end_ns is not None else None
        attrs, status = attrs_of(call.func_id, raw)
        start = call.start_ns + OFFSET
        end = call.end_ns + OFFSET if call.end_ns is not None else max(parent_end, start)
        span = tracer.start_span(funcs[call.func_id].name, context=ctx, kind=SpanKind.INTERNAL, attributes=attrs,
                                 start_time=start)
        span.set_status(status)
        child_ctx = trace.set_span_in_context(span)
        for child in call.children:
            emit(child, child_ctx, end)
        span.end(end)

    def run(sessions: list[Session]) -> int:
        total = 0
        for s in sessions:
            root = s.calls[0]
            attrs, status = attrs_of(0, root.result)
            span = tracer.start_span(funcs[0].name, kind=SpanKind.INTERNAL,
                                     attributes={**attrs, **session_attrs(s, symbolize, False)},
                                     start_time=s.start_ns + OFFSET)
            span.set_status(status)
            ctx = trace.set_span_in_context(span)
            for child in root.children:
                emit(child, ctx, s.end_ns + OFFSET)
            span.end(s.end_ns + OFFSET)
            if len(sink.spans) >= BATCH:
                total += len(encode_spans(sink.spans).SerializeToString())
                sink.spans.clear()
        if sink.spans:
            total += len(encode_spans(sink.spans).SerializeToString())
            sink.spans.clear()
        return total

    return run


def readable_path(funcs, resource, symbolize) -> Callable[[list[Session]], int]:
    def run(sessions: list[Session]) -> int:
        total, batch = 0, []
        for s in sessions:
            batch.extend(session_to_spans(s, funcs, OFFSET, resource, symbolize=symbolize))
            if len(batch) >= BATCH:
                total += len(encode_spans(batch).SerializeToString())
                batch = []
        if batch:
            total += len(encode_spans(batch).SerializeToString())
        return total

    return run


def fast_path(funcs, resource, symbolize, cold: bool = False) -> Callable[[list[Session]], int]:
    envelope = make_envelope(resource.attributes, resource.schema_url)
    encoder = SpanEncoder(funcs, envelope, symbolize=symbolize)

    def flush(batch) -> int:
        return len(build_request(batch))

    def run(sessions: list[Session]) -> int:
        nonlocal encoder
        if cold:  # forget every cached encoding: each pass meets all its results for the first time
            encoder = SpanEncoder(funcs, envelope, symbolize=symbolize)
        total, batch, queued = 0, [], 0
        for s in sessions:
            encoded = encoder.encode(s, OFFSET)
            batch.append(encoded)
            queued += len(encoded)
            if queued >= BATCH:
                total += flush(batch)
                batch, queued = [], 0
        if batch:
            total += flush(batch)
        return total

    return run


def measure(run: Callable[[list[Session]], int], sessions: list[Session], spans: int,
            seconds: float) -> tuple[float, float]:
    """Best spans per CPU second and per wall second over passes lasting about `seconds` in total.

    CPU time of this thread is what "one core" means; wall time is shown too, and only matches it on
    an otherwise idle machine.
    """
    run(sessions[:4])  # warm caches and imports
    best_cpu = best_wall = spent = 0.0
    while spent < seconds:
        gc.collect()
        c0, w0 = time.thread_time(), time.perf_counter()
        run(sessions)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        spent += wall
        best_cpu, best_wall = max(best_cpu, spans / cpu), max(best_wall, spans / wall)
    return best_cpu, best_wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=200, help="distinct sessions per pass")
    ap.add_argument("--calls", type=int, default=50, help="nested calls per session (plus the root)")
    ap.add_argument("--seconds", type=float, default=3.0, help="time spent per path")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    rng = random.Random(1)
    funcs = make_funcs()
    sessions = [make_session(rng, funcs, args.calls) for _ in range(args.sessions)]
    spans = len(sessions) * (args.calls + 1)
    names = {a: f"kfunc+0x{a & 0xFFF:x}" for s in sessions for a in s.kstack}
    resource = build_resource({}, instance_id="bench")
    symbolize = names.__getitem__

    print(f"{len(sessions)} sessions x {args.calls + 1} spans, batches of {BATCH} spans, one thread, "
          f"Python {sys.version.split()[0]}")
    rows = [
        ("stock", "Tracer.start_span/end + SDK encode_spans + serialize",
         stock_path(funcs, resource, symbolize)),
        ("readable", "ReadableSpan objects (test oracle) + SDK encode + serialize",
         readable_path(funcs, resource, symbolize)),
        ("fast", "span_encoder.SpanEncoder + build_request (production)",
         fast_path(funcs, resource, symbolize)),
        ("fast-cold", "fast with a new encoder (empty caches) every pass",
         fast_path(funcs, resource, symbolize, cold=True)),
    ]
    results = {}
    print(f"{'path':<11} {'spans/s':>10} {'us/span':>8} {'(wall)':>10}  what")
    for name, what, run in rows:
        cpu, wall = measure(run, sessions, spans, args.seconds)
        results[name] = cpu
        print(f"{name:<11} {cpu:>10,.0f} {1e6 / cpu:>8.2f} {wall:>10,.0f}  {what}")
    print("spans/s and us/span per CPU second of the one thread; (wall) is spans per wall-clock second")
    print(f"fast/stock = {results['fast'] / results['stock']:.1f}x   "
          f"fast/readable = {results['fast'] / results['readable']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The production span encoder against the test oracle (tests/oracle_spans.py, encoded by the SDK), ids aside."""

from __future__ import annotations

import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from retsnoop_otel.export.resource import build_resource
from retsnoop_otel.export.span_encoder import SpanEncoder, build_request, make_envelope
from tests.fakes import OFFSET, TREE_FUNCS
from tests.oracle_spans import sdk_request, session_to_spans

RESOURCE = build_resource({}, instance_id="test")
ENVELOPE = make_envelope(RESOURCE.attributes, RESOURCE.schema_url)


def encoder_for(funcs=TREE_FUNCS, resource=RESOURCE, **kw):
    return SpanEncoder(funcs, make_envelope(resource.attributes, resource.schema_url), **kw)


def decode(body):
    return ExportTraceServiceRequest.FromString(body)


def strip_ids(request):
    """Blank the random ids, returning the parent index of every span (-1 for a root) and the trace ids."""
    parents, traces = [], []
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            index = {s.span_id: i for i, s in enumerate(ss.spans)}
            assert len(index) == len(ss.spans) and b"\0" * 8 not in index, "span ids must be unique and non-zero"
            for s in ss.spans:
                assert len(s.trace_id) == 16 and s.trace_id != b"\0" * 16 and len(s.span_id) == 8
                # a parent outside the request is the application's span: kept as it is
                parents.append(index.get(s.parent_span_id, s.parent_span_id) if s.parent_span_id else -1)
                traces.append(s.trace_id)
                s.trace_id = s.span_id = s.parent_span_id = b""
    return parents, traces


def assert_same(session, funcs=TREE_FUNCS, encoder=None, **kw):
    """The production encoding of `session` equals the SDK encoding of the oracle's spans, ids aside."""
    want = sdk_request(session_to_spans(session, funcs, OFFSET, RESOURCE, **kw))
    encoder = encoder or encoder_for(funcs, **kw)
    trace = encoder.encode(session, OFFSET)
    got = decode(build_request([trace]))
    want_parents, want_traces = strip_ids(want)
    got_parents, got_traces = strip_ids(got)
    assert len(set(got_traces)) == 1
    assert got_parents == want_parents
    got_spans = got.resource_spans[0].scope_spans[0].spans
    want_spans = want.resource_spans[0].scope_spans[0].spans
    assert len(got_spans) == len(want_spans) == len(trace)
    for g, w in zip(got_spans, want_spans, strict=True):
        assert g == w, f"span {w.name} differs:\n{g}\nvs\n{w}"
    assert got == want  # resource, scope and schema urls too
    return trace


def encoded(session, symbolize=None, **kw):
    """One session's request as the production encoder writes it (the ids from a seeded generator)."""
    enc = SpanEncoder(TREE_FUNCS, make_envelope(RESOURCE.attributes), symbolize=symbolize, rng=random.Random(1), **kw)
    return build_request([enc.encode(session, OFFSET)])

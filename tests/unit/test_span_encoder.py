"""The production span encoder must write exactly what the SDK-object oracle + the SDK's encoder give, ids aside."""

import random
import re

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench import harness  # the benchmarks' realistic session generator
from retsnoop_otel.capture.model import (
    ArgValue,
    Call,
    RetKind,
    Session,
    StackEntry,
    TracedFunc,
    UserFrame,
    Workload,
)
from retsnoop_otel.export import span_encoder
from retsnoop_otel.export.resource import Resource, build_resource
from retsnoop_otel.export.span_encoder import SpanEncoder, build_request
from tests.fakes import APP_SPAN, APP_TRACE, EINVAL, KPTR, OFFSET, TREE_FUNCS, app_session, symbolize, tree_session
from tests.oracle_spans import request_to_spans, sdk_request, session_to_spans
from tests.span_checks import ENVELOPE, RESOURCE, assert_same, decode, encoder_for, strip_ids


def span_count(request):
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def test_tree_session_matches_sdk_encoding():
    trace = assert_same(tree_session(dropped_records=3), symbolize=symbolize)
    assert trace.spans_dropped == 0 and len(trace) == 6


@pytest.mark.parametrize("variant", ["chain", "chain_clamped", "pointer_null", "pointer_err", "void", "no_entry",
                                     "stray_calls", "incomplete_root"])
def test_session_variants_match(variant):
    sessions = {
        "chain": tree_session(calls=[], chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 3_000),
                                               StackEntry(3, EINVAL, 500)]),
        "chain_clamped": tree_session(calls=[], chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, 0, None),
                                                       StackEntry(3, EINVAL, 99_000)]),
        "pointer_null": tree_session(calls=[Call(2, 0, 10, 20, 0)], chain=[StackEntry(2, 0, 10)], start_ns=10,
                                     end_ns=20),
        "pointer_err": tree_session(calls=[Call(2, 0, 10, 20, (1 << 64) - 12)], chain=[], start_ns=10, end_ns=20),
        "void": tree_session(calls=[Call(4, 0, 10, 20, 0)], chain=[], start_ns=10, end_ns=20, is_err=False),
        "no_entry": tree_session(calls=[], chain=[]),
        "stray_calls": tree_session(calls=[*tree_session().calls, Call(77, 0, 9_500, 9_600, 0)]),
        "incomplete_root": tree_session(calls=[Call(0, 0, 1_000, None, None, children=[Call(3, 1, 1_100, 1_200, 0)])],
                                        chain=[]),
    }
    assert_same(sessions[variant], symbolize=symbolize)


def test_addresses_only_when_asked():
    assert_same(tree_session())  # no symbolizer: no stack
    assert_same(tree_session(), symbolize=lambda a: "f+0x5" if a & 0x100 else f"0x{a:x}")  # leaks replaced
    trace = assert_same(tree_session(), symbolize=symbolize, export_addresses=True)
    assert f"0x{KPTR:x}".encode() in b"".join(trace.spans)
    plain = b"".join(encoder_for(symbolize=symbolize).encode(tree_session(), OFFSET).spans)
    assert f"{KPTR:x}".encode() not in plain and b"ffffffff81000105" not in plain


def test_span_limit():
    trace = assert_same(tree_session(), max_spans=3)
    assert trace.spans_dropped == 3
    trace = assert_same(tree_session(calls=[], chain=[StackEntry(0, EINVAL, 8_000), StackEntry(1, EINVAL, 3_000),
                                                      StackEntry(3, EINVAL, 500)]), max_spans=2)
    assert trace.spans_dropped == 1


def test_generated_sessions_match_with_one_long_lived_encoder():
    """The benchmark's sessions (50 nested calls, errors, lost exits, distinct pointers), one shared encoder."""
    rng = random.Random(3)
    funcs = harness.make_funcs()
    encoder = encoder_for(funcs, symbolize=symbolize)
    for _ in range(40):
        assert_same(harness.make_session(rng, funcs, 50), funcs, encoder=encoder, symbolize=symbolize)
    # every valid pointer shares one encoding instead of filling the cache with one entry per address
    pointer_funcs = {f.id for f in funcs.values() if f.ret is RetKind.POINTER}
    cached_pointers = [raw for fid, raw in encoder._cache if fid in pointer_funcs and raw]
    assert all(raw == 1 or raw >= (1 << 64) - 4095 for raw in cached_pointers)


def test_caches_stay_bounded(monkeypatch):
    monkeypatch.setattr(span_encoder, "_CACHE_LIMIT", 4)
    funcs = {0: TracedFunc(0, "entry", 0, RetKind.SIGNED, True), 1: TracedFunc(1, "read", 0, RetKind.INT32, False)}
    encoder = encoder_for(funcs)
    for n in range(30):
        calls = [Call(0, 0, 0, 100, n, children=[Call(1, 1, 10 + i, 20 + i, n * 7 + i) for i in range(5)])]
        session = Session(1, 1, "c", "c", 0, 100, False, [], [], calls=calls)
        assert_same(session, funcs, encoder=encoder)
        assert len(encoder._cache) <= 4 and len(encoder._results) <= 4


def test_resource_attribute_types_match_sdk():
    resource = Resource({"s": "text", "b": True, "i": -5, "big": (1 << 63) - 1, "f": 1.5, "arr": ("a", "b"),
                         "ints": (1, -2), "empty": ""}, "https://opentelemetry.io/schemas/1.26.0")
    spans = session_to_spans(tree_session(), TREE_FUNCS, OFFSET, resource)
    got = decode(build_request([encoder_for(resource=resource).encode(tree_session(), OFFSET)]))
    want = sdk_request(spans)
    assert got.resource_spans[0].resource == want.resource_spans[0].resource
    assert got.resource_spans[0].schema_url == want.resource_spans[0].schema_url != ""
    assert got.resource_spans[0].scope_spans[0].scope == want.resource_spans[0].scope_spans[0].scope


def test_request_groups_envelopes_and_split_keeps_order():
    other = build_resource({}, instance_id="other")
    a = encoder_for().encode(tree_session(), OFFSET)
    b = encoder_for(resource=other).encode(tree_session(), OFFSET)
    c = encoder_for().encode(tree_session(), OFFSET)
    assert a.envelope == c.envelope != b.envelope and ENVELOPE == a.envelope
    request = decode(build_request([a, b, c]))
    assert [len(rs.scope_spans[0].spans) for rs in request.resource_spans] == [12, 6]
    instances = [[kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.instance.id"]
                 for rs in request.resource_spans]
    assert instances == [["test"], ["other"]]
    head, tail = a.split(4)
    assert len(head) == 4 and len(tail) == 2 and head.spans + tail.spans == a.spans
    assert span_count(decode(build_request([head]))) == 4


def test_captured_arguments_become_a_string_list_attribute():
    """-A: each call's `name=value` strings go on its span as retsnoop.args (beside a records-lost count)."""
    from retsnoop_otel.capture.model import ArgValue

    session = tree_session()
    root = session.calls[0]
    create = root.children[1]
    create.args = (ArgValue(0), ArgValue(0xFFFF888000001000, b"\0" * 8))
    create.children[1].args = (ArgValue(7),)  # the call that also carries missing_before=2
    seen = []

    def fmt(func_id, values):
        seen.append(func_id)
        return [f"arg{i}={v.raw if v.raw < 100 else '(ptr)'}" for i, v in enumerate(values)]

    trace = encoder_for(format_args=fmt).encode(session, OFFSET)
    spans = {s["name"]: s for s in request_to_spans(build_request([trace]))}
    assert spans["map_create"]["attributes"]["retsnoop.args"] == ("arg0=0", "arg1=(ptr)")
    assert spans["capable"]["attributes"]["retsnoop.args"] == ("arg0=7",)
    assert spans["capable"]["attributes"]["retsnoop.records_lost_before"] == 2
    assert "retsnoop.args" not in spans["security_bpf"]["attributes"]
    assert sorted(seen) == [1, 5]
    # the oracle puts the same arguments on the same spans
    assert_same(session, format_args=fmt)
    assert_same(session)  # without a formatter (no -A) no arguments are exported


def test_calls_cut_by_the_session_cap_are_on_the_root_span():
    trace = assert_same(tree_session(calls_cut=5))
    (root, *_), = [request_to_spans(build_request([trace]))]
    assert root["attributes"]["retsnoop.calls_cut"] == 5


def test_source_location_matches_sdk_encoding():
    from tests.fakes import dwarf_locate
    assert_same(tree_session(), locate=dwarf_locate)
    assert_same(tree_session(calls=[]), locate=dwarf_locate)


def test_sampled_application_context_is_joined():
    """The root span continues the application's trace, under its span (a remote parent)."""
    session = app_session(attributes=(("http.route", "/users/:id"), ("enduser.id", "42")), service_name="shop")
    trace = assert_same(session, symbolize=symbolize)
    spans = decode(build_request([trace])).resource_spans[0].scope_spans[0].spans
    assert {s.trace_id for s in spans} == {APP_TRACE.to_bytes(16, "big")} and trace.trace_id == APP_TRACE
    root = spans[0]
    assert root.parent_span_id == APP_SPAN.to_bytes(8, "big") and root.flags == 0x300
    assert all(s.flags == 0x100 for s in spans[1:]) and not root.links
    attrs = {kv.key: kv.value.string_value for kv in root.attributes}
    assert attrs["retsnoop.app.http.route"] == "/users/:id" and attrs["retsnoop.app.service.name"] == "shop"


@pytest.mark.parametrize("case", ["unsampled", "invalid", "no_record", "fault", "no_span"])
def test_other_application_contexts_stay_in_their_own_trace(case):
    app = {"unsampled": {"trace_flags": 0}, "invalid": {"status": "invalid", "trace_id": 0, "span_id": 0},
           "no_record": {"status": "no_record", "trace_id": 0, "span_id": 0},
           "fault": {"status": "fault", "error": 14, "trace_id": 0, "span_id": 0},
           "no_span": {"span_id": 0}}[case]
    trace = assert_same(app_session(**app), symbolize=symbolize)
    root = decode(build_request([trace])).resource_spans[0].scope_spans[0].spans[0]
    assert root.trace_id != APP_TRACE.to_bytes(16, "big") and not root.parent_span_id and root.flags == 0x100
    attrs = {kv.key: kv.value.string_value for kv in root.attributes}
    if case == "unsampled":  # a valid context: linked, not joined
        assert [(lk.trace_id, lk.span_id, lk.flags) for lk in root.links] == [
            (APP_TRACE.to_bytes(16, "big"), APP_SPAN.to_bytes(8, "big"), 0x300)]
        assert "retsnoop.app.context" not in attrs
    else:
        assert not root.links
        assert attrs.get("retsnoop.app.context") == (None if case == "no_span" else case)


def test_user_stack_on_the_root_span():
    frames = (UserFrame(0x401136, "inner", 0x16, "/usr/bin/writer", "writer.c", 12, inlined=True),
              UserFrame(0x401136, "do_request", 0x16, "/usr/bin/writer", "writer.c", 20),
              UserFrame(0x7F00001234, "syscall", 0x1D, "/lib/x86_64-linux-gnu/libc.so.6"),
              UserFrame(0x1234, None, 0, None))
    trace = assert_same(tree_session(user_frames=frames, ustack=(1, 2, 3, 4)), symbolize=symbolize)
    root = decode(build_request([trace])).resource_spans[0].scope_spans[0].spans[0]
    attrs = {kv.key: kv.value.string_value for kv in root.attributes}
    assert attrs["retsnoop.user_stacktrace"].splitlines() == [
        ". inner (writer.c:12) [writer]", "do_request+0x16 (writer.c:20) [writer]", "syscall+0x1d [libc.so.6]",
        "0x1234"]
    trace = assert_same(tree_session(ustack_error=14), symbolize=symbolize)
    root = decode(build_request([trace])).resource_spans[0].scope_spans[0].spans[0]
    assert {kv.key: kv.value.string_value for kv in root.attributes}["retsnoop.user_stack_error"] == "EFAULT"


CHECKOUT = Workload("3a8f1c4b2d9e7f6051a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8", "containerd",
                    "6f1b6c5e-2a4d-4a8e-9c3b-0f2e1d4c5b6a", "checkout-7d4b9c8f6-x2x9k", "shop", "app",
                    owners=(("replicaset", "checkout-7d4b9c8f6"), ("deployment", "checkout")),
                    image_name="registry.example:5000/shop/checkout", image_tags=("1.4.2", "stable"))
PODMAN = Workload("e4b0f6b9d3c1a2f8e7d6c5b4a3928170f6e5d4c3b2a19080f7e6d5c4b3a29180", "podman")


def test_each_workload_is_a_resource_of_its_own():
    """Sessions of two containers and of a host process in one request: three ResourceSpans, each the agent's
    resource plus that workload's attributes, the same as the SDK writes for the oracle's spans."""
    envelopes = span_encoder.WorkloadEnvelopes(RESOURCE.attributes, RESOURCE.schema_url)
    enc = SpanEncoder(TREE_FUNCS, envelopes.base, workloads=envelopes)
    sessions = [tree_session(workload=CHECKOUT), tree_session(workload=PODMAN), tree_session(),
                tree_session(workload=CHECKOUT, exe_name="checkout-server")]
    got = decode(build_request([enc.encode(s, OFFSET) for s in sessions]))
    want = sdk_request([span for s in sessions for span in session_to_spans(s, TREE_FUNCS, OFFSET, RESOURCE)])
    strip_ids(got)
    strip_ids(want)
    assert got == want
    resources = [{kv.key: kv.value.string_value for kv in rs.resource.attributes} for rs in got.resource_spans]
    assert [len(rs.scope_spans[0].spans) for rs in got.resource_spans] == [12, 6, 6]
    assert resources[0]["container.id"] == CHECKOUT.container_id and resources[0]["k8s.pod.uid"] == CHECKOUT.pod_uid
    assert {k: resources[0][k] for k in ("container.runtime.name", "k8s.pod.name", "k8s.namespace.name",
                                         "k8s.container.name")} == {
        "container.runtime.name": "containerd", "k8s.pod.name": "checkout-7d4b9c8f6-x2x9k",
        "k8s.namespace.name": "shop", "k8s.container.name": "app"}
    tags = next(kv.value for kv in got.resource_spans[0].resource.attributes if kv.key == "container.image.tags")
    assert [v.string_value for v in tags.array_value.values] == ["1.4.2", "stable"]  # a string array, as the SDK's
    assert (resources[0]["k8s.deployment.name"], resources[0]["container.image.name"]) == \
        ("checkout", "registry.example:5000/shop/checkout")
    assert resources[1]["container.id"] == PODMAN.container_id and "k8s.pod.uid" not in resources[1]
    assert not any(k.startswith(("container.", "k8s.pod")) for k in resources[2])
    for res in resources:
        assert res["service.instance.id"] == "test" and res["host.name"] == RESOURCE.attributes["host.name"]
    roots = [s for s in got.resource_spans[0].scope_spans[0].spans if not s.parent_span_id]
    exe = [kv.value.string_value for s in roots for kv in s.attributes if kv.key == "process.executable.name"]
    assert exe == [sessions[0].proc_comm, "checkout-server"]  # /proc/PID/exe's name when it was readable


def test_workload_envelopes_stay_bounded():
    envelopes = span_encoder.WorkloadEnvelopes(RESOURCE.attributes, RESOURCE.schema_url, max_entries=3)
    made = [envelopes.of(Workload(f"{i:064x}")) for i in range(10)]
    assert len(envelopes._cache) <= 3 and envelopes.of(None) is envelopes.base is envelopes.of(Workload())
    assert envelopes.of(Workload(f"{9:064x}")) is made[9]


def test_attribute_value_length_limit_cuts_stacks_and_arguments_and_says_so():
    """OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT: long values are cut to the limit, each string of an array too,
    and the span names what was cut; short values and other spans are left alone."""
    session = tree_session()
    session.calls[0].children[1].args = (ArgValue(0), ArgValue(1))

    def fmt(_func_id, values):
        return [f"arg{i}={'x' * 30}" for i, _ in enumerate(values)]

    full = {s["name"]: s for s in request_to_spans(build_request(
        [encoder_for(symbolize=symbolize, format_args=fmt).encode(session, OFFSET)]))}
    cut = {s["name"]: s for s in request_to_spans(build_request(
        [encoder_for(symbolize=symbolize, format_args=fmt, value_limit=20).encode(session, OFFSET)]))}
    root = next(n for n, s in full.items() if "code.stacktrace" in s["attributes"])
    stack = full[root]["attributes"]["code.stacktrace"]
    assert len(stack) > 20 and cut[root]["attributes"]["code.stacktrace"] == stack[:20]
    assert cut[root]["attributes"]["retsnoop.attributes_cut"] == ("code.stacktrace",)
    assert cut["map_create"]["attributes"]["retsnoop.args"] == ("arg0=" + "x" * 15, "arg1=" + "x" * 15)
    assert cut["map_create"]["attributes"]["retsnoop.attributes_cut"] == ("retsnoop.args",)
    assert "retsnoop.attributes_cut" not in full[root]["attributes"]
    others = [s for n, s in cut.items() if n not in (root, "map_create")]
    assert others and all("retsnoop.attributes_cut" not in s["attributes"] for s in others)
    none_cut = {s["name"]: s for s in request_to_spans(build_request(
        [encoder_for(symbolize=symbolize, format_args=fmt, value_limit=10_000).encode(session, OFFSET)]))}
    assert {n: s["attributes"] for n, s in none_cut.items()} == {n: s["attributes"] for n, s in full.items()}


@pytest.mark.parametrize(("env", "want"), [
    ({}, None), ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "4096"}, 4096),
    ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "4096", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100"}, 100),
    ({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": " ", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "0"}, 0)])
def test_attribute_value_limit_variables(env, want):
    from retsnoop_otel.export.span_limits import attribute_value_limit
    assert attribute_value_limit(env) == want


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "99999999999"])
def test_attribute_value_limit_that_is_no_length_is_warned_about_and_ignored(value):
    """The span-specific variable, when it is no length, falls back to the general one, and that to no limit."""
    from retsnoop_otel.export.otel_env import EnvWarnings
    from retsnoop_otel.export.span_limits import attribute_value_limit
    warnings = EnvWarnings()
    assert attribute_value_limit({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": value,
                                  "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "300"}, warnings) == 300
    assert attribute_value_limit({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": value}, warnings) is None
    (text, other) = warnings.messages
    assert re.fullmatch(r"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT='.*': not a length; write a number of characters "
                        r"such as 4096 \(0 or more\), or unset it for no limit; ignored, as if unset", text), text
    assert other.startswith(f"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT={value!r}: not a length"), other


def _parsed_spans(encoded) -> list:
    req = ExportTraceServiceRequest.FromString(build_request([encoded]))
    return [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


@pytest.mark.parametrize("limit", [0, 1, 3, 5])
def test_attribute_count_limit_keeps_the_first_attributes_and_counts_the_rest(limit: int):
    """OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT: every span holds at most `limit` attributes, the first ones of the
    span written without the limit, and dropped_attributes_count says how many it lost; ids, times, status and
    the tree are untouched (the protobuf classes parse what we wrote)."""
    session = tree_session()
    full = _parsed_spans(encoder_for(symbolize=symbolize, rng=random.Random(7)).encode(session, OFFSET))
    cut = _parsed_spans(encoder_for(symbolize=symbolize, rng=random.Random(7), count_limit=limit)
                        .encode(session, OFFSET))
    assert len(full) == len(cut) > 3
    assert max(len(s.attributes) for s in full) > limit  # something to cut
    for f, c in zip(full, cut, strict=True):
        assert list(c.attributes) == list(f.attributes)[:limit]
        assert c.dropped_attributes_count == max(0, len(f.attributes) - limit)
        assert (c.span_id, c.parent_span_id, c.start_time_unix_nano, c.end_time_unix_nano, c.status, c.name) == \
            (f.span_id, f.parent_span_id, f.start_time_unix_nano, f.end_time_unix_nano, f.status, f.name)


def test_attribute_count_limit_above_what_a_span_holds_changes_nothing():
    session = tree_session()
    full = encoder_for(symbolize=symbolize, rng=random.Random(7)).encode(session, OFFSET)
    roomy = encoder_for(symbolize=symbolize, rng=random.Random(7), count_limit=128).encode(session, OFFSET)
    assert roomy.spans == full.spans


@pytest.mark.parametrize(("env", "want"), [
    ({}, None), ({"OTEL_ATTRIBUTE_COUNT_LIMIT": "64"}, 64),
    ({"OTEL_ATTRIBUTE_COUNT_LIMIT": "64", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "8"}, 8),
    ({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "", "OTEL_ATTRIBUTE_COUNT_LIMIT": "0"}, 0)])
def test_attribute_count_limit_variables(env, want):
    from retsnoop_otel.export.span_limits import attribute_count_limit
    assert attribute_count_limit(env) == want


def test_attribute_count_limit_that_is_no_count_is_warned_about_and_ignored():
    from retsnoop_otel.export.otel_env import EnvWarnings
    from retsnoop_otel.export.span_limits import attribute_count_limit
    warnings = EnvWarnings()
    assert attribute_count_limit({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "ten"}, warnings) is None
    assert warnings.messages == ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT='ten': not a count; write a number of attributes "
                                 "such as 128 (0 or more), or unset it for the default of 128; ignored, as if unset",)


def test_span_limits_read_every_count():
    """OTEL_SPAN_EVENT_COUNT_LIMIT and OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT (the general attribute count limit applies
    to events too); a bad one is warned about once, whichever limits read it."""
    from retsnoop_otel.export.otel_env import EnvWarnings
    from retsnoop_otel.export.span_limits import SpanLimits, span_limits
    assert span_limits({}) == SpanLimits()
    env = {"OTEL_SPAN_EVENT_COUNT_LIMIT": "4", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "2",
           "OTEL_ATTRIBUTE_COUNT_LIMIT": "9"}
    assert span_limits(env) == SpanLimits(None, 9, 4, 2)
    warnings = EnvWarnings()
    assert span_limits({"OTEL_ATTRIBUTE_COUNT_LIMIT": "many", "OTEL_SPAN_EVENT_COUNT_LIMIT": "-3"},
                       warnings) == SpanLimits()
    assert [m.split("=")[0] for m in warnings.messages] == ["OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT"]

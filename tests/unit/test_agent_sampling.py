"""Sampling of successful sessions, the keep/drop decision, and the exporters built from config."""

from __future__ import annotations

import io
import json

import pytest

from retsnoop_otel.agent.config_file import parse_config
from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.capture.model import RetKind, Session, StackEntry, TracedFunc
from retsnoop_otel.capture.sampling import ALWAYS, KernelSampling, Sampling, kernel_sampling, threshold
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.export.otlp_settings import OtlpConfig
from retsnoop_otel.export.senders import build_sender
from retsnoop_otel.export.span_encoder import SpanEncoder, build_request, make_envelope
from retsnoop_otel.runtime.config import AGENT_NAMES
from retsnoop_otel.runtime.probe_set import capture_config
from retsnoop_otel.runtime.settings import otlp_settings
from tests.fakes import World, probe_set_config
from tests.otlp_receiver import start_receiver


def test_kernel_constants_of_each_sampling() -> None:
    """The kernel side decides (bpf/sampling.bpf.h; its behaviour is tested through uprobes in
    tests/native/test_native_sampling.py): these are the constants it is loaded with."""
    assert kernel_sampling(Sampling(0.0)) == KernelSampling()  # errors only: successes are not even reported
    assert kernel_sampling(Sampling(1.0)) == KernelSampling(True, ALWAYS)
    assert kernel_sampling(Sampling(0.25)) == KernelSampling(True, threshold(0.25))
    assert kernel_sampling(Sampling(0.25)).by_probability
    rate = kernel_sampling(Sampling(success_rate_per_s=2.0))  # burst of 2: one more interval of tolerance
    assert rate == KernelSampling(True, 0, 500_000_000, 500_000_000) and not rate.by_probability
    assert kernel_sampling(Sampling(success_rate_per_s=0.2)) == KernelSampling(True, 0, 5_000_000_000, 0)
    assert kernel_sampling(Sampling(0.5, 3.0)).interval_ns == 333_333_333  # a rate wins over a probability


def test_capture_config_follows_mode_sampling_and_filters() -> None:
    limits = parse_config("probe_sets: {a: {entry: f}}\nlimits: {ringbuf_size: 1M, max_sessions: 8}\n").runtime.limits
    cc = capture_config(probe_set_config(mode="calls", sampling=Sampling(0.1), min_duration_ns=2_500_000,
                                         comms=("a",)), "fentry", limits)
    assert cc.emit_calls and cc.capture_success and cc.min_duration_ns == 2_500_000 and cc.comms == ("a",)
    assert cc.success_threshold == threshold(0.1) and cc.success_interval_ns == 0
    assert cc.ringbuf_size == 1 << 20 and cc.max_sessions == 8 and cc.mode == "fentry"
    cc = capture_config(probe_set_config(sampling=Sampling(success_rate_per_s=4.0)), "kprobe", limits)
    assert cc.capture_success and cc.success_interval_ns == 250_000_000 and cc.success_burst_ns == 750_000_000
    cc = capture_config(probe_set_config(), "kprobe", limits)
    assert not cc.emit_calls and not cc.capture_success and cc.kernel_stack
    # metrics: counted in the kernel, no session ever reported (min duration out of reach), one-page ring
    cc = capture_config(probe_set_config(mode="metrics", sampling=Sampling(1.0), comms=("a",)), "kprobe", limits)
    assert not cc.emit_calls and not cc.capture_success and cc.min_duration_ns == (1 << 64) - 1
    assert cc.ringbuf_size == 4096 and cc.comms == ("a",)
    assert not cc.kernel_stack  # nothing would ever report it


def test_error_sessions_ignore_sampling_but_follow_the_error_filter(tmp_path, world: World) -> None:
    from retsnoop_otel.runtime.probe_set import ProbeSet
    from retsnoop_otel.symbols.discovery import discover
    from tests.fakes import make_env

    env = make_env()
    disc = discover(["__x64_sys_bpf"], ["array_map_alloc_check"], [], env.ksyms, env.available, env.ret_kind,
                    "kprobe")
    cfg = probe_set_config(errors=ErrorFilter.parse([], ["ENOENT"]), sampling=Sampling(0.0))
    ps = ProbeSet(cfg, disc, parse_config("probe_sets: {a: {entry: f}}").runtime.limits, env, world.factory,
                  lambda _p, _s: None)

    def session(res: int, is_err: bool) -> Session:
        return Session(1, 1, "c", "c", 0, 1, is_err, [StackEntry(0, (1 << 64) - res if res else 0, 5)], [])

    assert ps.accepts(session(22, True))  # EINVAL: kept whatever the sampling
    assert not ps.accepts(session(2, True)) and ps.filtered_out == 1  # ENOENT denied
    assert not ps.accepts(session(0, False)) and ps.sampled_out == 1  # a success the kernel did not keep


def _send_one(cfg: OtlpConfig, environ: dict) -> bool:
    """One session through the one exporter path: endpoint check, sender builder, production encoder."""
    sender = build_sender(otlp_settings(cfg, "traces", AGENT_NAMES.otlp, environ))
    funcs = {0: TracedFunc(0, "f", 0, RetKind.INT32, True)}
    trace = SpanEncoder(funcs, make_envelope({})).encode(
        Session(1, 1, "c", "c", 10, 20, True, [StackEntry(0, (1 << 64) - 22, 10)], []), 0)
    try:
        return sender.send(build_request([trace]), len(trace)).ok
    finally:
        sender.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_configured_exporters_reach_a_real_receiver(protocol: str) -> None:
    """A bare base URL works for both protocols (HTTP gets /v1/traces appended), with gzip and headers."""
    rx = start_receiver(port=0, http_port=0)
    try:
        port = rx.port if protocol == "grpc" else rx.http_port
        assert _send_one(OtlpConfig(endpoint=f"http://127.0.0.1:{port}", protocol=protocol,
                                    headers=(("x-tenant", "t1"),), compression="gzip", timeout_s=5), {})
        (span,) = rx.wait_for_spans(1, timeout=10)
        assert span["name"] == "f"
        (headers,) = rx.headers  # what went over the wire
        assert headers["x-tenant"] == "t1"
        if protocol == "http/protobuf":
            assert headers["content-encoding"] == "gzip"
    finally:
        rx.stop()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_standard_environment_variables_reach_the_wire(protocol: str) -> None:
    """No endpoint/headers in the config: OTEL_EXPORTER_OTLP_* decide, as for any OTel SDK exporter."""
    rx = start_receiver(port=0, http_port=0)
    try:
        port = rx.port if protocol == "grpc" else rx.http_port
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
               "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=from-env,authorization=Bearer%20abc",
               "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
        assert _send_one(OtlpConfig(), env)
        rx.wait_for_spans(1, timeout=10)
        (headers,) = rx.headers
        assert headers["x-tenant"] == "from-env" and headers["authorization"] == "Bearer abc"
        if protocol == "http/protobuf":
            assert headers["content-encoding"] == "gzip"
    finally:
        rx.stop()


def test_logs_text_and_json() -> None:
    buf = io.StringIO()
    log = EventLog(buf, "json", "info", clock=lambda: 1.5)
    log.debug("hidden")
    log.warning("data lost", probe_set="a", records_lost=3)
    assert json.loads(buf.getvalue()) == {"ts": 1.5, "level": "warning", "msg": "data lost", "probe_set": "a",
                                          "records_lost": 3}
    buf = io.StringIO()
    log = EventLog(buf, "text", "debug", clock=lambda: 0.0)
    log.debug("reload failed", error="bad: thing")
    assert buf.getvalue() == '1970-01-01T00:00:00.000Z DEBUG   reload failed error="bad: thing"\n'

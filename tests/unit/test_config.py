"""Agent config validation: every error names file, line and key, and says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from retsnoop_otel.agent.config_file import AgentConfig, ConfigError, load_config, parse_config
from retsnoop_otel.command.errors import InputError
from retsnoop_otel.inputs.addresses import parse_listen
from retsnoop_otel.runtime.config import Limits, MetricsConfig, RuntimeConfig
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.runtime import Runtime
from tests.tls_certs import make_ca

REPO = Path(__file__).resolve().parents[2]

BASE = """\
probe_sets:
  - name: errs
    entry: ["*sys_bpf"]
"""


def err(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "/etc/retsnoop/agent.yaml")
    return str(exc.value)


def settings_err(text: str) -> str:
    """An error the runtime finds as it resolves the file's settings, located in the file as the agent says it."""
    cfg = parse_config(text, "/etc/retsnoop/agent.yaml")
    with pytest.raises(InputError) as exc:
        Runtime(cfg.runtime, RuntimeDeps(environ={}, find_vmlinux=lambda _s, _n: None)).settings()
    return cfg.where(exc.value.message)


@pytest.mark.parametrize("path", sorted((REPO / "config").glob("agent*.yaml")), ids=lambda p: p.name)
def test_shipped_examples_are_valid(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.runtime.probe_sets


def test_full_config_becomes_typed_values(tmp_path: Path) -> None:
    make_ca(tmp_path, "ca")
    cert = tmp_path / "ca.crt"
    cfg = parse_config(f"""\
probe_sets:
  load:
    entry: bpf_prog_load
    allow: [bpf_check, "bpf_prog_alloc*"]
    deny: [bpf_obj_name_cpy]
    mode: calls
    attach_mode: kprobe_multi
    filters:
      pids: [1, 2]
      no_pids: 3
      comms: python
      min_duration_ms: 1.5
      allow_errors: [EINVAL, -ENOMEM]
    sampling:
      success_rate_per_s: 10
exporter:
  otlp:
    endpoint: https://collector:4318
    protocol: http/protobuf
    headers: {{authorization: "Bearer t"}}
    compression: gzip
    timeout: 2.5
    certificate: {cert}
metrics:
  listen: "[::1]:9500"
limits:
  ringbuf_size: 16MiB
  max_spans_per_trace: 100
logging: {{format: json, level: debug}}
""")
    (ps,) = cfg.runtime.probe_sets
    assert ps.name == "load" and ps.entry == ("bpf_prog_load",) and ps.mode == "calls"
    assert ps.attach_mode == "kprobe_multi" and ps.pids == (1, 2) and ps.no_pids == (3,) and ps.comms == ("python",)
    assert ps.min_duration_ns == 1_500_000 and ps.errors.allow == {"EINVAL", "ENOMEM"}
    assert ps.sampling.success_rate_per_s == 10 and ps.sampling.captures_success
    o = cfg.runtime.exporter.otlp
    assert o is not None and o.protocol == "http/protobuf" and o.headers == (("authorization", "Bearer t"),)
    assert o.timeout_s == 2.5 and o.certificate == str(cert) and o.compression == "gzip"
    m = cfg.runtime.metrics
    assert (m.host, m.port, m.listen) == ("::1", 9500, "[::1]:9500")
    assert cfg.runtime.limits.ringbuf_size == 16 << 20 and cfg.runtime.limits.max_spans_per_trace == 100
    assert cfg.logging.format == "json" and cfg.logging.level == "debug"


def test_defaults() -> None:
    cfg = parse_config(BASE)
    ps = cfg.runtime.probe_sets[0]
    assert ps.mode == "stack" and ps.attach_mode == "auto" and not ps.sampling.captures_success
    otlp = cfg.runtime.exporter.otlp
    assert otlp is not None and otlp.endpoint is None  # OTEL_* variables decide
    assert cfg.runtime.metrics.listen == "0.0.0.0:9464" and cfg.logging.format == "text"
    # a metrics section that leaves keys out gets the same defaults as no section
    metrics = parse_config(BASE + "metrics: {stall_after_s: 10}\n").runtime.metrics
    assert (metrics.host, metrics.port, metrics.max_workloads) == (MetricsConfig().host, 9464, 100)


def test_the_agent_config_holds_the_runtime_config() -> None:
    """The runtime is given the file's RuntimeConfig as it is; the agent keeps its path, logging and key lines."""
    assert AgentConfig._fields == ("runtime", "path", "logging", "lines")
    cfg = parse_config(BASE + "metrics: {listen: ':9500'}\nlogging: {level: debug}\n", "a.yaml")
    assert type(cfg.runtime) is RuntimeConfig and cfg.runtime.metrics.port == 9500
    assert cfg.lines["metrics.listen"] == 4 and cfg.where("metrics.listen: busy") == "a.yaml:4: metrics.listen: busy"
    assert cfg.where("OTEL_EXPORTER_OTLP_ENDPOINT: bad") == "OTEL_EXPORTER_OTLP_ENDPOINT: bad"  # not the file's
    assert (cfg.path, cfg.logging.level) == ("a.yaml", "debug")


def test_trace_flags_defaults_are_the_runtime_defaults() -> None:
    """The kernel-side sizes trace leaves to -C are the runtime's own defaults."""
    from retsnoop_otel.trace.flags import parse
    limits = parse(["-e", "*sys_bpf"], environ={}).config.limits
    defaults = Limits()
    assert (limits.ringbuf_size, limits.max_sessions) == (defaults.ringbuf_size, defaults.max_sessions)
    assert defaults.ringbuf_size == 8 << 20
    assert parse(["-e", "*sys_bpf", "-C", "bpf.ringbuf-size=65536"], environ={}).config.limits.ringbuf_size == 65536


def test_the_wait_for_user_stack_symbols_is_bounded() -> None:
    def wait(extra: str) -> float:
        return parse_config(BASE + extra, "a.yaml").runtime.limits.user_stack_wait_s

    assert wait("") == Limits().user_stack_wait_s == 1.0
    assert wait("limits:\n  user_stack_wait_s: 2.5\n") == 2.5
    assert wait("limits:\n  user_stack_wait_s: 0\n") == 0
    assert err(BASE + "limits:\n  user_stack_wait_s: 600\n") == (
        "agent.yaml:5: limits.user_stack_wait_s: must be between 0 and 60, got 600")


def test_unknown_key_with_did_you_mean() -> None:
    assert err(BASE + "    sampeling: {}\n") == (
        "agent.yaml:4: probe_sets[0].sampeling: unknown key; did you mean 'sampling'?")
    assert err(BASE + "metric:\n  listen: ':1'\n") == "agent.yaml:4: metric: unknown key; did you mean 'metrics'?"
    msg = err(BASE + "zzz: 1\n")
    assert msg.startswith("agent.yaml:4: zzz: unknown key; known keys: probe_sets, exporter")


def test_wrong_types_name_the_key_and_the_value() -> None:
    assert err("probe_sets:\n  - name: a\n    entry: 12\n") == (
        "agent.yaml:3: probe_sets[0].entry: expected a list of globs, got int 12")
    assert err(BASE + "    mode: fast\n") == (
        "agent.yaml:4: probe_sets[0].mode: expected one of stack, calls, metrics, got string 'fast'")
    assert err(BASE + "limits:\n  max_sessions: many\n") == (
        "agent.yaml:5: limits.max_sessions: expected an integer between 1 and 2147483648 (a BPF map's max_entries, "
        "at most 2^31), got string 'many'")
    assert err(BASE + "    filters: {pids: [1, x]}\n") == (
        "agent.yaml:4: probe_sets[0].filters.pids[1]: expected an integer between 1 and 4194304 (a process id, at "
        "most the kernel's PID_MAX_LIMIT), got string 'x'")
    assert err(BASE + "exporter:\n  console: yes please\n") == (
        "agent.yaml:5: exporter.console: expected true or false, got string 'yes please'")
    assert err("probe_sets: {}\n") == "agent.yaml:1: probe_sets: needs at least one probe set"
    assert err(BASE + "limits:\n  ringbuf_size: lots\n").startswith(
        "agent.yaml:5: limits.ringbuf_size: expected a size in bytes such as 8388608 or 8M, got 'lots'")


def test_bad_glob() -> None:
    assert err(BASE + "    allow: ['foo bar']\n").startswith(
        "agent.yaml:4: probe_sets[0].allow[0]: bad glob 'foo bar': expected 'func_glob'")
    assert "glob file" in err(BASE + "    deny: ['@/no/such/file']\n")
    assert err("probe_sets:\n  - name: a\n    entry: []\n") == (
        "agent.yaml:3: probe_sets[0].entry: needs at least one entry function glob")


def test_bad_endpoint_url() -> None:
    for bad, protocol in (("ftp://x:1", ""), ("http://host:99999", ""), ("http://:4317", ""),
                          ("http://c:4317/v1/traces", "    protocol: grpc\n"), ("collector:4317", "")):
        msg = settings_err(BASE + f"exporter:\n  otlp:\n    endpoint: '{bad}'\n{protocol}")
        assert msg.startswith("agent.yaml:6: exporter.otlp.endpoint"), msg
        assert bad in msg and "\n" not in msg
    # a scheme-less host:port is gRPC's form: with OTLP/HTTP, the default, the error names the key that fixes it
    msg = settings_err(BASE + "exporter:\n  otlp:\n    endpoint: 'collector:4317'\n")
    assert "write it like http://collector:4318, or set exporter.otlp.protocol=grpc" in msg, msg
    # gRPC takes it (TLS unless insecure), as the OTLP specification allows
    cfg = parse_config(BASE + "exporter:\n  otlp:\n    endpoint: 'collector:4317'\n    protocol: grpc\n")
    settings = Runtime(cfg.runtime, RuntimeDeps(environ={}, find_vmlinux=lambda _s, _n: None)).settings()
    assert (settings.traces.protocol, settings.traces.target, settings.traces.tls) == ("grpc", "collector:4317", True)


def test_sampling_rules() -> None:
    assert err(BASE + "    sampling: {errors: 0}\n") == (
        "agent.yaml:4: probe_sets[0].sampling.errors: 0 would export no error session: give a probability in (0, 1] "
        "(mode: metrics counts without exporting)")
    assert "not both" in err(BASE + "    sampling: {errors: 0.5, errors_rate_per_s: 3}\n")
    ps = parse_config(BASE + "    sampling: {errors: 0.1, success_probability: 0.01}\n").runtime.probe_sets[0]
    assert (ps.sampling.error_probability, ps.sampling.error_rate_per_s) == (0.1, None)
    ps = parse_config(BASE + "    sampling: {errors_rate_per_s: 2}\n").runtime.probe_sets[0]
    assert (ps.sampling.error_probability, ps.sampling.error_rate_per_s) == (1.0, 2)
    ps = parse_config(BASE + "    sampling: {errors_rate_per_s: 0}\n").runtime.probe_sets[0]  # 0: no rate limit
    assert not ps.sampling.samples_errors
    assert "not both" in err(BASE + "    sampling: {success_probability: 0.1, success_rate_per_s: 3}\n")
    assert err(BASE + "    sampling: {success_probability: 2}\n") == (
        "agent.yaml:4: probe_sets[0].sampling.success_probability: must be between 0 and 1, got 2")


def test_names_errors_and_files() -> None:
    assert "used twice" in err(BASE + "  - name: errs\n    entry: [x]\n")
    assert "missing 'name'" in err("probe_sets:\n  - entry: [x]\n")
    assert "is not a valid name" in err("probe_sets:\n  - name: 'a b'\n    entry: [x]\n")
    assert "EBOGUS" in err(BASE + "    filters: {allow_errors: [EBOGUS]}\n")
    assert "no such file" in err(BASE + "vmlinux: /no/vmlinux\n")
    assert "no exporter left" in err(BASE + "exporter: {otlp: null}\n")
    # metrics-only probe sets need no exporter
    cfg = parse_config(BASE + "    mode: metrics\nexporter: {otlp: null}\n", "agent.yaml")
    assert cfg.runtime.probe_sets[0].mode == "metrics" and cfg.runtime.exporter.otlp is None
    assert err("") == "agent.yaml:1: the file is empty; it needs at least a 'probe_sets:' section"
    assert err(BASE + "  - [\n").startswith("agent.yaml:5: not valid YAML")
    assert "duplicate key" in err(BASE + "    mode: calls\n    mode: stack\n")
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config("/no/such/agent.yaml")


def test_a_bad_error_name_names_its_own_list_once_and_bounded() -> None:
    """Black-box round 2: a bad deny_errors entry beside a valid allow_errors was blamed on allow_errors (its line),
    the name was echoed whole (50,000 characters) and a newline in it split the line; the hint was given twice."""
    text = err(BASE + "    filters:\n      allow_errors: [EINVAL]\n      deny_errors: [\"a\\nb\", ENOENT]\n")
    assert text == ("agent.yaml:6: probe_sets[0].filters.deny_errors: unknown errno name 'a\\nb' (use errno names "
                    "such as EINVAL, -ENOMEM, NULL or any)"), text
    text = err(BASE + "    filters: {allow_errors: [" + "y" * 50000 + "]}\n")
    assert "(50000 characters)" in text and len(text) < 300, text


def test_listen_addresses() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    assert "not HOST:PORT" in err(BASE + "metrics: {listen: 'localhost'}\n")
    assert "the port must be between 0 and 65535 (a TCP port), got '70000'" in err(
        BASE + "metrics: {listen: '0.0.0.0:70000'}\n")


def test_metrics_otlp_section() -> None:
    msg = settings_err(BASE + "metrics:\n  otlp:\n    endpoint: 'ftp://collector:4317'\n")
    assert msg.startswith("agent.yaml:6: metrics.otlp.endpoint") and "ftp://collector:4317" in msg, msg
    assert err(BASE + "metrics:\n  otlp_interval: 0\n") == (
        "agent.yaml:5: metrics.otlp_interval: must be between 1 and 86400, got 0")
    assert err(BASE + "metrics:\n  otlp: {bogus: 1}\n").startswith("agent.yaml:5: metrics.otlp.bogus: unknown key")


@pytest.mark.parametrize(("body", "want"), [
    ("metrics:\n  stall_after_s: 1.0e+30\n",
     "agent.yaml:5: metrics.stall_after_s: must be between 1 and 86400, got 1e+30"),
    ("metrics:\n  otlp_interval: 1.0e+30\n", "agent.yaml:5: metrics.otlp_interval: must be between 1 and 86400"),
    ("exporter:\n  otlp:\n    endpoint: http://c:4318\n    timeout: 1.0e+30\n",
     "agent.yaml:7: exporter.otlp.timeout: must be between 0.001 and 3600, got 1e+30"),
    ("exporter:\n  otlp:\n    endpoint: http://c:4318\n    headers: {x-tenant: 0x1F}\n",
     "agent.yaml:7: exporter.otlp.headers.x-tenant: expected a string (quote a number: '42'), got int (not shown"),
])
def test_values_past_any_use_refused(body: str, want: str) -> None:
    """A timeout or a stall of 1e30 s, a header YAML would rewrite (0x1F as 31): refused with the key's line."""
    msg = err(BASE + body)
    assert msg.startswith(want), msg
    assert "0x1F" not in msg and "31" not in msg


def test_lbr_key_takes_the_trace_flag_specs() -> None:
    from retsnoop_otel.kernel.lbr import BRANCH_KERNEL, BRANCH_TYPES
    cfg = parse_config(BASE + "    lbr: true\n", "a.yaml")
    assert cfg.runtime.probe_sets[0].lbr_branch_types == BRANCH_TYPES["any_return"] | BRANCH_KERNEL
    cfg = parse_config(BASE + "    lbr: any,cond\n", "a.yaml")
    assert cfg.runtime.probe_sets[0].lbr_branch_types == BRANCH_TYPES["any"] | BRANCH_TYPES["cond"] | BRANCH_KERNEL
    assert parse_config(BASE + "    lbr: false\n", "a.yaml").runtime.probe_sets[0].lbr_branch_types == 0
    assert parse_config(BASE, "a.yaml").runtime.probe_sets[0].lbr_branch_types == 0


def test_bad_lbr_values() -> None:
    msg = err(BASE + "    lbr: sideways\n")
    assert "agent.yaml:4: probe_sets[0].lbr:" in msg and "unknown branch type 'sideways'" in msg
    msg = err(BASE + "    mode: metrics\n    lbr: true\n")
    assert "probe_sets[0].lbr" in msg and "use mode stack or calls" in msg
    assert "expected true, false or branch types" in err(BASE + "    lbr: [any]\n")


def test_metrics_series_bounds() -> None:
    cfg = parse_config(BASE + "metrics:\n  max_error_types: 5\n  functions: ['*sys_bpf', map_create]\n", "a.yaml")
    assert cfg.runtime.metrics.max_error_types == 5 and cfg.runtime.metrics.functions == ("*sys_bpf", "map_create")
    assert "metrics.max_error_types" in err(BASE + "metrics:\n  max_error_types: 0\n")


def test_application_context_and_user_stacks_keys() -> None:
    cfg = parse_config(BASE, "a.yaml")
    assert cfg.runtime.probe_sets[0].app_context is True and cfg.runtime.probe_sets[0].user_stacks is False
    cfg = parse_config(BASE + "    app_context: false\n    user_stacks: true\n", "a.yaml")
    assert cfg.runtime.probe_sets[0].app_context is False and cfg.runtime.probe_sets[0].user_stacks is True
    assert "probe_sets[0].user_stacks" in err(BASE + "    user_stacks: sometimes\n")


def test_trace_flags_for_application_context_and_user_stacks() -> None:
    from retsnoop_otel.trace.flags import parse
    plain = parse(["-e", "*sys_bpf"], environ={}).config.probe_sets[0]
    assert plain.app_context and not plain.user_stacks
    both = parse(["-e", "*sys_bpf", "-U", "--no-app-context"], environ={}).config.probe_sets[0]
    assert both.user_stacks and not both.app_context


# ---- numbers: finite only (NaN passes every comparison; .inf and huge integers overflowed) ----

_SET = BASE + "    mode: stack\n"


@pytest.mark.parametrize("value", [".nan", ".NaN", ".inf", "-.inf", "1" + "0" * 400])
@pytest.mark.parametrize("where,key", [
    (_SET + "    filters:\n      min_duration_ms: {v}\n", "probe_sets[0].filters.min_duration_ms"),
    (_SET + "    sampling:\n      success_probability: {v}\n", "probe_sets[0].sampling.success_probability"),
    (_SET + "    sampling:\n      success_rate_per_s: {v}\n", "probe_sets[0].sampling.success_rate_per_s"),
    (_SET + "    sampling:\n      errors: {v}\n", "probe_sets[0].sampling.errors"),
    (_SET + "    sampling:\n      errors_rate_per_s: {v}\n", "probe_sets[0].sampling.errors_rate_per_s"),
    (_SET + "metrics:\n  stall_after_s: {v}\n", "metrics.stall_after_s"),
    (_SET + "metrics:\n  otlp_interval: {v}\n", "metrics.otlp_interval"),
    (_SET + "exporter:\n  otlp:\n    timeout: {v}\n", "exporter.otlp.timeout"),
], ids=lambda x: x if "\n" not in x else None)
def test_non_finite_numbers_refused_with_the_key(where, key, value):
    text = err(where.format(v=value))
    assert f": {key}: expected a finite number, got " in text and "\n" not in text and len(text) < 300, text


def test_min_duration_beyond_64_bit_nanoseconds_refused():
    text = err(_SET + "    filters:\n      min_duration_ms: 1.0e+300\n")
    assert "probe_sets[0].filters.min_duration_ms: must be between 0 and" in text


def test_long_values_are_echoed_cut():
    text = err(BASE + "    mode: " + "x" * 100000 + "\n")
    assert "(100000 characters)" in text and len(text) < 300, text

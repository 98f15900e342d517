"""No input gives a traceback: the trace flags and the agent's config file, fuzzed with hypothesis.

Every outcome must be one of: a valid configuration, argparse's exit (2, one line; 0 for --help),
or the one-line errors of the input checks (InputError/SetupError for flags, ConfigError for files).
The same examples at every run (what `make test` gates on); FUZZ_RANDOM=1 explores with fresh seeds.
"""

from __future__ import annotations

import contextlib
import io
import os

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from retsnoop_otel.agent.config_file import ConfigError, parse_config
from retsnoop_otel.command.errors import RunRefused
from retsnoop_otel.runtime.deps import RuntimeDeps
from retsnoop_otel.runtime.runtime import Runtime
from retsnoop_otel.trace.flags import build_parser, parse

FLAGS = sorted({opt for d in build_parser().declared for opt in d.action.option_strings})
VALUES = st.one_of(
    st.sampled_from(["*sys_bpf", "array_map_*", ":kernel/bpf/*.c", "f [mod]", "[", "", "-ENOMEM", "EINVAL", "any",
                     "0", "-1", "65536", "9464", "http://127.0.0.1:4317", "ftp://x", "http://:0", "localhost:4317",
                     "grpc", "http/protobuf", "http/json", "bpf.ringbuf-size=8M", "calls.max-per-session=0",
                     "x=y", "any_return,call", "sideways", "1e400", "nan", "/nonexistent/dir/t.json", "@/no/file",
                     "/sys/fs/cgroup/none", "-k", "--", "\x00", "é"]),
    st.text(max_size=12))
ARGV = st.lists(st.one_of(st.sampled_from(FLAGS), VALUES), max_size=12)


DERANDOMIZE = not os.environ.get("FUZZ_RANDOM")


def _refused_cleanly(exc: BaseException) -> bool:
    return isinstance(exc, RunRefused) and "\n" not in str(exc) and exc.exit_code in (1, 2)


@settings(max_examples=400, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(ARGV)
@example(["--entry", "--"])  # argparse turned the value '--' into an empty list
def test_trace_flags_never_trace_back(argv: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            request = parse(argv, environ={})
    except SystemExit as exc:
        assert exc.code in (0, 2), (argv, exc.code)
        if exc.code == 2:
            assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
        return
    if request.version:
        return
    deps = RuntimeDeps(find_vmlinux=lambda _symbols, _name: None, environ={}, root="/")
    try:
        Runtime(request.config, deps).settings()
    except Exception as exc:  # noqa: BLE001 - the assertion below says which exceptions are allowed
        assert _refused_cleanly(exc), (argv, repr(exc))


KEYS = ["probe_sets", "name", "entry", "allow", "deny", "mode", "attach_mode", "filters", "sampling", "lbr",
        "capture_args", "pids", "comms", "cgroup", "min_duration_ms", "allow_errors", "deny_errors",
        "success_probability", "success_rate_per_s", "exporter", "otlp", "endpoint", "protocol", "headers",
        "compression", "timeout", "insecure", "certificate", "client_key", "file", "console", "metrics", "listen",
        "otlp_interval", "max_error_types", "functions", "limits", "ringbuf_size", "max_sessions", "logging",
        "format", "level", "vmlinux", "kubernetes", "metadata", "node_name", "api_server", "token_file",
        "ca_file", "keep_deleted", "bogus"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 65), st.floats(allow_nan=True),
                    st.sampled_from(["*sys_bpf", "stack", "calls", "metrics", "grpc", "gzip", "8M", "0.0.0.0:9464",
                                     "[::1]:0", "http://127.0.0.1:4317", "ftp://x", "auto", "/no/such", "json",
                                     "EINVAL", "any_return", "", "@/no/file"]),
                    st.text(max_size=8))
TREES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                     max_leaves=20)


def _parse_or_config_error(text: str) -> None:
    try:
        parse_config(text, "fuzz.yaml")
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.yaml"), str(exc)


@settings(max_examples=400, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), TREES, max_size=6))
def test_agent_config_trees_never_trace_back(tree: dict) -> None:
    _parse_or_config_error(yaml.safe_dump(tree, allow_unicode=True))


@settings(max_examples=300, deadline=None, derandomize=DERANDOMIZE)
@given(st.text(max_size=200))
def test_agent_config_text_never_traces_back(text: str) -> None:
    _parse_or_config_error(text)


def test_a_deep_tree_is_a_config_error_not_a_crash() -> None:
    _parse_or_config_error("probe_sets: " + "[" * 5000)
    _parse_or_config_error("a: " + "{b: " * 3000 + "1" + "}" * 3000)


@settings(max_examples=100, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=64))
def test_config_files_of_any_bytes_never_trace_back(tmp_path_factory, data: bytes) -> None:
    from retsnoop_otel.agent.config_file import load_config
    path = tmp_path_factory.mktemp("cfg") / "agent.yaml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as exc:
        assert "\n" not in str(exc), str(exc)

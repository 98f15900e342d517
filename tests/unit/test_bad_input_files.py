"""Bad input through the real commands: exit 2, no traceback, one line on stderr naming the flag or key, quickly.

Run as subprocesses in a user namespace of their own (no capability over the kernel, whatever the host allows:
nothing is ever attached) with a 20 s timeout: a FIFO or /dev/zero given as a file used to block in open() or read
until the memory ran out. Valid input ends in the refusal of tracing (exit 1: no capability, or a kernel that
cannot trace); bad input has to exit 2 before that. An OTEL_* variable is not the tool's own input: a bad value is
one warning line, then ignored, and the run goes on to that refusal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.command_runs import UNPRIVILEGED

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 20


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(env or {})
    return subprocess.run([*UNPRIVILEGED, sys.executable, "-m", "retsnoop_otel", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=REPO, env=environ, stdin=subprocess.DEVNULL)


def _refused(proc: subprocess.CompletedProcess[str], *names: str) -> str:
    """Exit 2, no traceback, one line on stderr that holds every one of `names`; returns that line."""
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode == 2, (proc.returncode, out)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def _warned(proc: subprocess.CompletedProcess[str], *names: str) -> str:
    """One warning line that holds every one of `names`, then the refusal of tracing (exit 1): nothing else, no
    traceback; returns the warning."""
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 2, (proc.returncode, out)
    warning, refusal = lines
    assert warning.startswith("retsnoop-otel: warning: ") and warning.endswith("; ignored, as if unset"), warning
    assert "needs root or the CAP_BPF" in refusal or "cannot be traced here" in refusal, refusal
    for name in names:
        assert name in warning, (name, warning)
    return warning


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(body)
    return path


MINIMAL = "probe_sets:\n  - name: errs\n    entry: ['*sys_bpf']\n    mode: metrics\n"


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_agent_check_fifo(fifo: Path):
    _refused(_run("agent", "--check", str(fifo)), "--check file", "FIFO")


def test_agent_config_dev_zero():
    _refused(_run("agent", "--config", "/dev/zero"), "--config file", "character device")


def test_agent_check_directory(tmp_path: Path):
    _refused(_run("agent", "--check", str(tmp_path)), "--check file", "directory")


def test_agent_check_config_over_the_cap(tmp_path: Path):
    path = _config(tmp_path, MINIMAL + "#" * (4 << 20))
    _refused(_run("agent", "--check", str(path)), "--check file", "larger than 4 MiB")


def test_agent_check_config_not_utf8(tmp_path: Path):
    path = tmp_path / "agent.yaml"
    path.write_bytes(MINIMAL.encode() + b"# \xff\n")
    _refused(_run("agent", "--check", str(path)), "agent.yaml", f"at byte {len(MINIMAL) + 2}")


def test_trace_glob_file_dev_zero():
    _refused(_run("trace", "-e", "@/dev/zero", "--dry-run"), "/dev/zero", "glob file", "character device")


def test_trace_glob_file_fifo(fifo: Path):
    _refused(_run("trace", "-e", "*sys_bpf", "-a", f"@{fifo}", "--dry-run"), "glob file", "FIFO")


def test_trace_glob_file_not_utf8(tmp_path: Path):
    path = tmp_path / "globs"
    path.write_bytes(b"*sys_bpf\n\xc3\x28\n")
    _refused(_run("trace", "-e", f"@{path}", "--dry-run"), "globs: not a text file", "at byte 9")


def test_agent_config_allow_glob_file_fifo(tmp_path: Path, fifo: Path):
    path = _config(tmp_path, MINIMAL + f"    allow: '@{fifo}'\n")
    _refused(_run("agent", "--check", str(path)), "agent.yaml:5: probe_sets[0].allow", "FIFO")


def test_trace_web_config_fifo(fifo: Path):
    _refused(_run("trace", "-e", "*sys_bpf", "--metrics-port", "9464", "--web.config.file", str(fifo)),
             "--web.config.file", "web config file is a FIFO")


def test_agent_web_config_dev_zero(tmp_path: Path):
    path = _config(tmp_path, MINIMAL + "metrics:\n  web_config_file: /dev/zero\n")
    _refused(_run("agent", "--check", str(path)), "metrics.web_config_file", "character device")


def test_trace_otlp_certificate_variable_fifo_is_warned_about(fifo: Path):
    _warned(_run("trace", "-e", "*sys_bpf", "--otlp-endpoint", "https://collector:4317",
                  env={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(fifo)}), "OTEL_EXPORTER_OTLP_CERTIFICATE", "FIFO")


def test_agent_otlp_certificate_over_the_cap(tmp_path: Path):
    big = tmp_path / "ca.crt"
    big.write_bytes(b"x" * ((1 << 20) + 1))
    path = _config(tmp_path, "probe_sets:\n  - name: errs\n    entry: ['*sys_bpf']\n"
                   f"exporter:\n  otlp:\n    endpoint: https://collector:4317\n    certificate: {big}\n")
    _refused(_run("agent", "--check", str(path)), "exporter.otlp.certificate", "larger than 1 MiB")


# ---- endpoints a URL parser refuses (they raised ValueError from the code that hides secrets) ----

def test_trace_otlp_endpoint_unclosed_bracket():
    line = _refused(_run("trace", "-e", "*sys_bpf", "--otlp-endpoint", "http://user:SECRET@[::1"),
                    "--otlp-endpoint", "not a valid URL", "write it like")
    assert "SECRET" not in line and "user" not in line


def test_trace_otlp_endpoint_variable_unclosed_bracket_is_warned_about():
    _warned(_run("trace", "-e", "*sys_bpf", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"}),
             "OTEL_EXPORTER_OTLP_ENDPOINT", "not a valid URL")


def test_agent_check_warns_about_a_variable_and_still_refuses_a_bad_key(tmp_path: Path):
    """agent --check says the OTEL_* values it ignores on stderr, then goes on (here: past the kernel's checks, which
    it skips without privileges); its own keys are still refused (exit 2), whatever the variables say."""
    path = _config(tmp_path, MINIMAL + "exporter:\n  otlp:\n    endpoint: http://collector:4318\n")
    proc = _run("agent", "--check", str(path), env={"OTEL_TRACES_EXPORTER": "zipkin"})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "kernel checks skipped (" in proc.stdout, proc.stdout
    assert lines[0] == ("retsnoop-otel agent: warning: OTEL_TRACES_EXPORTER='zipkin': 'zipkin' is not an exporter "
                        "this tool has (otlp, console, none); ignored, as if unset"), lines[0]
    bad = _config(tmp_path, MINIMAL + "exporter:\n  otlp:\n    endpoint: 'http://[::1'\n")
    _refused(_run("agent", "--check", str(bad), env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}),
             "agent.yaml:7: exporter.otlp.endpoint", "not a valid URL")


def test_agent_otlp_endpoint_unclosed_bracket(tmp_path: Path):
    path = _config(tmp_path, "probe_sets:\n  - name: errs\n    entry: ['*sys_bpf']\n"
                   "exporter:\n  otlp:\n    endpoint: 'http://[::1'\n")
    _refused(_run("agent", "--check", str(path)), "agent.yaml:6: exporter.otlp.endpoint", "not a valid URL")


def test_trace_otlp_endpoint_control_character_and_long_host():
    _refused(_run("trace", "-e", "*sys_bpf", "--otlp-endpoint", "http://c\x1b[31m:4317"),
             "--otlp-endpoint", "control character")
    line = _refused(_run("trace", "-e", "*sys_bpf", "--otlp-endpoint", "http://" + "h" * 100000 + ":4317"),
                    "--otlp-endpoint", "more than a host name can have (253)", "(100012 characters)")
    assert len(line) < 400


def test_agent_kubernetes_api_server_unclosed_bracket(tmp_path: Path):
    path = _config(tmp_path, MINIMAL + "kubernetes:\n  metadata: true\n  api_server: 'https://[::1'\n")
    _refused(_run("agent", "--check", str(path)), "kubernetes.api_server", "is not an https:// URL")


# ---- numbers in the agent's config: NaN and infinity refused with the key ----

@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_agent_min_duration_not_finite(tmp_path: Path, value: str):
    path = _config(tmp_path, MINIMAL + f"    filters:\n      min_duration_ms: {value}\n")
    _refused(_run("agent", "--check", str(path)), "agent.yaml:6: probe_sets[0].filters.min_duration_ms",
             "expected a finite number")


def test_agent_success_probability_nan(tmp_path: Path):
    path = _config(tmp_path, "probe_sets:\n  - name: errs\n    entry: ['*sys_bpf']\n    sampling:\n"
                   "      success_probability: .nan\nexporter:\n  console: true\n")
    _refused(_run("agent", "--check", str(path)), "probe_sets[0].sampling.success_probability",
             "expected a finite number")


def test_trace_long_bad_glob_echoed_cut():
    line = _refused(_run("trace", "-e", "[" * 100000, "--dry-run"), "glob", "(100000 characters)")
    assert len(line) < 400


# ---- agent --check: "configuration is valid" only after every check passed ----

def _check_failed(proc: subprocess.CompletedProcess[str], code: int, *names: str) -> None:
    """The valid line never appears together with an error: only the error line, with its exit code."""
    out = proc.stdout + proc.stderr
    assert "configuration is valid" not in out, out
    assert "Traceback" not in out, out
    assert proc.returncode == code, (proc.returncode, out)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_agent_check_missing_web_config_file(tmp_path: Path):
    path = _config(tmp_path, MINIMAL + f"metrics:\n  web_config_file: {tmp_path / 'web.yml'}\n")
    _check_failed(_run("agent", "--check", str(path)), 2, "metrics.web_config_file", "No such file")


def test_agent_check_vmlinux_not_elf(tmp_path: Path):
    (tmp_path / "vmlinux").write_bytes(b"\x01" * 100)
    path = _config(tmp_path, MINIMAL + f"vmlinux: {tmp_path / 'vmlinux'}\n")
    _check_failed(_run("agent", "--check", str(path)), 2, "vmlinux", "not an ELF")


def test_agent_check_missing_cgroup(tmp_path: Path):
    path = _config(tmp_path, MINIMAL + "    filters:\n      cgroup: /sys/fs/cgroup/no-such-cgroup-here\n")
    _check_failed(_run("agent", "--check", str(path)), 2, "filters.cgroup", "no-such-cgroup-here")


def test_agent_check_valid_config_on_a_host_without_tracing(tmp_path: Path):
    """This host cannot trace kernel functions: the kernel's checks are skipped and named, the rest passes (exit 0),
    with "valid" as the last line and nothing on stderr."""
    path = _config(tmp_path, MINIMAL)
    proc = _run("agent", "--check", str(path))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "kernel checks skipped (" in proc.stdout and proc.stdout.rstrip().endswith("kernel checks skipped)")


# ---- integers within the kernel types they end up in; the trace command's numbers name flag and value ----

@pytest.mark.parametrize(("body", "key", "value", "bound"), [
    ("    filters:\n      pids: [99999999999999999999]\n", "agent.yaml:6: probe_sets[0].filters.pids[0]",
     "'99999999999999999999'", "between 1 and 4194304"),
    ("    filters:\n      no_pids: 4194305\n", "agent.yaml:6: probe_sets[0].filters.no_pids", "'4194305'",
     "between 1 and 4194304"),
    ("limits:\n  max_spans_per_trace: 18446744073709551617\n", "agent.yaml:6: limits.max_spans_per_trace",
     "'18446744073709551617'", "between 1 and 4294967295"),
    ("limits:\n  max_sessions: 4294967296\n", "agent.yaml:6: limits.max_sessions", "'4294967296'",
     "between 1 and 2147483648"),
    ("limits:\n  ringbuf_size: 8G\n", "agent.yaml:6: limits.ringbuf_size", "'8G'", "between 1 and 2147483648"),
    ("limits:\n  export_queue_spans: 0x10000000000000000\n", "agent.yaml:6: limits.export_queue_spans",
     "'0x10000000000000000'", "between 1 and 4294967295"),
    ("metrics:\n  max_workloads: -1\n", "agent.yaml:6: metrics.max_workloads", "'-1'", "between 1 and 4294967295"),
    ("metrics:\n  max_error_types: 4294967296\n", "agent.yaml:6: metrics.max_error_types", "'4294967296'",
     "between 1 and 4294967295"),
    ("metrics:\n  listen: '0.0.0.0:65536'\n", "agent.yaml:6: metrics.listen", "'65536'", "between 0 and 65535"),
])
def test_agent_integer_out_of_its_range(tmp_path: Path, body: str, key: str, value: str, bound: str):
    path = _config(tmp_path, MINIMAL + body)
    _refused(_run("agent", "--check", str(path)), key, f"got {value}", bound)


def test_agent_integer_of_5000_digits(tmp_path: Path):
    """Python cannot convert (or print) a decimal integer over 4300 digits: refused by its length, cut."""
    path = _config(tmp_path, MINIMAL + f"    filters:\n      pids: [{'9' * 5000}]\n")
    line = _refused(_run("agent", "--check", str(path)), "probe_sets[0].filters.pids[0]", "(5000 characters)")
    assert len(line) < 400


def test_agent_largest_pid_passes_validation(tmp_path: Path):
    path = _config(tmp_path, MINIMAL + "    filters:\n      pids: [4194304]\nlimits:\n  ringbuf_size: 2G\n")
    proc = _run("agent", "--check", str(path))
    assert proc.returncode == 0 and "kernel checks skipped" in proc.stdout, proc.stderr  # past validation


@pytest.mark.parametrize(("flags", "names"), [
    (["-p", "99999999999999999999"], ["-p/--pid", "'99999999999999999999'", "between 1 and 4194304"]),
    (["-P", "0"], ["-P/--no-pid", "'0'", "between 1 and 4194304"]),
    (["-p", "9" * 5000], ["-p/--pid", "(5000 characters)"]),
    (["-L", "-1"], ["-L/--longer", "got '-1'", "milliseconds"]),
    (["-L", "nan"], ["-L/--longer", "got 'nan'"]),
    (["-L", "inf"], ["-L/--longer", "got 'inf'"]),
    (["-L", "1e300"], ["-L/--longer", "got '1e300'"]),
    (["-C", "bpf.ringbuf-size=0x100000000"], ["-C bpf.ringbuf-size", "'0x100000000'", "between 1 and 2147483648"]),
    (["-C", "bpf.sessions-size=" + "9" * 5000], ["-C bpf.sessions-size", "(5000 characters)"]),
    (["--metrics-port", "9" * 5000], ["--metrics-port", "(5000 characters)"]),
    (["--lbr-max-count", "9" * 5000], ["--lbr-max-count", "(5000 characters)"]),
])
def test_trace_number_flags_name_the_flag_and_the_value(flags: list[str], names: list[str]):
    line = _refused(_run("trace", "-e", "*sys_bpf", *flags), *names)
    assert len(line) < 400


def test_trace_largest_pid_passes_validation():
    proc = _run("trace", "-e", "*sys_bpf", "-p", "4194304", "-L", "0.5", "-C", "bpf.ringbuf-size=0x1000")
    assert proc.returncode == 1 and "kernel" in proc.stderr, proc.stderr


# ---- secrets never echoed: basic_auth values, OTLP header values ----

def test_trace_web_config_plain_password_not_echoed(tmp_path: Path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: hunter2SECRET\n")
    line = _refused(_run("trace", "-e", "*sys_bpf", "--metrics-port", "9464", "--web.config.file", str(web)),
                    "basic_auth_users.alice", "'alice'", "not a bcrypt hash")
    assert "hunter2" not in line and "SECRET" not in line


def test_agent_web_config_plain_password_not_echoed(tmp_path: Path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  bob: 12345SECRET\n")
    path = _config(tmp_path, MINIMAL + f"metrics:\n  web_config_file: {web}\n")
    line = _refused(_run("agent", "--check", str(path)), "basic_auth_users.bob", "not a bcrypt hash")
    assert "SECRET" not in line and "12345" not in line


# ---- a bcrypt cost whose check would pin a CPU for days (issue 47 point 3) ----

COST_31 = "basic_auth_users:\n  alice: '$2y$31$" + "a" * 53 + "'\n"
COST_31_SAYS = "basic_auth_users.alice: bcrypt cost 31 is outside 4..14 (each login with a wrong password"


def test_trace_web_config_bcrypt_cost_above_the_cap(tmp_path: Path):
    web = tmp_path / "web-hash.yml"
    web.write_text(COST_31)
    line = _refused(_run("trace", "-e", "*sys_bpf", "--metrics-port", "9464", "--metrics-addr", "127.0.0.1",
                         "--web.config.file", str(web)), f"--web.config.file: {web}:2: {COST_31_SAYS}")
    assert "htpasswd -nBC 10" in line


def test_agent_web_config_bcrypt_cost_above_the_cap(tmp_path: Path):
    web = tmp_path / "web-hash.yml"
    web.write_text(COST_31)
    path = _config(tmp_path, MINIMAL + f"metrics:\n  web_config_file: {web}\n")
    _check_failed(_run("agent", "--check", str(path)), 2, f"{web}:2: {COST_31_SAYS}")
    _refused(_run("agent", "--config", str(path)), f"{web}:2: {COST_31_SAYS}")


@pytest.mark.parametrize(("value", "named", "protocol"), [
    ("Authorization: Bearer SECRET", "header 'Authorization' has no '='", []),
    ("x-api-key=SEC%0ARET", "header 'x-api-key' has a control character", []),
    ("ok=1,Authorization: Bearer SEC=RET", "header #2 (its name starts 'Authorization')", []),  # OTLP/HTTP
    ("ok=1,Authorization: Bearer SEC=RET", "header #2 (its name starts 'authorization')",  # gRPC: lower case
     ["--otlp-protocol", "grpc"]),
])
def test_trace_otlp_header_variable_warned_about_by_key_never_by_value(value: str, named: str, protocol: list[str]):
    proc = _run("trace", "-e", "*sys_bpf", "--otlp-endpoint", "http://c:4318", *protocol,
                env={"OTEL_EXPORTER_OTLP_HEADERS": value})
    _warned(proc, "OTEL_EXPORTER_OTLP_HEADERS", named)
    assert "SEC" not in proc.stderr and "Bearer" not in proc.stderr


# ---- YAML aliases: what a config expands to is bounded ----

def _refused_in_time(path: Path, *names: str) -> None:
    """Refused before the hang detector (_run's TIMEOUT_S) fires: an expansion that were not bounded would take
    hours (10^10 globs), so the outcome tells, not the seconds a loaded machine takes."""
    _refused(_run("agent", "--check", str(path)), *names)


def test_agent_config_billion_laughs(tmp_path: Path):
    """Nested lists of aliases, 10 levels of 10: a few hundred bytes that stand for 10^10 globs."""
    lines = ["probe_sets:", "  - name: errs", "    entry: &a0 ['*sys_bpf']", "    mode: metrics", "    allow:"]
    lines += [f"      - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 11)]
    path = _config(tmp_path, "\n".join(lines) + "\n")
    _refused_in_time(path, "agent.yaml", "expands to more than 100,000 YAML nodes")


def test_agent_config_one_glob_list_aliased_into_many_probe_sets(tmp_path: Path):
    """The issue's 160 kB config: one 20,000-glob list, aliased into 2,000 probe sets (--check busy past 30 s)."""
    globs = ", ".join(f"f{i}" for i in range(20000))
    body = (f"probe_sets:\n  - &s {{name: errs, entry: ['*sys_bpf'], allow: [{globs}], mode: metrics}}\n"
            + "  - *s\n" * 2000)
    path = _config(tmp_path, body)
    _refused_in_time(path, "expands to more than 100,000 YAML nodes")  # composing 160 kB: ~1 s


def test_recursive_alias_refused():
    from retsnoop_otel.agent.config_file import parse_config
    from retsnoop_otel.runtime.yaml_nodes import ConfigError
    with pytest.raises(ConfigError, match="expands to more than 100,000"):
        parse_config("probe_sets: &x [*x]\n", "agent.yaml")


@pytest.mark.parametrize("path", sorted((REPO / "config").glob("agent*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_still_load(path: Path):
    from retsnoop_otel.agent.config_file import load_config
    load_config(path)


# ---- signals: a long read or check of an input is stopped by SIGINT and SIGTERM ----

@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_stops_the_check_of_a_large_input(tmp_path: Path, sig: signal.Signals, code: int):
    """Ctrl-C (exit 130, no traceback) and SIGTERM (the default: the process ends) while a config just under its
    4 MiB cap is read and composed, about 4 s on the CI host."""
    body = "probe_sets:\n  - name: s\n    entry: ['*sys_bpf']\n    allow:\n"
    path = _config(tmp_path, body + "".join(f"      - 'fn_{i:07d}*'\n" for i in range(185_000)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # a make started in the background (`make test &`) runs with SIGINT ignored, and an ignored signal stays
    # ignored across exec: the child gets it handled here, which exec turns into the default
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([*UNPRIVILEGED, sys.executable, "-m", "retsnoop_otel", "agent", "--check", str(path)],
                                cwd=REPO, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    time.sleep(0.5)
    assert proc.poll() is None, "the check ended before the signal: the input is too small to show anything"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == code and "Traceback" not in err, (proc.returncode, err)


# ---- values that can never work, refused at input with one bounded line naming the flag or key (issue 47.4) ----

LONG = "a" * 100_000  # a value echoed whole made a 100 kB line (an argument holds at most 128 kB)


@pytest.mark.parametrize(("flags", "names"), [
    (["-x", ""], ["-x/--allow-errors", "an empty error name"]),
    (["-X", ""], ["-X/--deny-errors", "an empty error name"]),
    (["-X", "EINVAL,"], ["-X/--deny-errors", "an empty error name"]),
    (["--cgroup", ""], ["--cgroup", "an empty path"]),
    (["-k", ""], ["-k/--kernel", "an empty path"]),
    (["-n", ""], ["-n/--comm", "an empty thread name"]),
    (["-N", " "], ["-N/--no-comm", "an empty thread name"]),
    (["--probe-set", "abc\n"], ["--probe-set", r"'abc\n' is not a valid name"]),
    (["--probe-set", 'a"b'], ["--probe-set", "'a\"b' is not a valid name"]),
    (["--probe-set", LONG], ["--probe-set", "(100000 characters) is not a valid name"]),
    (["--metrics-port", "9464", "--metrics-addr", "[::1"], ["--metrics-addr", "'[::1' is not a host name"]),
    (["--metrics-port", "9464", "--metrics-addr", LONG], ["--metrics-addr", "(100000 characters)"]),
    (["--cgroup", "/sys/fs/cgroup/" + LONG], ["--cgroup /sys/fs/cgroup/aaa", "(100015 characters) is not in"]),
])
def test_trace_value_that_can_never_work(flags: list[str], names: list[str]):
    line = _refused(_run("trace", "-e", "*sys_bpf", *flags), *names)
    assert len(line) < 400 and line.count("characters)") <= 1 + line.count("253 characters)"), line


def test_trace_long_values_have_their_length_said_once():
    """A value cut by the message (shown()) is not cut again by the one-line parser: one length note."""
    for flags in (["-C", "bpf.ringbuf-size=" + LONG], ["--web.listen-address", LONG]):
        line = _refused(_run("trace", "-e", "*sys_bpf", *flags), flags[0], "(100000 characters)")
        assert line.count("characters)") == 1 and len(line) < 400, line


@pytest.mark.parametrize(("flags", "named"), [
    (["--metrics-port", "9464", "--metrics-addr", "nosuchhost.invalid"], "in --metrics-addr"),
    (["--web.listen-address", "nosuchhost.invalid:9464"], "in --web.listen-address"),
])
def test_trace_listen_address_not_of_this_machine_names_the_address_flag(flags: list[str], named: str):
    proc = _run("trace", "-e", "*sys_bpf", *flags)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "nosuchhost.invalid is not an address of this machine" in proc.stderr and named in proc.stderr
    assert "--metrics-port" not in proc.stderr


@pytest.mark.parametrize(("body", "names"), [
    ("    filters:\n      cgroup: ''\n", ["agent.yaml:6: probe_sets[0].filters.cgroup", "an empty path"]),
    ("    filters:\n      comms: ['']\n", ["agent.yaml:6: probe_sets[0].filters.comms", "an empty thread name"]),
    ("    filters:\n      allow_errors: ['']\n", ["probe_sets[0].filters.allow_errors", "an empty error name"]),
    ("vmlinux: ''\n", ["agent.yaml:5: vmlinux", "an empty path"]),
    ("metrics:\n  listen: 9464\n", ["agent.yaml:6: metrics.listen: expected a string, got int 9464"]),
    (f"metrics:\n  listen: '{'h' * 300}:9464'\n", ["agent.yaml:6: metrics.listen", "(305 characters)",
                                                   "more than a host name can have (253)"]),
    (f"    filters:\n      cgroup: /sys/fs/cgroup/{LONG}\n", ["probe set 'errs': filters.cgroup",
                                                              "(100015 characters) is not in the cgroup"]),
])
def test_agent_value_that_can_never_work(tmp_path: Path, body: str, names: list[str]):
    line = _refused(_run("agent", "--check", str(_config(tmp_path, MINIMAL + body))), *names)
    assert len(line) < 400 and line.count("agent.yaml:") <= 1, line  # one prefix at most


@pytest.mark.parametrize(("name", "shown"), [('"abc\\n"', r"'abc\n'"), ("'a\"b'", "'a\"b'"),
                                            (LONG, "(100000 characters)")])
def test_agent_probe_set_name_that_can_never_work(tmp_path: Path, name: str, shown: str):
    path = _config(tmp_path, f"probe_sets:\n  - name: {name}\n    entry: ['*sys_bpf']\n    mode: metrics\n")
    line = _refused(_run("agent", "--check", str(path)), "agent.yaml:2: probe_sets[0].name", shown,
                    "is not a valid name")
    assert len(line) < 400, line


@pytest.mark.parametrize(("flags", "names"), [
    (["-J", "kprobe:foo+99999999999999999999"], ["-J 'kprobe:foo+99999999999999999999'", "past any kernel function",
                                                 "at most 0xfffff"]),
    (["-J", "kprobe:foo+0x100000"], ["-J", "past any kernel function"]),
    (["-J", "kprobe:foo+" + "9" * 5000], ["-J", "(5000 characters)", "past any kernel function"]),
    (["-E"], ["-E/--call-stack needs -T"]),
    (["--trace-json", "/tmp/t.json"], ["--trace-json needs -T"]),
])
def test_trace_flag_that_can_never_work(flags: list[str], names: list[str]):
    line = _refused(_run("trace", "-e", "*sys_bpf", *flags), *names)
    assert len(line) < 400, line


def test_trace_call_stack_and_trace_json_with_t_pass_validation(tmp_path: Path):
    proc = _run("trace", "-e", "*sys_bpf", "-T", "-E", "--trace-json", str(tmp_path / "t.json"))
    assert proc.returncode == 1 and "kernel" in proc.stderr, proc.stderr


@pytest.mark.parametrize("delay", ["nan", "inf", "1e300", "-1"])
def test_simfail_delay_that_can_never_work(delay: str):
    _refused(_run("simfail", "--delay-ms", delay, "-a"), "--delay-ms", f"got '{delay}'", "from 0 to 3600000")


@pytest.mark.parametrize(("body", "names"), [
    ("exporter:\n  otlp:\n    endpoint: http://c:4318\n    timeout: 1.0e+30\n",
     ["agent.yaml:8: exporter.otlp.timeout", "between 0.001 and 3600"]),
    ("metrics:\n  stall_after_s: 1.0e+30\n", ["agent.yaml:6: metrics.stall_after_s", "between 1 and 86400"]),
    ("exporter:\n  otlp:\n    endpoint: http://c:4318\n    headers:\n      x-key: \"SEC\\r\\nRET\"\n",
     ["exporter.otlp.headers", "header 'x-key' has a control character in its value (not shown)"]),
    ("exporter:\n  otlp:\n    endpoint: http://c:4318\n    headers:\n      x-key: 0x5EC\n",
     ["agent.yaml:9: exporter.otlp.headers.x-key", "expected a string", "(not shown"]),
])
def test_agent_otlp_value_that_can_never_work(tmp_path: Path, body: str, names: list[str]):
    line = _refused(_run("agent", "--check", str(_config(tmp_path, MINIMAL + body))), *names)
    assert "SEC" not in line and "5EC" not in line, line


@pytest.mark.parametrize(("env", "names"), [
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "1e30"}, ["OTEL_EXPORTER_OTLP_TIMEOUT='1e30'", "longer than an hour"]),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "x-key=S3CR%zzT"}, ["OTEL_EXPORTER_OTLP_HEADERS:", "header 'x-key'",
                                                        "bad percent-escape"]),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "ok=1,x-key=S3CR%ffT"}, ["header 'x-key'", "bad percent-escape"]),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"}, ["OTEL_EXPORTER_OTLP_COMPRESSION='deflate'", "use gzip or none"]),
    ({"OTEL_RESOURCE_ATTRIBUTES": "secret=S3CRPW,T0KEN"}, ["OTEL_RESOURCE_ATTRIBUTES:", "entry 2 has no '='"]),
])
def test_otel_variable_that_can_never_work_is_warned_about(env: dict[str, str], names: list[str]):
    warning = _warned(_run("trace", "-e", "*sys_bpf", "--otlp-endpoint", "http://c:4318", env=env), *names)
    assert "S3CR" not in warning and "T0KEN" not in warning, warning


@pytest.mark.parametrize(("web", "names"), [
    ("http_server_config:\n  headers:\n    Strict-Transport-Security: \"max-age=1\\r\\nSet-Cookie: x\"\n",
     ["web.yml:3: http_server_config.headers.Strict-Transport-Security", "a control character"]),
    ("basic_auth_users:\n  '': $2y$10$" + "a" * 53 + "\n", ["web.yml:2: basic_auth_users", "the user name ''",
                                                            "cannot log in"]),
    ("basic_auth_users:\n  'al:ice': $2y$10$" + "a" * 53 + "\n", ["the user name 'al:ice'", "cannot log in"]),
])
def test_web_config_value_that_can_never_work(tmp_path: Path, web: str, names: list[str]):
    path = tmp_path / "web.yml"
    path.write_text(web)
    line = _refused(_run("trace", "-e", "*sys_bpf", "--metrics-port", "9464", "--web.config.file", str(path)),
                    "--web.config.file", *names)
    assert "Set-Cookie" not in line, line


@pytest.mark.parametrize(("where", "names"), [
    ("{tmp}/file", ["RETSNOOP_OTEL_CACHE=", "it is a file, not a directory"]),
    ("{tmp}/file/below", ["/file is a file, not a directory"]),
    ("/dev/null", ["RETSNOOP_OTEL_CACHE='/dev/null'", "it is a character device, not a directory"]),
    ("/no-such-top-level-dir-47/cache", ["would be made as a new top-level directory /no-such-top-level-dir-47"]),
])
def test_cache_variable_that_can_never_work(tmp_path: Path, where: str, names: list[str]):
    (tmp_path / "file").write_text("")
    env = {"RETSNOOP_OTEL_CACHE": where.format(tmp=tmp_path)}
    _refused(_run("trace", "-e", "*sys_bpf", env=env), *names)
    assert not Path("/no-such-top-level-dir-47").exists()


def test_cache_variable_of_a_new_directory_passes_validation(tmp_path: Path):
    proc = _run("trace", "-e", "*sys_bpf", env={"RETSNOOP_OTEL_CACHE": str(tmp_path / "new" / "cache")})
    assert proc.returncode == 1 and "kernel" in proc.stderr, proc.stderr

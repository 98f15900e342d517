"""The command line on the development host, whose kernel refuses kernel-function tracing."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import without_system_libbpf

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retsnoop_otel", *args], capture_output=True, text=True, timeout=120)


def test_features_reports_truthfully_without_traceback():
    proc = _run("features")
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr + proc.stdout
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.startswith("  ")}
    for name in ("btf", "fentry", "kprobes", "kprobe_multi", "ringbuf", "func_ip", "bpf_cookie",
                 "branch_snapshot", "lbr", "filter_functions", "kallsyms", "capabilities", "user_functions"):
        assert name in rows, name


def _host_can_trace() -> tuple[bool, bool]:
    """(fentry loads, kprobes exist), found without the features command: the ground truth for its report."""
    from pathlib import Path

    from retsnoop_otel.kernel import libbpf as lb
    from retsnoop_otel.kernel.tracer import bpf_object_path
    obj = lb.BpfObject.open_file(str(bpf_object_path()))
    try:
        for name in ("fentry_entry", "fexit_exit", "kprobe_entry", "kretprobe_exit", "kmulti_entry", "kmulti_exit",
                     "ksession"):
            obj.program(name).set_autoload(name == "fentry_entry")
        try:
            obj.load()
            fentry = True
        except lb.LibbpfError as exc:
            assert exc.errno == errno.EPERM, exc  # the refusal this host is known for
            fentry = False
    finally:
        obj.close()
    return fentry, Path("/sys/bus/event_source/devices/kprobe").exists()


def test_features_report_matches_what_the_kernel_does():
    fentry, kprobes = _host_can_trace()
    rows = {line.split()[0]: line for line in _run("features").stdout.splitlines()[1:] if line.startswith("  ")}
    assert ("yes" in rows["fentry"].split()[1]) == fentry, rows["fentry"]
    if not fentry:
        assert "refused (EPERM)" in rows["fentry"], rows["fentry"]
    assert rows["kprobes"].split()[1] == ("yes" if kprobes else "NO"), rows["kprobes"]
    if not kprobes:
        assert "not configured" in rows["kprobes"], rows["kprobes"]


def test_trace_refused_with_one_clear_sentence_when_kernel_forbids_tracing():
    fentry, kprobes = _host_can_trace()
    if fentry or kprobes:
        pytest.skip("this host can trace kernel functions: the refusal is not expected here (VM tests cover tracing)")
    proc = _run("trace", "-e", "*sys_bpf")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    msg = proc.stderr.strip()
    assert len(msg.splitlines()) == 1
    assert "fentry" in msg and "kprobes" in msg and "VM" in msg


def test_bad_flags_exit_2_with_message():
    proc = _run("trace", "--no-such-flag")
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr
    proc = _run("trace", "-e", "*sys_bpf", "-x", "EWHATEVER")
    assert proc.returncode == 2 and "unknown errno name 'EWHATEVER'" in proc.stderr
    proc = _run("trace", "-e", "*sys_bpf", "-L", "0")
    assert proc.returncode == 2 and "-L/--longer: expected a number of milliseconds above 0" in proc.stderr
    assert "got '0'" in proc.stderr
    proc = _run("trace")
    assert proc.returncode == 2 and "entry glob" in proc.stderr


def test_version():
    proc = _run("-V")
    assert proc.returncode == 0 and proc.stdout.startswith("retsnoop-otel v")
    assert "libbpf 1.7 (built with the package)" in proc.stdout  # our own loader, not the host's 1.1
    assert len(proc.stdout.splitlines()) == 1
    proc = _run("-Vv")  # version, then what the running kernel allows
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[0].startswith("retsnoop-otel v")
    assert any(line.split()[:1] == ["fentry"] for line in lines[1:]), proc.stdout


def test_lbr_refused_before_loading_when_the_cpu_has_none():
    if " lbr               yes" in _run("features").stdout:
        return  # a host with LBR: this refusal does not apply
    proc = _run("trace", "-e", "*sys_bpf", "--lbr")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("retsnoop-otel: --lbr needs last branch records"), lines
    assert "run without --lbr" in lines[0]
    proc = _run("trace", "-e", "*sys_bpf", "-B", "ind_jump", "--lbr-max-count", "0")
    assert proc.returncode == 2 and "--lbr-max-count needs --lbr and a positive count" in proc.stderr


def _our_programs() -> list[str]:
    """Names of loaded BPF programs that are ours (bpftool), to show a refused run leaves none."""
    import json
    out = subprocess.run(["bpftool", "-j", "prog", "list"], capture_output=True, text=True, timeout=60).stdout
    from retsnoop_otel.kernel.tracer import PROGRAM_NAMES
    return [p.get("name", "") for p in json.loads(out or "[]") if p.get("name") in PROGRAM_NAMES]


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
TRACE = ["trace", "-e", "*sys_bpf", "-a", "array_map_alloc_check"]
# case -> (argv, extra environment, exit code, what the one line must say). Each input is checked before
# the kernel is asked for anything, so this host (which cannot trace) gives the input's own message.
BAD_INPUT = {
    "endpoint_scheme": ([*TRACE, "--otlp-endpoint", "ftp://collector:4317"], {}, 2, "--otlp-endpoint"),
    "endpoint_grpc_path": ([*TRACE, "--otlp-endpoint", "http://c:4317/v1/traces", "--otlp-protocol", "grpc"], {}, 2,
                           "--otlp-protocol=http/protobuf"),
    # host:port is gRPC's form; OTLP/HTTP, the default protocol, needs a URL
    "endpoint_scheme_less": ([*TRACE, "--otlp-endpoint", "collector:4317"], {}, 2,
                             "write it like http://collector:4318, or set --otlp-protocol=grpc"),
    # a flag still refuses what a variable would only be warned about for
    "endpoint_flag_beside_variables": ([*TRACE, "--otlp-endpoint", "collector:4318"],
                                       {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
                                       2, "--otlp-endpoint='collector:4318': not an http:// or https:// URL"),
    "metrics_port_busy": ([*TRACE, "--metrics-addr", "127.0.0.1", "--metrics-port", "{busy}"], {}, 1,
                          "already in use"),
    "trace_json_unwritable": ([*TRACE, "-T", "--trace-json", "/proc/version/t.json"], {}, 2,
                              "--trace-json /proc/version"),
    "vmlinux_missing": ([*TRACE, "-k", "/no/such/vmlinux"], {}, 2, "-k /no/such/vmlinux: no such file"),
    "glob": (["trace", "-e", "*sys_bpf", "-a", "array_map_* [bpf"], {}, 2, "bad glob 'array_map_* [bpf'"),
    # an empty -e is a bad glob like any other, not a missing -e (a list key's check sees the flag's one item)
    "empty_glob": (["trace", "-e", ""], {}, 2, "bad glob ''"),
    "cgroup": ([*TRACE, "--cgroup", "/sys/fs/cgroup/no/such/group"], {}, 2, "--cgroup /sys/fs/cgroup/no/such/group"),
    "agent_config": (["agent", "--config", "{bad_config}"], {}, 2, "agent.yaml:3: probe_sets[0].entry"),
    "agent_check": (["agent", "--check", "{bad_config}"], {}, 2, "agent.yaml:3: probe_sets[0].entry"),
    # the web config file (TLS and basic auth of /metrics): read and its certificates loaded before anything else
    "web_config_missing": ([*TRACE, "--metrics-port", "9464", "--web.config.file", "/no/such/web.yml"], {}, 2,
                           "--web.config.file: /no/such/web.yml: cannot read the web config file: No such file"),
    "web_config_key_mismatch": ([*TRACE, "--metrics-port", "9464", "--web.config.file", "{web_mismatch}"], {}, 2,
                                "web-mismatch.yml:3: tls_server_config.key_file: "),
    "web_config_unknown_key": ([*TRACE, "--metrics-port", "9464", "--web.config.file={web_typo}"], {}, 2,
                               "web-typo.yml:1: basic_auth_user: unknown key; did you mean 'basic_auth_users'?"),
    "web_config_without_port": ([*TRACE, "--web.config.file", "{web_typo}"], {}, 2,
                                "--web.config.file secures the metrics port: give --web.listen-address (or "
                                "--metrics-port) too"),
    "agent_web_config": (["agent", "--config", "{agent_web}"], {}, 2,
                         "metrics.web_config_file: {web_hash}:2: basic_auth_users.alice: the value for user "
                         "'alice' is a string that is not a bcrypt hash"),
    "agent_check_web_config": (["agent", "--check", "{agent_web}"], {}, 2,
                               "metrics.web_config_file: {web_hash}:2: basic_auth_users.alice: the value for "
                               "user 'alice' is a string that is not a bcrypt hash"),
}


def _web_files(d: Path) -> dict[str, Path]:
    """Bad web config files: a key of another certificate, a typo, a password where its hash belongs."""
    from tests.tls_certs import leaf
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=ca"], cwd=d, check=True,
                   capture_output=True)
    leaf(d, "server", "ca", "DNS:localhost")
    leaf(d, "other", "ca", "DNS:localhost")
    files = {"web_mismatch": "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n",
             "web_typo": "basic_auth_user:\n  alice: x\n", "web_hash": "basic_auth_users:\n  alice: secret\n"}
    out = {}
    for name, text in files.items():
        out[name] = d / f"{name.replace('_', '-')}.yml"
        out[name].write_text(text)
    out["agent_web"] = d / "agent-web.yaml"
    out["agent_web"].write_text("probe_sets:\n  - name: x\n    entry: ['*sys_bpf']\n    mode: metrics\n"
                                f"metrics:\n  listen: '127.0.0.1:9464'\n  web_config_file: {out['web_hash']}\n"
                                "logging:\n  format: text\n")
    return out


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_and_nothing_is_loaded(case: str, tmp_path) -> None:
    import os
    import socket
    argv, env, code, phrase = BAD_INPUT[case]
    bad_config = tmp_path / "agent.yaml"
    bad_config.write_text("probe_sets:\n  - name: x\n    entry: 5\n")
    web = _web_files(tmp_path) if "web" in case else {}
    phrase = phrase.format(**web)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        argv = [a.format(busy=busy.getsockname()[1], bad_config=bad_config, **web) for a in argv]
        before = _our_programs()
        proc = subprocess.run([sys.executable, "-m", "retsnoop_otel", *argv], capture_output=True, text=True,
                              timeout=120, env={**os.environ, **env})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and phrase in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and "Receiving data" not in proc.stdout
    assert _our_programs() == before == []


# an OTEL_* variable the run cannot use -> (its environment, how its one warning starts)
WARNED = {
    "endpoint_scheme_less": ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
                             "OTEL_EXPORTER_OTLP_ENDPOINT='collector:4317': not an http:// or https:// URL"),
    "timeout": ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
                "OTEL_EXPORTER_OTLP_TIMEOUT='soon': not a positive number"),
    "sdk_disabled": ({"OTEL_SDK_DISABLED": "maybe"}, "OTEL_SDK_DISABLED='maybe': not a boolean"),
}


@pytest.mark.parametrize("case", sorted(WARNED))
def test_a_bad_variable_is_one_warning_and_the_run_goes_on(case: str) -> None:
    """Not the tool's own input: one warning line naming the variable, then the run goes on, here to this host's
    refusal of kernel tracing (a bad flag would have ended it with exit 2 before)."""
    import os
    fentry, kprobes = _host_can_trace()
    if fentry or kprobes:
        pytest.skip("this host can trace kernel functions: the run would not end at the refusal")
    env, phrase = WARNED[case]
    before = _our_programs()
    proc = subprocess.run([sys.executable, "-m", "retsnoop_otel", *TRACE], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"retsnoop-otel: warning: {phrase}") and lines[0].endswith("; ignored, as if unset")
    assert "fentry" in lines[1] and "kprobes" in lines[1], lines[1]
    assert _our_programs() == before == []


def test_privileged_metrics_port_as_an_unprivileged_user() -> None:
    """Binding is checked before privileges and before the kernel: the port's own message comes first."""
    import os
    proc = subprocess.run([*NOBODY, sys.executable, "-m", "retsnoop_otel", *TRACE, "--metrics-port", "80"],
                          capture_output=True, text=True, timeout=120, cwd="/", env={**os.environ,
                                                                                    "PYTHONPATH": str(REPO)})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "permission denied" in lines[0] and "--metrics-port" in lines[0], lines[0]


def test_features_and_version_where_the_host_has_no_usable_libbpf():
    """The package brings its own loader: with the host's libbpf.so files emptied, `features` and `-V` work the same
    and name libbpf 1.7 (Debian 12's own is 1.1, Ubuntu 22.04's 0.5)."""
    for args, want in ((["features", "--json"], '"libbpf_version": "1.7"'),
                       (["-V"], "libbpf 1.7 (built with the package)")):
        proc = subprocess.run(without_system_libbpf([sys.executable, "-m", "retsnoop_otel", *args]),
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        assert "HOST-LIBBPF-LOADS" not in proc.stdout  # the host's library is really gone for the command
        assert want in proc.stdout and "Traceback" not in proc.stderr


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`retsnoop-otel features | head -1`: the pipe closes under our output, which is the reader's choice."""
    proc = subprocess.Popen([sys.executable, "-m", "retsnoop_otel", "features"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # before the report is written (its probes take longer): every write meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err


def test_without_privileges_every_probe_says_denied_not_missing() -> None:
    """In a user namespace (what an unprivileged container gets) BPF is refused with EPERM: the report must say so,
    not that the kernel lacks ring buffers or helpers, and the verdict must name the capabilities."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is missing")
    proc = subprocess.run(["unshare", "--user", sys.executable, "-m", "retsnoop_otel", "features", "--json"],
                          capture_output=True, text=True, timeout=120)
    feats = json.loads(proc.stdout)["features"]
    for name in ("ringbuf", "func_ip", "bpf_cookie", "branch_snapshot"):
        assert not feats[name]["available"] and feats[name]["errno"] == errno.EPERM, (name, feats[name])
        assert "denies BPF to this process" in feats[name]["detail"], feats[name]
    lines = subprocess.run(["unshare", "--user", sys.executable, "-m", "retsnoop_otel", "features"],
                           capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert lines[-2].startswith("User-space functions (u:BINARY:GLOB): not possible: this kernel denies BPF to this "
                                "process"), lines[-2]
    assert feats["user_functions"]["errno"] == errno.EPERM, feats["user_functions"]
    text = lines[-1]
    assert text == ("Tracing: not possible: this process needs CAP_BPF and CAP_PERFMON (or root) to trace: run it as "
                    "root, or in a container add those capabilities (--cap-add BPF --cap-add PERFMON; see the "
                    "Dockerfile)"), text

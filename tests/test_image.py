"""The container image, built from the Dockerfile with podman and run: what a user pulling it gets.

Built once per run from a base image made of Debian packages (tests/container_image.py: no registry is reachable
here). Inside it: the version and our libbpf, the feature report, `agent --check` of the shipped config, the health
check command of the HEALTHCHECK, kill for the reload, no compiler, the licenses, a .pyc for every module that needs
no look at its source, and the OCI labels; its size is printed at the end of the run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import container_image as ci

pytestmark = pytest.mark.artifacts


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> dict[str, str]:
    if missing := ci.missing_tools():
        pytest.fail(f"{', '.join(missing)} missing: `make setup` installs podman, mmdebstrap and runc")
    env = ci.podman_env(tmp_path_factory.mktemp("podman"))
    ci.ensure_base(env)
    ci.build(env)
    size = int(ci.podman(env, "image", "inspect", ci.IMAGE, "--format", "{{.Size}}").stdout)
    base = int(ci.podman(env, "image", "inspect", ci.BASE, "--format", "{{.Size}}").stdout)
    ci.summarize(pytestconfig, f"image {ci.IMAGE}: {size / 1e6:.0f} MB, of which {(size - base) / 1e6:.0f} MB "
                 f"over its Debian base ({base / 1e6:.0f} MB, mmdebstrap minbase)")
    return env


def test_version_names_our_libbpf(image: dict[str, str]) -> None:
    res = ci.run(image, "--version", entrypoint="retsnoop-otel")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("libbpf 1.7 (built with the package)"), res.stdout


def test_features_report_without_privileges_names_them(image: dict[str, str]) -> None:
    """A container without the capabilities: every entry answers, and the verdict says what to add."""
    res = ci.run(image, "features", "--json", entrypoint="retsnoop-otel")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["libbpf_version"] == "1.7"
    assert report["features"]["btf"]["available"]  # the host's /sys/kernel/btf is visible in the container
    assert not report["features"]["ringbuf"]["available"] and report["features"]["ringbuf"]["errno"] == 1  # EPERM
    text = ci.run(image, "features", entrypoint="retsnoop-otel").stdout.splitlines()[-1]
    assert "--cap-add BPF --cap-add PERFMON" in text, text


def test_agent_check_of_the_shipped_config(image: dict[str, str]) -> None:
    """The shipped config passes every check but the kernel's, in the image as on any host that cannot trace: stdout
    names the kernel checks skipped and why (this host forbids tracing), exit 0; a file that is no config is bad
    input (exit 2)."""
    res = ci.run(image, "--check", "/etc/retsnoop-otel/agent.yaml",
                 options=("--privileged", "-v", "/sys/kernel/tracing:/sys/kernel/tracing:ro"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "kernel checks skipped (" in res.stdout and "cannot be traced here" in res.stdout, res.stdout
    assert res.stdout.rstrip().endswith("configuration is valid (2 probe sets; kernel checks skipped)"), res.stdout
    bad = ci.run(image, "--check", "/etc/hostname")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr


def test_health_check_command_follows_the_config(image: dict[str, str]) -> None:
    inspect = json.loads(ci.podman(image, "image", "inspect", ci.IMAGE).stdout)[0]
    health = inspect.get("Healthcheck") or inspect["Config"].get("Healthcheck")
    assert health["Test"] == ["CMD", "/opt/retsnoop-otel/bin/retsnoop-otel", "agent", "--health", "--config",
                              "/etc/retsnoop-otel/agent.yaml"], health
    res = ci.run(image, *health["Test"][2:], entrypoint=health["Test"][1])  # no agent runs here: unhealthy
    assert res.returncode == 1, res.stderr
    assert ("http://127.0.0.1:9464/healthz: connection refused (the agent is not running, or still attaching its "
            "probes)") in res.stderr, res.stderr


# the modules of the virtualenv without a .pyc that the import may use without reading the source (unchecked hash,
# flags 1): the runtime writes no bytecode, so each of them would be compiled at every start (Dockerfile)
UNCOMPILED = ("python3 -c 'import importlib.util as u, pathlib as p, sys; "
              "c = lambda f: p.Path(u.cache_from_source(f)); "
              'print("UNCOMPILED", *sorted(str(f) for f in p.Path(sys.prefix, "lib").rglob("*.py") '
              "if not c(str(f)).is_file() or c(str(f)).read_bytes()[4:8] != bytes([1, 0, 0, 0])), \"END\")'")


def test_runtime_holds_no_compiler_but_kill_and_the_licenses(image: dict[str, str]) -> None:
    res = ci.run(image, "-c", "which gcc cc clang ld make kill; "
                 "ls /usr/share/doc/retsnoop-otel /opt/retsnoop-otel/lib/python3*/site-packages/retsnoop_otel/bpf; "
                 + UNCOMPILED, entrypoint="sh")
    lines = res.stdout.split()
    assert "UNCOMPILED" in lines and lines[lines.index("UNCOMPILED") + 1:lines.index("END")] == [], res.stdout
    assert "/bin/kill" in lines or "/usr/bin/kill" in lines, res.stdout  # `kubectl exec ... -- kill -HUP 1`
    assert not [x for x in lines if x.rsplit("/", 1)[-1] in ("gcc", "cc", "clang", "ld", "make")], res.stdout
    shipped = {"LICENSE", "LICENSE.bpf", "LICENSE.libbpf", "LICENSE.libelf", "libbpf.so.1", "retsnoop.bpf.o"}
    assert shipped <= set(lines), lines


def test_oci_labels(image: dict[str, str]) -> None:
    labels = json.loads(ci.podman(image, "image", "inspect", ci.IMAGE, "--format", "{{json .Labels}}").stdout)
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.source"] == "file://" + str(Path(ci.REPO))
    assert labels["org.opencontainers.image.licenses"].startswith("BSD-2-Clause AND GPL-2.0-only")


AGENT_OF_LIBC = """
probe_sets:
  - name: libc
    entry: ["u:/usr/lib/x86_64-linux-gnu/libc.so.6:getpid"]
    filters:
      comms: [python]          # the test's calls, not the agent's own
    sampling:
      success_probability: 1.0
exporter:
  otlp: {}                     # as the shipped config: no endpoint, the environment names it
metrics:
  listen: "127.0.0.1:0"
"""
# the agent in the background, the calls once it is attached, then SIGTERM (it flushes its spans at exit)
IN_CONTAINER = ("retsnoop-otel agent --config /cfg/agent.yaml 2>/tmp/agent.log & agent=$!; "
                "for i in $(seq 600); do grep -q 'agent started' /tmp/agent.log && break; "
                "kill -0 $agent 2>/dev/null || break; sleep 0.5; done; "
                "python -c 'import os; [os.getpid() for _ in range(3)]'; "
                "kill -TERM $agent; wait $agent; echo agent exited $?; cat /tmp/agent.log")


def test_the_environment_alone_names_the_collector(image: dict[str, str], tmp_path: Path) -> None:
    """Issue 43: `-e OTEL_EXPORTER_OTLP_ENDPOINT` is all a container needs to send its spans to a collector (here a
    real Jaeger on the host): no config names one. Traced here with uprobes on libc's getpid (this host allows
    them; kernel functions it does not)."""
    from tests.peers.jaeger import Jaeger, spans_of
    jaeger = Jaeger(decision_wait="1s", sample_percent=100)
    try:
        (tmp_path / "agent.yaml").write_text(AGENT_OF_LIBC)
        res = ci.run(image, "-c", IN_CONTAINER, entrypoint="sh",
                     options=("--privileged", "--network", "host", "-v", f"{tmp_path}:/cfg:ro",
                              "-e", f"OTEL_EXPORTER_OTLP_ENDPOINT={jaeger.otlp_http}"))
        assert "agent exited 0" in res.stdout, res.stdout + res.stderr
        services = jaeger.wait_services(60)
        assert len(services) == 1 and services[0].startswith("python"), (services, res.stdout)
        spans = [s for t in jaeger.find(services[0]) for s in spans_of(t)]
        assert len(spans) >= 3 and {s.name for s in spans} == {"getpid"}, spans
        assert all(s.tags["retsnoop.binary"] == "/usr/lib/x86_64-linux-gnu/libc.so.6" for s in spans)
    finally:
        jaeger.stop()

"""No input file is read twice in one start (issue 44): the TLS files as well as the globs, the injected probes and
the configs, for an agent start and a trace start run over the fakes of tests/fakes.py with the real OTLP senders.

The opens are counted by the kernel (inotify IN_OPEN on each input file), not by wrapping Python's open(): a
certificate handed to OpenSSL by its path (SSLContext.load_cert_chain, create_default_context(cafile=...)) or to
grpc is opened in C, where a wrapper would not see it. tests/unit/test_inputs_read_once.py checks the globs and
probe files of a reload too, through Python's opens.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import socket
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from retsnoop_otel.agent.main import Agent
from retsnoop_otel.command.logs import EventLog
from retsnoop_otel.export.senders import build_sender
from retsnoop_otel.kernel import inject_attach, tracefs
from retsnoop_otel.runtime.requests import Requests
from retsnoop_otel.trace.main import run_trace
from tests.fakes import PASSWORD_HASH, World
from tests.tls_certs import Pki, make_pki

FORMAT = Path(__file__).resolve().parents[1] / "fixtures" / "tracefs" / "events/syscalls/sys_exit_bpf/format"
IN_OPEN, IN_CLOSE = 0x20, 0x08 | 0x10  # IN_CLOSE_WRITE | IN_CLOSE_NOWRITE
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)


@contextmanager
def counting_opens(paths: list[Path]) -> Iterator[Counter[str]]:
    """Counts the opens of each of `paths` (by name) while the block runs, whoever opens them: Python or C. The
    closes are watched too: the kernel merges an event into the one before it when both are the same and unread,
    so open, close, open of one file would otherwise read as one open."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        pytest.skip(f"inotify: {os.strerror(ctypes.get_errno())}")
    opens: Counter[str] = Counter()
    try:
        names = {}
        for path in paths:
            wd = libc.inotify_add_watch(fd, os.fsencode(path), IN_OPEN | IN_CLOSE)
            assert wd >= 0, f"inotify_add_watch {path}: {os.strerror(ctypes.get_errno())}"
            names[wd] = path.name
        yield opens
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size + size
                if mask & IN_OPEN and wd in names:
                    opens[names[wd]] += 1
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def inputs(tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Glob files, a probe file, the certificates and a tracefs (for the injected tracepoint) under tmp_path."""
    for name, text in {"entry": "*sys_bpf\n", "allow": "array_map_alloc_check\nbpf_check\n", "deny": "vfs_read\n",
                       "comms": "bash\n", "probes": "tp:syscalls:sys_exit_bpf\nkprobe:bpf_check\n"}.items():
        (tmp_path / name).write_text(text)
    for path in (pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n"
        f"  client_auth_type: VerifyClientCertIfGiven\nbasic_auth_users:\n  alice: '{PASSWORD_HASH}'\n")
    events = tmp_path / "tracefs" / "events" / "syscalls" / "sys_exit_bpf"
    events.mkdir(parents=True)
    shutil.copy(FORMAT, events / "format")
    monkeypatch.setattr(tracefs, "find_tracefs", lambda _root="/": tmp_path / "tracefs")
    monkeypatch.setattr(inject_attach, "check_kernel", lambda _specs: None)
    return tmp_path


TLS = ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")


def watched(d: Path, *names: str) -> list[Path]:
    return [d / n for n in names] + [d / "tracefs/events/syscalls/sys_exit_bpf/format"]


def test_an_agent_start_reads_each_file_once_tls_files_too(inputs: Path) -> None:
    """Both OTLP exporters (gRPC traces, HTTP metrics) and the web config name ca.crt; the exporters share the
    client key pair: each file is opened once, and the senders and the server are built from those reads."""
    d = inputs
    otlp = f"certificate: {d}/ca.crt, client_certificate: {d}/client.crt, client_key: {d}/client.key"
    (d / "agent.yaml").write_text(f"""\
probe_sets:
  - name: bpf_errors
    entry: ['@{d}/entry']
    allow: ['@{d}/allow']
    deny: ['@{d}/deny']
    inject: ['@{d}/probes']
exporter:
  otlp: {{endpoint: "https://127.0.0.1:4317", protocol: grpc, {otlp}}}
metrics:
  listen: "127.0.0.1:0"
  web_config_file: {d}/web.yml
  otlp: {{endpoint: "https://127.0.0.1:4318", protocol: http/protobuf, {otlp}}}
""")
    world = World()
    deps = world.deps()
    built: list[str] = []
    deps.make_sender = lambda settings: built.append(settings.protocol) or build_sender(settings)
    with counting_opens(watched(d, "agent.yaml", "entry", "allow", "deny", "probes", "web.yml", *TLS)) as opens:
        agent = Agent(str(d / "agent.yaml"), deps, EventLog(io.StringIO()))
        try:
            agent.start()
            assert agent.runtime is not None and agent.runtime.server.scheme == "https"  # type: ignore[union-attr]
        finally:
            if agent.runtime is not None:
                agent.runtime.shutdown(0.5)
    assert sorted(built) == ["grpc", "http/protobuf"]  # the real senders were built (and loaded the certificates)
    assert opens == {n: 1 for n in ("agent.yaml", "entry", "allow", "deny", "probes", "web.yml", *TLS,
                                    "format")}


def test_a_trace_start_reads_each_file_once_tls_files_too(inputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trace with @file globs, -J, its web config (TLS, basic auth) and the OTLP certificates of the environment."""
    d = inputs
    monkeypatch.setattr(Requests, "install", lambda self, reload: setattr(self, "stop", True) or self)
    world, out, err = World(), io.StringIO(), io.StringIO()
    deps = world.deps(out)
    deps.environ = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(d / "ca.crt"),
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(d / "client.crt"),
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(d / "client.key")}
    built: list[str] = []
    deps.make_sender = lambda settings: built.append(settings.protocol) or build_sender(settings)
    with socket.socket() as s:  # a free port: --metrics-port takes no 0
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["-e", f"@{d}/entry", "-a", f"@{d}/allow", "-d", f"@{d}/deny", "-n", f"@{d}/comms", "-J", f"@{d}/probes",
            "--otlp-endpoint", "https://127.0.0.1:4318", "--otlp-protocol", "http/protobuf",
            "--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--web.config.file", str(d / "web.yml")]
    with counting_opens(watched(d, "entry", "allow", "deny", "comms", "probes", "web.yml", *TLS)) as opens:
        assert run_trace(argv, out, err, deps) == 0, err.getvalue()
    assert built == ["http/protobuf"]
    assert opens == {n: 1 for n in ("entry", "allow", "deny", "comms", "probes", "web.yml", *TLS, "format")}


def test_the_count_sees_opens_by_openssl(inputs: Path) -> None:
    """The counting itself: OpenSSL opening a certificate by its path is seen, so a second read through
    load_cert_chain or cafile= fails the tests above."""
    import ssl
    d = inputs
    with counting_opens(watched(d, "server.crt", "server.key", "ca.crt")) as opens:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(d / "server.crt", d / "server.key")
        ssl.create_default_context(cafile=d / "ca.crt")
        (d / "ca.crt").read_bytes()
    assert opens == {"server.crt": 1, "server.key": 1, "ca.crt": 2}


def test_the_cluster_ca_is_read_once_for_every_connection_of_the_pod_watch(tmp_path: Path, pki: Pki) -> None:
    """The CA is checked at the start and its bytes verify each (re)connection of the watch, as client-go does: the
    file is not opened again per connection."""
    from retsnoop_otel.workload import k8s_watch
    from retsnoop_otel.workload.k8s_settings import KubernetesConfig, resolve_kubernetes
    token = tmp_path / "token"
    token.write_text("t")
    cfg = KubernetesConfig(True, "node-a", "https://127.0.0.1:6443", str(token), str(pki.ca))
    with counting_opens([pki.ca]) as opens:
        settings = resolve_kubernetes(cfg, {})
        for _ in range(3):
            k8s_watch._connection(settings).close()
    assert opens[pki.ca.name] == 1

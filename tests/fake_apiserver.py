"""A Kubernetes API server stand-in for the pod watch: recorded pod list and watch responses over real HTTP(S).

Serves `GET /api/v1/pods` (the node-scoped list and, with `watch=true`, the watch) from queues of
responses the test sets: each request takes the next one of its kind; when a kind's queue is empty, lists
repeat the last answer and watches stay open without events until the client's timeoutSeconds ends them,
as the real server does. A watch response is chunked, one JSON event per line. Every request must carry
`Authorization: Bearer <token>` with a token in `tokens` (401 otherwise), so rotation can be tested.
`stop()` closes the listening socket and every open connection: a server that goes away.

As a program (the VM scenario): `python -m tests.fake_apiserver --port 0 --list FILE [--watch FILE]
--token-file FILE [--cert PEM --key PEM]` prints `READY <port>`, then `REQUEST <list|watch> <resourceVersion>`
per request; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s"


@dataclass
class Answer:
    """One response: a status and a JSON body (list, Status), or watch events (one line each)."""

    status: int = 200
    body: Any = None
    events: list[str] | None = None  # a watch: these lines, then the stream ends (hold=False) or stays open
    hold: bool = False


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def fixture_events(name: str) -> list[str]:
    return [line for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


@dataclass
class FakeApiServer:
    tokens: set[str]
    lists: deque[Answer] = field(default_factory=deque)
    watches: deque[Answer] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)  # method, path, query, authorization, kind
    lock: threading.Condition = field(default_factory=threading.Condition)
    port: int = 0
    _last_list: Answer | None = None
    _server: Any = None
    _conns: set[Any] = field(default_factory=set)
    _stopping: bool = False
    on_request: Callable[[dict[str, Any]], None] | None = None

    def start(self, port: int = 0, cert: str | None = None, key: str | None = None) -> FakeApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = _Server(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        if cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (held watches included)."""
        self._stopping = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self.lock:
            conns, self._conns = list(self._conns), set()
            self.lock.notify_all()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait_requests(self, n: int, timeout: float = 20.0, kind: str | None = None) -> list[dict[str, Any]]:
        """Block until `n` requests (of `kind`: list | watch) arrived; returns them."""
        def mine() -> list[dict[str, Any]]:
            return [r for r in self.requests if kind is None or r["kind"] == kind]
        with self.lock:
            self.lock.wait_for(lambda: len(mine()) >= n, timeout)
            return mine()

    def next_answer(self, kind: str) -> Answer:
        with self.lock:
            if kind == "list":
                if self.lists:
                    self._last_list = self.lists.popleft()
                return self._last_list or Answer(500, {"kind": "Status", "code": 500})
            return self.watches.popleft() if self.watches else Answer(events=[], hold=True)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that hang up (the watch being closed, a TLS check failing) are part of the tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        api = self.api
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        kind = "watch" if query.get("watch", "").lower() in ("true", "1", "t") else "list"  # Go's ParseBool
        auth = self.headers.get("Authorization", "")
        with api.lock:
            api._conns.add(self.connection)
            api.requests.append({"method": "GET", "path": url.path, "query": query, "authorization": auth,
                                 "kind": kind, "time": time.monotonic()})
            api.lock.notify_all()
        if api.on_request is not None:
            api.on_request(api.requests[-1])
        try:
            if url.path != "/api/v1/pods":
                return self._json(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            if auth.removeprefix("Bearer ") not in api.tokens:
                return self._json(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
            answer = api.next_answer(kind)
            if answer.events is None:
                return self._json(answer.status, answer.body)
            self._stream(answer, float(query.get("timeoutSeconds", "300")))
        finally:
            with api.lock:
                api._conns.discard(self.connection)

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, answer: Answer, timeout_s: float) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for line in answer.events or []:
            self._chunk((line.strip() + "\n").encode())
        if answer.hold:
            deadline = time.monotonic() + timeout_s
            with self.api.lock:
                self.api.lock.wait_for(lambda: self.api._stopping or time.monotonic() >= deadline,
                                       max(0.0, deadline - time.monotonic()))
            if self.api._stopping:
                return  # cut: no last chunk
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def make_test_ca(directory: Path) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 and localhost, made with the openssl command line."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=120)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test cluster CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (directory / "server.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                          "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kube-apiserver")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return {name: str(directory / name) for name in ("ca.pem", "server.pem", "server.key")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_apiserver")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--list", required=True, help="PodList JSON served to every list request")
    p.add_argument("--watch", help="watch events (JSON lines) served to the first watch; later ones stay open")
    p.add_argument("--token-file", required=True, help="the bearer token clients must send")
    p.add_argument("--cert")
    p.add_argument("--key")
    args = p.parse_args(argv)
    api = FakeApiServer({Path(args.token_file).read_text().strip()})
    api.lists.append(Answer(body=json.loads(Path(args.list).read_text())))
    if args.watch:
        api.watches.append(Answer(events=[x for x in Path(args.watch).read_text().splitlines() if x.strip()],
                                  hold=True))
    api.on_request = lambda r: print(f"REQUEST {r['kind']} {r['query'].get('resourceVersion', '-')}", flush=True)
    api.start(args.port, args.cert, args.key)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"READY {api.port}", flush=True)
    done.wait()
    api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

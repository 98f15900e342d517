"""One node-scoped list+watch of pods (fieldSelector spec.nodeName=<node>), on a thread of its own.

Two GETs of /api/v1/pods over the standard library's http.client and ssl (TLS verified against the
cluster CA, `Authorization: Bearer <token>`), with the query the kubernetes client library wrote for
CoreV1Api.list_pod_for_all_namespaces; responses are parsed as plain JSON, and the watch's chunked body
is read line by line as it arrives. A client library would add ~150 MB to the image and seconds to start.

The protocol, as the API server defines it: list (resourceVersion of the list), then watch from that
version; ADDED/MODIFIED/DELETED move the cache and the version, BOOKMARK moves the version only; a
watch the server ends is resumed from the last version; `410 Gone` (the version is too old) lists
again. The first list asks for `resourceVersion=0` ("any version"), which the API server answers from its
watch cache instead of a quorum read of etcd, as client-go's reflector does: a DaemonSet's agents all
starting at once then cost the API server memory reads, not one etcd range read each. The list after a 410
leaves resourceVersion out (the most recent state, read from etcd): a cached list could be older than what
the watch had already delivered, and be too old to watch from again. The token is re-read from its file
before every request (bound service-account tokens rotate).
When the API server cannot be reached or refuses (RBAC), the pods known so far stay, sessions keep
container.id and k8s.pod.uid, one warning goes to the log (and one line when it works again), and the
watch retries with a back-off doubling from 1 s to 60 s. Self-metrics: `retsnoop_k8s_metadata_current`
and `retsnoop_k8s_watch_errors_total{reason}` (metrics/runtime_families.py).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from retsnoop_otel.inputs.tls_files import load_ca_data
from retsnoop_otel.workload.k8s_settings import KubeSettings
from retsnoop_otel.workload.pods import PodCache, pod_meta

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
CONNECT_TIMEOUT_S = 10.0
LIST_READ_TIMEOUT_S = 60.0
EXPIRE_EVERY_S = 30.0
MIN_WATCH_INTERVAL_S = 1.0  # a server that ends watches at once is not asked again in a tight loop
USER_AGENT = "retsnoop-otel"  # what the API server's audit log and priority-and-fairness see


class Log(Protocol):
    def warning(self, msg: str, **fields: Any) -> None: ...

    def info(self, msg: str, **fields: Any) -> None: ...


@dataclass(frozen=True)
class WatchCounters:
    """A snapshot for the self-metrics."""

    current: bool = False  # the last list or watch (re)connection succeeded and no error came since
    errors: dict[str, int] = field(default_factory=dict)  # reason -> count
    lists: int = 0
    events: int = 0
    pods: int = 0


class _Gone(Exception):
    """The watch's resourceVersion is older than the server keeps: list again."""


class _BadResponse(Exception):
    pass


class _NoToken(Exception):
    """The token file cannot be read (the projected volume is being rewritten, or was unmounted)."""


class HttpError(Exception):
    """The API server answered with a status other than 2xx: the status says which failure it is."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status
        self.reason = reason


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, _Gone):
        return "gone"
    if isinstance(exc, _NoToken):
        return "unauthorized"
    if isinstance(exc, HttpError):
        return {401: "unauthorized", 403: "forbidden", 410: "gone"}.get(exc.status, "server_error")
    if isinstance(exc, OSError | http.client.HTTPException):  # before ValueError: a failed TLS check is both
        return "unreachable"
    if isinstance(exc, _BadResponse | ValueError):
        return "invalid_response"
    return "unreachable"


class PodWatch:
    def __init__(self, settings: KubeSettings, cache: PodCache, log: Log,
                 monotonic: Callable[[], float] = time.monotonic, backoff_first_s: float = BACKOFF_FIRST_S,
                 backoff_max_s: float = BACKOFF_MAX_S) -> None:
        self.settings = settings
        self.cache = cache
        self.log = log
        self._now = monotonic
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self.resource_version: str | None = None
        self._consistent_list = False  # after a 410: the next list is read from etcd, not from the watch cache
        self._current = False
        self._failing = False
        self._errors: dict[str, int] = {}
        self._lists = 0
        self._events = 0
        self._stop = threading.Event()
        self._sock: socket.socket | None = None  # the open request's, for close() to cut
        self._thread: threading.Thread | None = None
        self._next_expire = 0.0

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PodWatch:
        self._thread = threading.Thread(target=self._run, name="k8s-pod-watch", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:  # wakes the thread out of a blocking read
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by the thread: closing is best effort, the thread is a daemon
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def counters(self) -> WatchCounters:
        return WatchCounters(self._current, dict(self._errors), self._lists, self._events, len(self.cache))

    # ---- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self.backoff_first_s
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                started = self._now()
                self._watch()
                backoff = self.backoff_first_s
                self._stop.wait(max(0.0, started + MIN_WATCH_INTERVAL_S - self._now()))
            except Exception as exc:  # noqa: BLE001 - every failure degrades the same way, and is retried
                if self._stop.is_set():
                    return
                self._failed(exc)
                if isinstance(exc, _Gone):
                    continue  # list again at once: that is the protocol, not a fault of the server
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)

    def _failed(self, exc: BaseException) -> None:
        reason = reason_of(exc)
        self._errors[reason] = self._errors.get(reason, 0) + 1
        if reason == "gone":
            self.resource_version = None
            self._consistent_list = True
            return
        self._current = False
        if not self._failing:
            self._failing = True
            self.log.warning("pod metadata unavailable: spans keep container.id and k8s.pod.uid but not pod, "
                             "namespace and container names until the API server answers (retried with back-off; "
                             "errors counted in retsnoop_k8s_watch_errors_total)", reason=reason,
                             error=_short(exc), api_server=self.settings.api_server)

    def _ok(self) -> None:
        """Connected: the metadata is current again."""
        self._current = True

    def _recovered(self) -> None:
        """The watch delivered (an event, or a normal end): only then is an outage over, so that a server
        that answers but then fails every time is one warning, not one per retry."""
        if self._failing:
            self._failing = False
            self.log.info("pod metadata watch running again", pods=len(self.cache))

    def _token(self) -> str:
        """Read before every request: kubelet rewrites a bound token before it expires."""
        try:
            with open(self.settings.token_file) as f:
                return f.read().strip()
        except OSError as exc:
            raise _NoToken(f"{self.settings.token_file}: {exc.strerror}") from None

    def _selector(self) -> str:
        return f"spec.nodeName={self.settings.node_name}"

    @contextmanager
    def _get(self, query: dict[str, str], read_timeout_s: float) -> Iterator[http.client.HTTPResponse]:
        """GET /api/v1/pods on a connection of its own, closed on leaving; raises HttpError unless 2xx."""
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json", "User-Agent": USER_AGENT}
        conn = _connection(self.settings)
        try:
            conn.connect()  # TCP and TLS handshakes under CONNECT_TIMEOUT_S, then reads under their own timeout
            conn.sock.settimeout(read_timeout_s)
            self._sock = conn.sock
            if self._stop.is_set():  # close() came during the connect, before it could see this socket
                raise ConnectionAbortedError("the watch is closing")
            conn.request("GET", _path(self.settings, query), headers=headers)
            resp = conn.getresponse()
            if not 200 <= resp.status <= 299:
                raise HttpError(resp.status, resp.reason)
            yield resp
        finally:
            self._sock = None
            conn.close()

    def _list(self) -> None:
        query = {"fieldSelector": self._selector()}
        if not self._consistent_list:
            query["resourceVersion"] = "0"  # from the watch cache (module docstring)
        with self._get(query, LIST_READ_TIMEOUT_S) as resp:
            body = json.loads(resp.read())
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise _BadResponse("the pod list has no items")
        labels = self.settings.well_known_labels
        pods = [p for p in (pod_meta(item, labels) for item in body["items"]) if p is not None]
        self.cache.replace(pods)
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        self._consistent_list = False
        self._lists += 1
        self._ok()
        if self.resource_version is None:
            raise _BadResponse("the pod list has no resourceVersion to watch from")

    def _watch(self) -> None:
        """Until the server ends the watch (its timeoutSeconds); raises on errors, _Gone on 410."""
        s = self.settings
        query = {"allowWatchBookmarks": "true", "fieldSelector": self._selector(),
                 "resourceVersion": str(self.resource_version),  # set by the list before any watch
                 "timeoutSeconds": str(s.watch_timeout_s), "watch": "true"}
        with self._get(query, s.watch_timeout_s + 30) as resp:
            self._ok()
            for line in _lines(resp):
                if self._stop.is_set():
                    return
                self._event(line)
                self._recovered()
            self._recovered()

    def _event(self, line: bytes) -> None:
        event = json.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # a Status object
            if obj.get("code") == 410:
                raise _Gone(obj.get("message", "resourceVersion too old"))
            raise _BadResponse(f"watch error {obj.get('code')}: {obj.get('message', '')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            pod = pod_meta(obj, self.settings.well_known_labels)
            if pod is not None:
                (self.cache.delete if kind == "DELETED" else self.cache.upsert)(pod)
            self._events += 1
        elif kind != "BOOKMARK":
            raise _BadResponse(f"unknown watch event type {kind!r}")
        if version:
            self.resource_version = str(version)
        now = self._now()
        if now >= self._next_expire:
            self._next_expire = now + EXPIRE_EVERY_S
            self.cache.expire()


def _connection(settings: KubeSettings) -> http.client.HTTPConnection:
    """HTTPS verified against the cluster CA; plain HTTP only for an http:// server (tests)."""
    url = urlsplit(settings.api_server)
    host = url.hostname or ""  # an IPv6 literal without its brackets; http.client adds them to the Host header
    if url.scheme != "https":
        return http.client.HTTPConnection(host, url.port, timeout=CONNECT_TIMEOUT_S)
    tls = ssl.create_default_context()
    load_ca_data(tls, settings.ca_data or b"")
    return http.client.HTTPSConnection(host, url.port, timeout=CONNECT_TIMEOUT_S, context=tls)


def _path(settings: KubeSettings, query: dict[str, str]) -> str:
    """The query encoded as the kubernetes client library did (urllib.parse.quote: `=` becomes %3D)."""
    prefix = urlsplit(settings.api_server).path.rstrip("/")
    return f"{prefix}/api/v1/pods?" + "&".join(f"{k}={quote(v)}" for k, v in query.items())


def _lines(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    """Newline-delimited JSON events from a streaming response, as they arrive (read1: what one recv brings)."""
    buf = b""
    while chunk := resp.read1(65536):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


def _short(exc: BaseException) -> str:
    if isinstance(exc, HttpError):
        return str(exc)  # HTTP 403 Forbidden
    return (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300]

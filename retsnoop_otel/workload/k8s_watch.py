"""One node-scoped list+watch of pods (fieldSelector spec.nodeName=<node>), on a thread of its own.

The `kubernetes` client library does the HTTP, TLS and bearer-token work through its public API
(Configuration, ApiClient, CoreV1Api.list_pod_for_all_namespaces); responses are read raw
(`_preload_content=False`) and parsed as plain JSON, since model objects for every pod update cost
more than the few fields used. It is imported only when the watch is on: its import takes seconds.

The protocol, as the API server defines it: list (resourceVersion of the list), then watch from that
version; ADDED/MODIFIED/DELETED move the cache and the version, BOOKMARK moves the version only; a
watch the server ends is resumed from the last version; `410 Gone` (the version is too old) lists
again. The token is re-read from its file before every request (bound service-account tokens rotate).
When the API server cannot be reached or refuses (RBAC), the pods known so far stay, sessions keep
container.id and k8s.pod.uid, one warning goes to the log (and one line when it works again), and the
watch retries with a back-off doubling from 1 s to 60 s. Self-metrics: `retsnoop_k8s_metadata_current`
and `retsnoop_k8s_watch_errors_total{reason}` (metrics/runtime_families.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from retsnoop_otel.workload.k8s_settings import KubeSettings
from retsnoop_otel.workload.pods import PodCache, pod_meta

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
CONNECT_TIMEOUT_S = 10.0
LIST_READ_TIMEOUT_S = 60.0
EXPIRE_EVERY_S = 30.0
MIN_WATCH_INTERVAL_S = 1.0  # a server that ends watches at once is not asked again in a tight loop
REASONS = ("unreachable", "unauthorized", "forbidden", "gone", "server_error", "invalid_response")


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


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, _Gone):
        return "gone"
    if isinstance(exc, _NoToken):
        return "unauthorized"
    if isinstance(exc, _BadResponse | ValueError):
        return "invalid_response"
    status = getattr(exc, "status", None)  # kubernetes.client.exceptions.ApiException
    if isinstance(status, int) and status:
        if status == 401:
            return "unauthorized"
        if status == 403:
            return "forbidden"
        if status == 410:
            return "gone"
        return "server_error"
    return "unreachable"  # connection refused or reset, TLS, timeouts (urllib3 and OS errors)


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
        self._current = False
        self._failing = False
        self._errors: dict[str, int] = {}
        self._lists = 0
        self._events = 0
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self._next_expire = 0.0

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PodWatch:
        self._thread = threading.Thread(target=self._run, name="k8s-pod-watch", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:  # wakes the thread out of a blocking read
            try:
                (getattr(resp, "shutdown", None) or resp.close)()
            except Exception:  # noqa: BLE001 - closing is best effort; the thread is a daemon
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def counters(self) -> WatchCounters:
        return WatchCounters(self._current, dict(self._errors), self._lists, self._events, len(self.cache))

    # ---- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        api = None
        backoff = self.backoff_first_s
        while not self._stop.is_set():
            try:
                if api is None:
                    api = self._api()
                if self.resource_version is None:
                    self._list(api)
                started = self._now()
                self._watch(api)
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

    def _api(self) -> Any:
        from kubernetes import client  # the library's import takes seconds: only when the watch is on

        conf = client.Configuration()
        conf.host = self.settings.api_server
        if self.settings.ca_file:
            conf.ssl_ca_cert = self.settings.ca_file
        conf.api_key = {"authorization": self._token()}
        conf.api_key_prefix = {"authorization": "Bearer"}
        conf.refresh_api_key_hook = self._refresh_token
        conf.retries = False  # our loop retries, with back-off and counted
        return client.CoreV1Api(client.ApiClient(conf))

    def _token(self) -> str:
        try:
            with open(self.settings.token_file) as f:
                return f.read().strip()
        except OSError as exc:
            raise _NoToken(f"{self.settings.token_file}: {exc.strerror}") from None

    def _refresh_token(self, conf: Any) -> None:
        """Before every request: kubelet rewrites a bound token before it expires."""
        conf.api_key["authorization"] = self._token()

    def _selector(self) -> str:
        return f"spec.nodeName={self.settings.node_name}"

    def _list(self, api: Any) -> None:
        resp = api.list_pod_for_all_namespaces(field_selector=self._selector(), _preload_content=False,
                                               _request_timeout=(CONNECT_TIMEOUT_S, LIST_READ_TIMEOUT_S))
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        if not isinstance(body, dict) or not isinstance(body.get("items"), list):
            raise _BadResponse("the pod list has no items")
        pods = [p for p in map(pod_meta, body["items"]) if p is not None]
        self.cache.replace(pods)
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        self._lists += 1
        self._ok()
        if self.resource_version is None:
            raise _BadResponse("the pod list has no resourceVersion to watch from")

    def _watch(self, api: Any) -> None:
        """Until the server ends the watch (its timeoutSeconds); raises on errors, _Gone on 410."""
        s = self.settings
        resp = api.list_pod_for_all_namespaces(
            field_selector=self._selector(), watch=True, allow_watch_bookmarks=True,
            resource_version=self.resource_version, timeout_seconds=s.watch_timeout_s, _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, s.watch_timeout_s + 30))
        self._resp = resp
        try:
            self._ok()
            for line in _lines(resp):
                if self._stop.is_set():
                    return
                self._event(line)
                self._recovered()
            self._recovered()
        finally:
            self._resp = None
            resp.release_conn()

    def _event(self, line: bytes) -> None:
        event = json.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # a Status object
            if obj.get("code") == 410:
                raise _Gone(obj.get("message", "resourceVersion too old"))
            raise _BadResponse(f"watch error {obj.get('code')}: {obj.get('message', '')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            pod = pod_meta(obj)
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


def _lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited JSON events from a streaming response, as they arrive."""
    buf = b""
    for chunk in resp.stream(65536, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    return (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300]

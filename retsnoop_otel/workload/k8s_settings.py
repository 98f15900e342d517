"""The pod metadata watch's settings: what the config says, completed from the in-cluster environment.

In a pod, the API server is `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the service
account's token and the cluster CA are files under /var/run/secrets/kubernetes.io/serviceaccount, and
the node name comes in through the downward API as K8S_NODE_NAME (config/k8s/base/daemonset.yaml). Each can be
set in the config instead (tests point them at a local server). The config file's check is of the form
only (so the shipped file parses anywhere); what the environment must provide is checked when the
runtime starts, before anything is loaded into the kernel: a watch that cannot start is a one-line input
error naming the setting.
"""

import os
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import SplitResult, urlsplit

from retsnoop_otel.inputs.files import MAX_PEM_BYTES, read_bytes, shown
from retsnoop_otel.inputs.tls_files import read_ca_bundle

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NODE_ENV = "K8S_NODE_NAME"
# why a pod list or watch failed (workload/k8s_watch.py), here so that /metrics lists them without importing the watch
REASONS = ("unreachable", "unauthorized", "forbidden", "gone", "server_error", "invalid_response")
WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it is then resumed from the last resourceVersion


class KubernetesConfig(NamedTuple):
    metadata: bool = False  # k8s.pod.name, k8s.namespace.name, k8s.container.name from a watch of this node's pods
    node_name: str | None = None  # None: $K8S_NODE_NAME
    api_server: str | None = None  # None: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    token_file: str = f"{SA_DIR}/token"
    ca_file: str = f"{SA_DIR}/ca.crt"
    keep_deleted_s: float = 300.0  # a deleted pod's names stay this long for its last sessions
    well_known_labels: bool = False  # the app.kubernetes.io/instance and /name labels name a pod's service too
    cluster_name: str | None = None  # k8s.cluster.name of every resource (None: OTEL_RESOURCE_ATTRIBUTES' if any)

    @property
    def watched(self) -> "KubernetesConfig":
        """What the pod watch is made from: a reload that changes only the cluster's name keeps the watch."""
        return self._replace(cluster_name=None)


class KubeSettings(NamedTuple):
    """A watch that can start: every value known."""

    node_name: str
    api_server: str
    token_file: str
    ca_data: bytes | None  # the cluster CA as read at the start (once, like client-go); None for http:// (tests)
    keep_deleted_s: float = 300.0
    watch_timeout_s: int = WATCH_TIMEOUT_S
    well_known_labels: bool = False  # pods' app.kubernetes.io/instance and /name labels are read (pods.pod_meta)


class KubeConfigError(ValueError):
    """`key: what is wrong; what to do`, with the key as the user wrote it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    host, port = environ.get("KUBERNETES_SERVICE_HOST", "").strip(), environ.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def check_form(cfg: KubernetesConfig, prefix: str = "kubernetes.") -> None:
    """What the settings say by themselves (the config file's check); the environment is checked at start."""
    if cfg.api_server is not None:
        _server_url(cfg.api_server, prefix + "api_server")
    if cfg.well_known_labels and not cfg.metadata:
        raise KubeConfigError(prefix + "well_known_labels", "a pod's labels come from the pod metadata watch: turn it "
                              "on with kubernetes.metadata: true, or leave this key out")


def _server_url(server: str, key: str) -> SplitResult:
    """The API server's URL; anything a URL parser refuses is a KubeConfigError too (never a ValueError)."""
    try:
        url = urlsplit(server)
        ok = url.scheme in ("https", "http") and bool(url.hostname) and not any(
            ord(c) < 32 or ord(c) == 127 for c in server)
    except ValueError:  # an unclosed '[' of an IPv6 address
        ok = False
    if not ok:
        raise KubeConfigError(key, f"{shown(server)} is not an https:// URL; write it like https://10.96.0.1:443 "
                              "(IPv6: https://[fd00::1]:443)")
    return url


def resolve_kubernetes(cfg: KubernetesConfig, environ: Mapping[str, str], prefix: str = "kubernetes.",
                       root: str = "/") -> KubeSettings | None:
    """None when the watch is off; raises KubeConfigError when it is on and cannot start (checked by the
    runtime before anything is loaded, and by `agent --check`: a node name, a server, a mounted token)."""
    if not cfg.metadata:
        return None
    check_form(cfg, prefix)
    node = (cfg.node_name if cfg.node_name is not None else environ.get(NODE_ENV, "")).strip()
    if not node:
        raise KubeConfigError(prefix + "node_name", f"not set and ${NODE_ENV} is empty: give the node's name, or set "
                              f"{NODE_ENV} from the downward API (fieldRef spec.nodeName)")
    server = cfg.api_server if cfg.api_server is not None else in_cluster_server(environ)
    if not server:
        raise KubeConfigError(prefix + "api_server", "not set and $KUBERNETES_SERVICE_HOST/PORT are empty (not in a "
                              "pod?): give the API server's URL, such as https://10.96.0.1:443")
    url = _server_url(server, prefix + "api_server")
    token = _readable(cfg.token_file, root, prefix + "token_file",
                      "mount the service-account token (automountServiceAccountToken: true)")
    ca = _ca_bundle(_under(cfg.ca_file, root), prefix + "ca_file") if url.scheme == "https" else None
    return KubeSettings(node, server.rstrip("/"), token, ca, cfg.keep_deleted_s,
                        well_known_labels=cfg.well_known_labels)


def _ca_bundle(path: str, key: str) -> bytes:
    """The cluster CA's bytes, checked: the watch's connections are verified with them, never reading the file again."""
    def error(msg: str) -> Exception:
        return KubeConfigError(key, f"{msg}; mount the service-account token volume, which holds ca.crt, or give the "
                               "cluster CA")
    return read_ca_bundle(path, error)


def _under(path: str, root: str) -> str:
    return os.path.join(root, path.lstrip("/")) if os.path.isabs(path) else path


def _readable(path: str, root: str, key: str, fix: str) -> str:
    """The token's path under `root`, read now rather than at the first request (the watch reads it again at each
    request: the kubelet rotates it)."""
    full = _under(path, root)

    def error(msg: str) -> Exception:
        return KubeConfigError(key, f"{msg}; {fix}")
    read_bytes(full, "", MAX_PEM_BYTES, error)
    return full

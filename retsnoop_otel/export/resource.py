"""The OpenTelemetry resource describing this tracer run and the traced host.

Detected values come first; OTEL_RESOURCE_ATTRIBUTES and then OTEL_SERVICE_NAME are applied on top,
as the SDK specification orders them, so a deployment can override anything. Parsed here rather
than through the SDK's resource detector: its import costs seconds of start-up in a slow VM, for
twenty lines of parsing (tests compare the result with the SDK's own detector).
"""

import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple
from urllib.parse import unquote

from retsnoop_otel import __version__
from retsnoop_otel.capture.model import Workload
from retsnoop_otel.export.otel_env import RESOURCE_ATTRIBUTES, SERVICE_NAME
from retsnoop_otel.export.semconv import SCHEMA_URL
from retsnoop_otel.inputs.files import shown

DEFAULT_SERVICE_NAME = "retsnoop-otel"
NODE_NAME_ENV = "K8S_NODE_NAME"  # the downward API's spec.nodeName (config/k8s/base/daemonset.yaml)


class Resource(NamedTuple):
    attributes: Mapping[str, Any] = MappingProxyType({})
    schema_url: str = ""


def read_machine_id(root: str | Path = "/") -> str | None:
    """host.id per the semantic conventions: /etc/machine-id, else the D-Bus copy of it."""
    for rel in ("etc/machine-id", "var/lib/dbus/machine-id"):
        try:
            text = (Path(root) / rel).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def host_attributes(root: str | Path, environ: Mapping[str, str]) -> dict[str, str]:
    """Host and OS attributes of the machine whose kernel is traced.

    In a pod, gethostname() is the pod's name: the node's name (K8S_NODE_NAME) is the host's, and it is
    also k8s.node.name."""
    uname = os.uname()
    node = environ.get(NODE_NAME_ENV, "").strip()
    attrs = {
        "host.name": node or os.uname().nodename,  # what socket.gethostname() returns, without socket
        "host.arch": _otel_arch(uname.machine),
        "os.type": "linux",
        "os.version": uname.release,
    }
    machine_id = read_machine_id(root)
    if machine_id:
        attrs["host.id"] = machine_id
    if node:
        attrs["k8s.node.name"] = node
    return attrs


def _otel_arch(machine: str) -> str:
    """Map uname's machine to the host.arch well-known values where one exists."""
    known = {"x86_64": "amd64", "aarch64": "arm64", "i686": "x86", "i386": "x86", "ppc64le": "ppc64",
             "s390x": "s390x", "armv7l": "arm32"}
    if not machine:
        import platform  # only here: platform, socket and uuid were 4 ms of every start
        machine = platform.machine()
    return known.get(machine, machine)


def _new_instance_id() -> str:
    """A random (version 4) UUID, as uuid.uuid4() makes it: uuid imports platform at every start."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40
    b[8] = b[8] & 0x3F | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def resource_attributes_problem(text: str) -> str | None:
    """Why OTEL_RESOURCE_ATTRIBUTES cannot be read, or None. As the specification says, a malformed list is
    discarded as a whole, with a warning (runtime/settings.py says it at start): attributes taken in part could
    put a host's telemetry under the wrong service or environment."""
    for n, item in enumerate(text.split(","), 1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        # named by its key, cut, never by its value (a value may hold a secret, and an entry without '=' may be
        # the part of a value after a comma)
        if not sep:
            return f"entry {n} has no '=' (not shown: it may be part of a value)"
        if not key.strip():
            return f"entry {n} has an empty key"
        if _BAD_ESCAPE.search(value):
            return f"entry {n} ({shown(key.strip(), 40)}): a '%' that starts no %XX escape in its value"
        try:
            unquote(value, errors="strict")
        except UnicodeDecodeError:
            return f"entry {n} ({shown(key.strip(), 40)}): its %XX escapes are not UTF-8"
    return None


def parse_resource_attributes(text: str) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES: `key=value` pairs separated by commas, values percent-encoded (W3C Baggage).
    A malformed list (resource_attributes_problem) is discarded as a whole."""
    if resource_attributes_problem(text) is not None:
        return {}
    out: dict[str, str] = {}
    for item in text.split(","):
        if item.strip():
            key, _, value = item.partition("=")
            out[key.strip()] = unquote(value.strip())
    return out


def build_resource(environ: Mapping[str, str], root: str | Path = "/",
                   service_name: str = DEFAULT_SERVICE_NAME, instance_id: str | None = None) -> Resource:
    """Resource for one run: a new service.instance.id each time unless one is given. `environ`: the run's
    (RuntimeDeps), for OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME and K8S_NODE_NAME.

    Its schema URL names the semantic-conventions version of the detected attributes; attributes a
    deployment adds through OTEL_RESOURCE_ATTRIBUTES are taken as written.
    """
    attrs: dict[str, Any] = {
        "service.name": service_name,
        "service.version": __version__,
        "service.instance.id": instance_id or _new_instance_id(),
        "telemetry.sdk.name": "retsnoop-otel",
        "telemetry.sdk.language": "python",
        "telemetry.sdk.version": __version__,
        **host_attributes(root, environ),
    }
    attrs.update(parse_resource_attributes(environ.get(RESOURCE_ATTRIBUTES, "")))
    if environ.get(SERVICE_NAME, "").strip():
        attrs["service.name"] = environ[SERVICE_NAME].strip()
    return Resource(attrs, SCHEMA_URL)


CLUSTER_NAME = "k8s.cluster.name"


def with_cluster_name(resource: Resource, name: str | None) -> Resource:
    """The resource with `kubernetes.cluster_name` as its k8s.cluster.name (on every workload's resource too, which
    is built on the agent's). The API server has no name for its cluster, so nothing detects one: unset (None),
    the resource keeps what OTEL_RESOURCE_ATTRIBUTES says, if anything; set, the key beats the variable, as the
    config's keys beat the OTEL_* variables elsewhere (export/otlp_settings.py)."""
    if not name:
        return resource
    return Resource({**resource.attributes, CLUSTER_NAME: name}, resource.schema_url)


# a pod's owner kinds (Workload.owners, workload/pod_fields.py) -> their semantic-conventions attribute
OWNER_ATTRIBUTES = {"replicaset": "k8s.replicaset.name", "deployment": "k8s.deployment.name",
                    "daemonset": "k8s.daemonset.name", "statefulset": "k8s.statefulset.name",
                    "job": "k8s.job.name", "cronjob": "k8s.cronjob.name"}


def workload_attributes(workload: Workload) -> dict[str, Any]:
    """The resource attributes that tell one traced workload from another (known values only): its container and
    image, its pod and the pod's owners (container.image.tags a string array)."""
    pairs: list[tuple[str, Any]] = [
        ("container.id", workload.container_id), ("container.runtime.name", workload.container_runtime),
        ("container.image.name", workload.image_name), ("container.image.tags", list(workload.image_tags)),
        ("k8s.pod.uid", workload.pod_uid), ("k8s.pod.name", workload.pod_name),
        ("k8s.namespace.name", workload.namespace), ("k8s.container.name", workload.container_name)]
    pairs += [(OWNER_ATTRIBUTES[kind], name) for kind, name in workload.owners if kind in OWNER_ATTRIBUTES]
    return {key: value for key, value in pairs if value}


def with_workload(attributes: Mapping[str, Any], workload: Workload | None) -> dict[str, Any]:
    """The agent's resource (service.*, host.*, os.*, telemetry.sdk.*) plus the workload's attributes: the
    resource of that workload's spans, so that backends and the Collector group them by container and pod."""
    return {**attributes, **workload_attributes(workload)} if workload else dict(attributes)

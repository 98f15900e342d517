"""The OpenTelemetry Resource describing this tracer run and the traced host.

Detected values come first; OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME are applied on top so a
deployment can override anything (the SDK's Resource.create alone would let our values win).
"""

from __future__ import annotations

import os
import platform
import socket
import uuid
from pathlib import Path

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from retsnoop_otel import __version__

DEFAULT_SERVICE_NAME = "retsnoop-otel"


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


def host_attributes(root: str | Path = "/") -> dict[str, str]:
    """Host and OS attributes of the machine whose kernel is traced."""
    uname = os.uname()
    attrs = {
        "host.name": socket.gethostname(),
        "host.arch": _otel_arch(uname.machine),
        "os.type": "linux",
        "os.version": uname.release,
    }
    machine_id = read_machine_id(root)
    if machine_id:
        attrs["host.id"] = machine_id
    return attrs


def _otel_arch(machine: str) -> str:
    """Map uname's machine to the host.arch well-known values where one exists."""
    known = {"x86_64": "amd64", "aarch64": "arm64", "i686": "x86", "i386": "x86", "ppc64le": "ppc64",
             "s390x": "s390x", "armv7l": "arm32"}
    return known.get(machine, machine or platform.machine())


def build_resource(root: str | Path = "/", service_name: str = DEFAULT_SERVICE_NAME,
                   instance_id: str | None = None) -> Resource:
    """Resource for one run: a new service.instance.id each time unless one is given."""
    attrs: dict[str, str] = {
        "service.name": service_name,
        "service.version": __version__,
        "service.instance.id": instance_id or str(uuid.uuid4()),
        **host_attributes(root),
    }
    return Resource.create(attrs).merge(OTELResourceDetector().detect())

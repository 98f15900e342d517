"""Process context (OTEP 4719): the service's resource attributes and the thread-context reference data.

The payload is a serialized `opentelemetry.proto.resource.v1.Resource` whose attributes are the service's
resource attributes plus `threadlocal.schema_version` = "tls_v1" and `threadlocal.attribute_key_map` (the span
attribute names whose values thread records carry, by index). The C library publishes it in a memfd mapping
named OTEL_CTX (the first call) or updates it in place (later calls), following the OTEP's protocols.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import unquote

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from . import native

SCHEMA_VERSION = "tls_v1"
SCHEMA_KEY = "threadlocal.schema_version"
KEY_MAP_KEY = "threadlocal.attribute_key_map"
ATTRIBUTES_ENV = "RETSNOOP_OTEL_THREAD_ATTRIBUTES"
MAX_KEYS = 256  # key indexes are one byte


class HasAttributes(Protocol):
    """An OpenTelemetry SDK Resource, or anything else with a mapping of attributes."""

    @property
    def attributes(self) -> Mapping[str, Any]: ...


def configured_key_map(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The span attributes that thread records carry: RETSNOOP_OTEL_THREAD_ATTRIBUTES, comma-separated, in order."""
    keys: dict[str, None] = {}
    for raw in environ.get(ATTRIBUTES_ENV, "").split(","):
        if raw.strip():
            keys[raw.strip()] = None
    if len(keys) > MAX_KEYS:
        raise ValueError(f"{ATTRIBUTES_ENV}: {len(keys)} attributes, a thread record can name at most {MAX_KEYS}")
    return tuple(keys)


def env_resource_attributes(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The resource attributes the environment sets, as the SDK reads them: OTEL_RESOURCE_ATTRIBUTES (`k=v,...`,
    percent-decoded values), then OTEL_SERVICE_NAME over service.name (default "unknown_service")."""
    attrs = {"service.name": "unknown_service", "telemetry.sdk.language": "python"}
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attrs[key.strip()] = unquote(value.strip())
    if environ.get("OTEL_SERVICE_NAME", "").strip():
        attrs["service.name"] = environ["OTEL_SERVICE_NAME"].strip()
    return attrs


def any_value(value: Any) -> AnyValue:
    """An attribute value as OTLP's AnyValue (str, bool, int, float, bytes, sequences and mappings of them)."""
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes | bytearray):
        return AnyValue(bytes_value=bytes(value))
    if isinstance(value, Mapping):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=str(k), value=any_value(v))
                                                          for k, v in value.items()]))
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue(string_value=str(value))


def resource_message(attributes: Mapping[str, Any], key_map: Sequence[str]) -> Resource:
    """The Resource to publish: `attributes` (None values dropped), then the thread-context reference data."""
    merged = {k: v for k, v in attributes.items() if v is not None and k not in (SCHEMA_KEY, KEY_MAP_KEY)}
    merged[SCHEMA_KEY] = SCHEMA_VERSION
    merged[KEY_MAP_KEY] = list(key_map)
    return Resource(attributes=[KeyValue(key=k, value=any_value(v)) for k, v in merged.items()])


def publish_process_context(attributes: Mapping[str, Any] | HasAttributes | None = None,
                            key_map: Sequence[str] | None = None) -> bytes:
    """Publish, or update, this process's OTEL_CTX context; returns the payload published.

    `attributes`: a mapping or an SDK Resource (its `.attributes`); None: the environment's resource attributes
    (service.name from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES). `key_map`: the attribute names thread
    records index; None: RETSNOOP_OTEL_THREAD_ATTRIBUTES, the map the runtime context uses (pass another only
    if the records use it too: readers resolve indexes against the published map).
    """
    if attributes is None:
        attributes = env_resource_attributes()
    elif not isinstance(attributes, Mapping):
        attributes = attributes.attributes
    keys = configured_key_map() if key_map is None else tuple(key_map)
    if len(keys) > MAX_KEYS:
        raise ValueError(f"key_map: {len(keys)} names, a thread record can name at most {MAX_KEYS}")
    payload = resource_message(attributes, keys).SerializeToString()
    native.publish_payload(payload)
    return payload

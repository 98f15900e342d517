"""Span exporters configured from the agent's `exporter:` section: OTLP (gRPC, HTTP) and an OTLP-JSON file.

Unset OTLP settings are passed as None so the SDK exporters apply the standard
OTEL_EXPORTER_OTLP_* variables themselves (endpoint, headers, compression, timeout, certificate).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from retsnoop_otel.export.otlp import SpanExporterLike, resolve_protocol
from retsnoop_otel.runtime.config import OtlpConfig


def _otlp_kwargs(cfg: OtlpConfig, protocol: str, signal_path: str) -> dict[str, Any]:
    """Constructor arguments shared by the SDK's span and metric exporters of `protocol`."""
    headers = dict(cfg.headers) or None
    if protocol == "grpc":
        import grpc

        insecure = cfg.insecure
        if insecure is None and cfg.endpoint is not None:
            insecure = cfg.endpoint.startswith("http://")
        credentials = None
        if cfg.certificate is not None:
            with open(cfg.certificate, "rb") as f:
                credentials = grpc.ssl_channel_credentials(f.read())
        compression = None if cfg.compression is None else {
            "gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate,
            "none": grpc.Compression.NoCompression}[cfg.compression]
        return {"endpoint": cfg.endpoint, "insecure": insecure, "credentials": credentials, "headers": headers,
                "timeout": cfg.timeout_s, "compression": compression}
    from opentelemetry.exporter.otlp.proto.http import Compression

    endpoint = cfg.endpoint
    if endpoint is not None and urlparse(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + signal_path  # a bare base URL gets the standard signal path
    return {"endpoint": endpoint, "certificate_file": cfg.certificate, "headers": headers, "timeout": cfg.timeout_s,
            "compression": None if cfg.compression is None else Compression(cfg.compression)}


def build_otlp_exporter(cfg: OtlpConfig) -> SpanExporterLike:
    """The SDK's OTLP span exporter for the configured protocol (default from the environment, else gRPC),
    able to send requests pre-encoded by otlp_fast."""
    from retsnoop_otel.export.otlp_fast import EncodedGrpcSpanExporter, EncodedHttpSpanExporter

    protocol = resolve_protocol(cfg.protocol)
    cls = EncodedGrpcSpanExporter if protocol == "grpc" else EncodedHttpSpanExporter
    return cls(**_otlp_kwargs(cfg, protocol, "/v1/traces"))


def build_otlp_metric_exporter(cfg: OtlpConfig) -> Any:
    """The SDK's OTLP metric exporter for `metrics.otlp` (same settings and defaults as the span exporter)."""
    protocol = resolve_protocol(cfg.protocol)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc
        return Grpc(**_otlp_kwargs(cfg, protocol, "/v1/metrics"))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http
    return Http(**_otlp_kwargs(cfg, protocol, "/v1/metrics"))


def _hex_ids(obj: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where the protobuf JSON mapping would use base64."""
    if isinstance(obj, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                    else _hex_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


class OtlpJsonFileExporter:
    """Appends each batch as one OTLP/JSON ExportTraceServiceRequest line (the collector file format)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the exporter's life

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        return self._write(encode_spans(spans))

    def export_encoded(self, body: bytes, spans: int) -> SpanExportResult:
        """A request serialized on the fast path (otlp_fast.build_request)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        return self._write(ExportTraceServiceRequest.FromString(body))

    def _write(self, request: Any) -> SpanExportResult:
        from google.protobuf.json_format import MessageToDict

        line = json.dumps(_hex_ids(MessageToDict(request, use_integers_for_enums=True)), separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


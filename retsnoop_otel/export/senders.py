"""Exporters that only send: serialized OTLP requests handed to a collector as they are.

The encoders (span_encoder, metrics_push) write the request bytes; a sender delivers them. The gRPC
sender (grpc_sender.py) and the OTLP/HTTP sender (http_sender.py), like the OTLP/JSON file writer
(otlp_file.py), use public APIs only (grpcio, http.client, the generated opentelemetry-proto
classes) and are imported when built, so a run without OTLP export never loads grpc or protobuf.
"""

from __future__ import annotations

from retsnoop_otel.export.otlp_settings import OtlpSettings
from retsnoop_otel.export.sending import Sender


def build_sender(settings: OtlpSettings) -> Sender:
    """The one exporter builder: a GrpcSender or an HttpSender for the resolved settings."""
    if settings.protocol == "grpc":
        from retsnoop_otel.export.grpc_sender import GrpcSender
        return GrpcSender(settings)
    from retsnoop_otel.export.http_sender import HttpSender
    return HttpSender(settings)

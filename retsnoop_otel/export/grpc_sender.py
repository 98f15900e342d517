"""OTLP/gRPC: unary Export calls through grpcio's public API, the request bytes passed as they are."""

from __future__ import annotations

import time

import grpc

from retsnoop_otel.export.otlp_settings import OtlpSettings
from retsnoop_otel.export.sending import (
    MAX_MESSAGE,
    USER_AGENT,
    Retrying,
    SendResult,
    one_line,
    partial_success,
    signal_messages,
)

# RESOURCE_EXHAUSTED is retryable only with RetryInfo in the status details, which we do not parse.
RETRYABLE_GRPC = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})


class GrpcSender(Retrying):
    """Unary Export calls with the request bytes as they are (no serializer: nothing is parsed again)."""

    def __init__(self, settings: OtlpSettings) -> None:
        super().__init__(settings)
        method, _, response_cls, self._field = signal_messages(settings.signal)
        options = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.primary_user_agent", USER_AGENT)]
        if settings.tls:
            pair = settings.client_pair  # the bytes read and checked at start (otlp_settings), not the files again
            credentials = grpc.ssl_channel_credentials(settings.ca_data, pair and pair.key, pair and pair.cert)
            self._channel = grpc.secure_channel(settings.target, credentials, options)
        else:
            self._channel = grpc.insecure_channel(settings.target, options)
        self._export = self._channel.unary_unary(method, request_serializer=None,
                                                 response_deserializer=response_cls.FromString)
        self._compression = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate,
                             "none": grpc.Compression.NoCompression}[settings.compression]

    def _attempt(self, payload: bytes, deadline: float) -> tuple[SendResult, bool, float | None]:
        left = deadline - time.monotonic()
        if left <= 0:
            return SendResult(False, error="DEADLINE_EXCEEDED: no time left for an attempt"), False, None
        try:
            response = self._export(payload, timeout=left, metadata=self.settings.headers or None,
                                    compression=self._compression)
        except grpc.RpcError as err:
            if not isinstance(err, grpc.Call):  # raised RpcErrors of unary calls are Calls too (grpcio docs)
                return SendResult(False, error=one_line(f"gRPC error: {err}")), False, None
            code = err.code()
            return SendResult(False, error=one_line(f"{code.name}: {err.details()}")), code in RETRYABLE_GRPC, None
        except (ValueError, TypeError) as exc:  # the channel was closed by shutdown(), or bad metadata
            why = "sender is shut down" if self._stopped.is_set() else "cannot start the call"
            return SendResult(False, error=one_line(f"{why}: {exc}")), False, None
        return partial_success(response, self._field), False, None

    def shutdown(self) -> None:
        super().shutdown()
        self._channel.close()  # also cancels an RPC in flight; the canceled send is not retried

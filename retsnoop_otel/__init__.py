"""retsnoop-otel: retsnoop-style mass tracing of kernel functions, exported as OpenTelemetry."""

__version__ = "0.1.0"

"""The semantic-conventions version the exported names follow, stated once as the schema URL.

A schema URL lets a backend translate names when conventions rename them (schema files list the
renames per version). Every standard name retsnoop-otel writes (code.function.name, code.file.path,
code.line.number, code.stacktrace, error.type, thread.*, process.*, host.*, os.*, service.*,
telemetry.sdk.*) is current in this version; tests/unit/test_export_conventions.py checks that
against the opentelemetry-semantic-conventions package. Names under `retsnoop.` are our own.
"""

from __future__ import annotations

SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

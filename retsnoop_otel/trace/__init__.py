"""`retsnoop-otel trace`: retsnoop's flags and presentation over the capture runtime (one ad-hoc probe set)."""

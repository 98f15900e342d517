"""`python -m retsnoop_otel`."""

from retsnoop_otel.cli import run

run()

"""Benchmarks, each a module run from the repository root: `python -m bench.NAME` (on the host with .venv/bin/python,
in the VM guest through `tests/vm/run ... -- python -m bench.NAME`). What several benches use is in bench.harness."""

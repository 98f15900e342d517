"""The modules a `trace` start imports before "Receiving data...": the command's own tree, then what the
runtime's phases import on the way (kernel facts, feature probes, kernel cache, symbolizer), and the
console renderer, which the first session imports.

Shared by bench/import_cost.py (what their imports cost) and tests/unit/test_startup.py (none of them may import
dataclasses), so it lives in bench/: the tests import bench, never the other way round. tests/vm/test_trace_e2e.py
checks what a warm `trace --dry-run` imports in the VM.
"""

START_MODULES = (
    "retsnoop_otel.trace.main", "retsnoop_otel.kernel.features", "retsnoop_otel.kernel.tracefs",
    "retsnoop_otel.kernel.kcache", "retsnoop_otel.kernel.lbr", "retsnoop_otel.kernel.caps",
    "retsnoop_otel.kernel.build_id", "retsnoop_otel.kernel.libbpf_btf", "retsnoop_otel.kernel.tracer",
    "retsnoop_otel.kernel.clones", "retsnoop_otel.symbols.btf", "retsnoop_otel.symbols.kernel_facts",
    "retsnoop_otel.symbols.symbolize", "retsnoop_otel.symbols.vmlinux", "retsnoop_otel.symbols.discovery",
    "retsnoop_otel.capture.clock", "retsnoop_otel.render.console",
)

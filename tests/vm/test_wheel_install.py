"""The wheel users install, on a real kernel: installed into a clean venv in the guest, it captures a failing call
and exports it (tests/test_wheel.py checks the wheel itself and its install on the host)."""

from __future__ import annotations

import pytest

from retsnoop_otel.kernel.tracer import PROGRAM_NAMES
from tests.otlp_json import spans as otlp_spans

pytestmark = [pytest.mark.vm, pytest.mark.kernels("newest")]


def test_installed_wheel_captures_and_exports(vm_batch) -> None:
    res = vm_batch["wheel_install"]
    assert res["install"][0] == 0, res["install"]
    rc, out, _ = res["version"]
    assert rc == 0 and out.strip() == "retsnoop-otel v0.1.0, libbpf 1.7 (built with the package)", out
    # the venv's own copy of our libbpf, not this checkout's
    assert res["module"][1].strip().startswith("/tmp/") and "/venv/lib/" in res["module"][1], res["module"]
    assert res["simfail_rc"] == 0
    assert "array_map_alloc_check" in res["tracer_output"] and res["tracer_rc"] == 0, res["tracer_output"][-2000:]
    spans = otlp_spans(res["otlp"])
    errors = {s["name"] for s in spans if s["attrs"].get("error.type") == "EINVAL"}
    assert {"__x64_sys_bpf", "array_map_alloc_check"} <= errors, errors
    assert not set(res["progs_after"]) & PROGRAM_NAMES, res["progs_after"]

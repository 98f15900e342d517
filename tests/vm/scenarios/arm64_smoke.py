"""Guest side of the arm64 smoke: Debian's arm64 kernel under emulation, a Debian arm64 root, and the package from
the aarch64 wheel (build/arm64-site, before this checkout on PYTHONPATH). The features report, then a failing
bpf() call captured in stack mode with argument capture (registers read through arm64's pt_regs) and exported
over OTLP to a real receiver, once in the default attach mode and once with fentry (-F)."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import retsnoop_otel
from tests.vm.guest_batch import Context, budget

PY = sys.executable
TOOL = [PY, "-m", "retsnoop_otel"]


def _lines(path: Path, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (lines := [json.loads(x) for x in path.read_text().splitlines() if x.strip()]):
            return lines
        time.sleep(0.5)
    return []


def _capture(ctx: Context, name: str, flags: list[str]) -> dict:
    out_file = Path(ctx.tmpdir) / f"{name}.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY (\d+)", timeout=300).group(1))
    tracer = ctx.spawn([*TOOL, "trace", *flags, "-e", "*sys_bpf", "-a", "array_map_alloc_check", "-A",
                        "--otlp-endpoint", f"http://127.0.0.1:{port}"])
    result: dict = {}
    try:
        tracer.wait_for_line(r"Receiving data", timeout=400)
        ctx.log(f"{name}: tracing, running the failing call")
        result["simfail_rc"] = ctx.run([*TOOL, "simfail", "bpf-bad-map-max-entries-array"], 300)[0]
        tracer.wait_for_line(r"array_map_alloc_check", timeout=300)
        result["otlp"] = _lines(out_file, 180)
    finally:
        result["tracer_rc"] = tracer.terminate(timeout=300)
        result["tracer_output"] = tracer.output()
        receiver.terminate(timeout=60)
    return result


@budget(1500)
def scenario_arm64_smoke(ctx: Context) -> dict:
    result: dict = {"machine": platform.machine(), "package": str(Path(retsnoop_otel.__file__).parent)}
    result["features"] = ctx.run([*TOOL, "features", "--json"], timeout=400)
    result["default"] = _capture(ctx, "default", [])
    result["fentry"] = _capture(ctx, "fentry", ["-F"])
    result["progs_after"] = [p.get("name", "") for p in ctx.bpf_prog_ids()]
    return result

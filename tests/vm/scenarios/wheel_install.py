"""Guest side of the installed package: the wheel `make wheel` built, installed into a clean venv in the guest (no
build step: `--only-binary :all:` from dist/ and its dependencies in dist/deps), capturing a failing bpf() call and
exporting it over OTLP, with nothing of this checkout on its path."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.otlp_json import wait_requests
from tests.vm.guest_batch import Context

REPO = Path(__file__).resolve().parents[3]
PY = sys.executable


def scenario_wheel_install(ctx: Context) -> dict:
    wheels = sorted((REPO / "dist").glob("retsnoop_otel-*-manylinux_*.whl"))
    if len(wheels) != 1 or not (REPO / "dist" / "deps").is_dir():
        return {"error": f"dist/ holds {[w.name for w in wheels]} and no single wheel with dist/deps: run make wheel"}
    venv = Path(ctx.tmpdir) / "venv"
    result: dict = {"wheel": wheels[0].name}
    result["venv"] = ctx.run([PY, "-m", "venv", "--without-pip", str(venv)], timeout=300)
    result["install"] = ctx.run([PY, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index",
                                 "--only-binary", ":all:", "--find-links", str(REPO / "dist" / "deps"),
                                 str(wheels[0])], timeout=600)
    exe = str(venv / "bin" / "retsnoop-otel")
    result["version"] = ctx.run([exe, "-V"], timeout=120)
    result["module"] = ctx.run([str(venv / "bin" / "python"), "-I", "-c",  # -I: not this checkout (the cwd)
                                "import retsnoop_otel.kernel.libbpf as lb; print(lb.library_path())"], timeout=120)
    out_file = Path(ctx.tmpdir) / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=240).group(1))  # the default: OTLP/HTTP
    tracer = ctx.spawn([exe, "trace", "-e", "*sys_bpf", "-a", "array_map_alloc_check",
                        "--otlp-endpoint", f"http://127.0.0.1:{port}"])
    try:
        tracer.wait_for_line(r"Receiving data", timeout=300)
        result["simfail_rc"] = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 120)[0]
        tracer.wait_for_line(r"array_map_alloc_check", timeout=120)
        result["otlp"] = wait_requests(out_file, 120)
    finally:
        result["tracer_rc"] = tracer.terminate(timeout=240)
        result["tracer_output"] = tracer.output()
        receiver.terminate(timeout=30)
    result["progs_after"] = [p.get("name", "") for p in ctx.bpf_prog_ids()]
    return result

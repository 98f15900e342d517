"""Guest side of the arm64 smoke: Debian's arm64 kernel under emulation, a Debian arm64 root, and the package from
the aarch64 wheel (build/arm64-site, before this checkout on PYTHONPATH). The features report, then a failing
bpf() call captured in stack mode with argument capture (registers read through arm64's pt_regs) and exported
over OTLP to a real receiver, once in the default attach mode and once with fentry (-F); then the same call made
by C writers that publish OTel thread context (tests/native/ctx_writer.c, built here with the root's gcc), with the
variable in the executable and in a TLSDESC library: their sessions must join the writers' traces (TLS variant I:
the thread pointer is TPIDR_EL0, static TLS lies above it)."""

from __future__ import annotations

import base64
import platform
import sys
import time
from pathlib import Path

import retsnoop_otel
from tests.otlp_json import wait_requests
from tests.vm.guest_batch import Context, budget

PY = sys.executable
TOOL = [PY, "-m", "retsnoop_otel"]


def _capture(ctx: Context, name: str, flags: list[str]) -> dict:
    out_file = Path(ctx.tmpdir) / f"{name}.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY (\d+)", timeout=300).group(1))
    tracer = ctx.spawn([*TOOL, "trace", *flags, "-e", "*sys_bpf", "-a", "array_map_alloc_check", "-A",
                        "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", "grpc"])
    result: dict = {}
    try:
        tracer.wait_for_line(r"Receiving data", timeout=400)
        ctx.log(f"{name}: tracing, running the failing call")
        result["simfail_rc"] = ctx.run([*TOOL, "simfail", "bpf-bad-map-max-entries-array"], 300)[0]
        tracer.wait_for_line(r"array_map_alloc_check", timeout=300)
        result["otlp"] = wait_requests(out_file, 180)
    finally:
        result["tracer_rc"] = tracer.terminate(timeout=300)
        result["tracer_output"] = tracer.output()
        receiver.terminate(timeout=60)
    return result


def _build_writers(ctx: Context, out: Path) -> dict[str, str]:
    src = Path(ctx.cwd) / "tests" / "native"
    cc = ["gcc", "-O1", "-Wall"]
    steps = [  # aarch64's default TLS dialect is TLSDESC (x86-64 needs -mtls-dialect=gnu2 for it)
        [*cc, "-shared", "-fPIC", "-o", str(out / "libctxlib.so"), str(src / "ctxlib.c")],
        [*cc, "-rdynamic", "-o", str(out / "writer_exe"), str(src / "ctx_writer.c"), "-lpthread", "-ldl"],
        [*cc, "-DCTX_LIB", "-o", str(out / "writer_lib"), str(src / "ctx_writer.c"), f"-L{out}", "-lctxlib",
         f"-Wl,-rpath,{out}", "-lpthread", "-ldl"],
    ]
    for cmd in steps:
        rc, _, err = ctx.run(cmd, timeout=600)
        if rc != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {err[-2000:]}")
    return {"exe": str(out / "writer_exe"), "lib": str(out / "writer_lib")}


def _app_context(ctx: Context) -> dict:
    """Writers running before the tracer starts; rounds until both writers' sessions are in their traces."""
    out = Path(ctx.tmpdir)
    bins = _build_writers(ctx, out)
    out_file = out / "app.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--out", str(out_file)])
    port = int(receiver.wait_for_line(r"READY (\d+)", timeout=300).group(1))
    writers = {name: ctx.spawn([path, "valid", "1", "bpf"], stdin=True) for name, path in bins.items()}
    for w in writers.values():
        w.wait_for_line(r"^ready pid=", timeout=300)
    tracer = ctx.spawn([*TOOL, "trace", "-e", "*sys_bpf", "-a", "array_map_alloc_check",
                        "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", "grpc"])
    result: dict = {"rounds": {name: [] for name in writers}}
    try:
        tracer.wait_for_line(r"Receiving data", timeout=400)
        for n in range(1, 9):  # the processes running at start are looked at in the background
            for name, w in writers.items():
                w.send("go")
                w.wait_for_line(rf"^done {n}$", timeout=300)
                result["rounds"][name] += [x for x in w.output().splitlines() if x.startswith(f"round {n} ")]
            time.sleep(4)
            text = out_file.read_text() if out_file.exists() else ""
            traces = [line.split("trace=")[1][:32] for lines in result["rounds"].values() for line in lines]
            if all(_b64_trace(t) in text for t in traces[-len(writers):]):
                break
        result["otlp"] = wait_requests(out_file, 60)
    finally:
        result["tracer_rc"] = tracer.terminate(timeout=300)
        result["tracer_output"] = tracer.output()[-20000:]
        for w in writers.values():
            w.terminate(timeout=30)
        receiver.terminate(timeout=60)
    return result


def _b64_trace(hex_id: str) -> str:
    """A trace id as the receiver's JSON lines hold it (protobuf JSON mapping: base64)."""
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


@budget(600)
def scenario_arm64_smoke(ctx: Context) -> dict:
    result: dict = {"machine": platform.machine(), "package": str(Path(retsnoop_otel.__file__).parent)}
    result["features"] = ctx.run([*TOOL, "features", "--json"], timeout=400)
    result["default"] = _capture(ctx, "default", [])
    result["fentry"] = _capture(ctx, "fentry", ["-F"])
    result["app_context"] = _app_context(ctx)
    result["progs_after"] = [p.get("name", "") for p in ctx.bpf_prog_ids()]
    return result

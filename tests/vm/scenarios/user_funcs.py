"""Guest side of issue 35 points 1-2: an application function and the kernel chain under it in one session.

tests/native/user_app.c's handle_request() checks its input in parse_request(), then makes a bpf() call the
kernel refuses with EINVAL in array_map_alloc_check(), and returns -errno. Traced with handle_request as the entry
(a uprobe) and the syscall's kernel functions as allowed ones:
- run `calls`: -T -E text (the calls table and the stack) and OTLP spans at a real receiver over HTTP, with the
  syscall's exit tracepoint injected (-J): it fires after the syscall returned, inside handle_request's session;
- run `json`: --json;
- `dry_run`: the user attach mode the kernel gets, said in --dry-run (5.10: the refusal, no BPF cookies).
Host-side assertions: tests/vm/test_user_funcs.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.vm.guest_batch import budget
from tests.vm.traced_run import traced_run

PY = sys.executable
ROUNDS = 2


def build(ctx, out: Path) -> str:
    app = out / "user_app"
    rc, _, err = ctx.run(["gcc", "-O1", "-g", "-Wall", "-o", str(app),
                          str(Path(ctx.cwd) / "tests" / "native" / "user_app.c")], timeout=600)
    if rc != 0:
        raise RuntimeError(f"gcc failed: {err[-2000:]}")
    return str(app)


def globs(app: str) -> list[str]:
    return ["-e", f"u:{app}:handle_request", "-a", f"u:{app}:parse_request", "-a", f"u:{app}:find_handler=null",
            "-a", "__x64_sys_bpf", "-a", "__sys_bpf", "-a", "map_create", "-a", "array_map_alloc_check"]


def _run(ctx, app: str, extra: list[str]) -> dict:
    return traced_run(ctx, [PY, "-m", "retsnoop_otel", "trace", *globs(app), "-v", *extra], [app, str(ROUNDS), "300"],
                      r"array_map_alloc_check", start_timeout=600, wait_timeout=300, workload_timeout=300,
                      progs_while_attached=True)


@budget(400)
def scenario_user_funcs(ctx) -> dict:
    tmp = Path(ctx.tmpdir)
    app = build(ctx, tmp)
    r: dict = {"app_path": app}
    rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "trace", *globs(app), "--dry-run", "-v"], timeout=600)
    r["dry_run"] = {"rc": rc, "out": out, "err": err}
    if rc != 0:  # a kernel without what user functions need: the refusal is the result
        return r
    out_file = tmp / "otlp.jsonl"
    receiver = ctx.spawn([PY, "-m", "tests.otlp_receiver", "--port", "0", "--http-port", "0", "--out", str(out_file)])
    try:
        port = int(receiver.wait_for_line(r"READY \d+ HTTP (\d+)", timeout=300).group(1))
        r["calls"] = _run(ctx, app, ["-T", "-E", "-J", "tp:syscalls:sys_exit_bpf",
                                     "--otlp-endpoint", f"http://127.0.0.1:{port}"])
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (out_file.exists() and out_file.read_text().strip()):
            time.sleep(1)
        r["otlp"] = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip()] \
            if out_file.exists() else []
    finally:
        receiver.terminate(timeout=30)
    r["json"] = _run(ctx, app, ["--json"])
    return r

"""Issue 3's headline capture: `-e '*sys_bpf' -a ':kernel/bpf/*.c'` with source lines and inlines.

On 6.1 the guest has the kernel's DWARF vmlinux (RETSNOOP_OTEL_VMLINUX): source-path globs
resolve through it and stacks carry kernel-tree file:line and inlined frames. On 6.12 there is no
DWARF: the same failures are captured with a name-glob function set, kallsyms names only.
"""

from __future__ import annotations

import sys

from tests.vm.guest_batch import budget
from tests.vm.traced_run import our_progs

PY = sys.executable
CASES = ("bpf-bad-map-val-size-percpu-array", "bpf-bad-map-max-entries-array")


@budget(1500)
def scenario_dwarf_stack(ctx) -> dict:
    if ctx.vmlinux:
        cmd = ["-e", "*sys_bpf", "-a", ":kernel/bpf/*.c", "-k", ctx.vmlinux]
    else:
        cmd = ["-e", "*sys_bpf", "-a", "array_map_alloc_check", "-a", "map_create", "-a", "array_map_alloc"]
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "trace", *cmd, "-v"])
    result: dict = {"cmd": cmd, "cases": {}}
    try:
        tracer.wait_for_line(r"Receiving data", timeout=900)
        for case in CASES:
            rc, out, err = ctx.run([PY, "-m", "retsnoop_otel", "simfail", case], 120)
            result["cases"][case] = {"rc": rc, "out": out + err}
            tracer.wait_for_line(r"array_map_alloc_check", timeout=300)
            tracer.wait_output_settled(5, timeout=300)
    finally:
        result["rc"] = tracer.terminate(timeout=900)
        result["output"] = tracer.output()
    result["progs_after"] = our_progs(ctx)
    return result


def _one_capture(ctx, args: list[str]) -> dict:
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "trace", "-e", "*sys_bpf", "-a", "map_create", "-a",
                        "array_map_alloc_check", *args])
    out: dict = {"args": args}
    try:
        tracer.wait_for_line(r"Receiving data", timeout=900)
        rc, _, _ = ctx.run([PY, "-m", "retsnoop_otel", "simfail", "bpf-bad-map-max-entries-array"], 120)
        out["simfail_rc"] = rc
        tracer.wait_for_line(r"array_map_alloc_check", timeout=300)
        tracer.wait_output_settled(5, timeout=300)
    finally:
        out["rc"] = tracer.terminate(timeout=600)
        out["output"] = tracer.output()
    return out


def scenario_dwarf_levels(ctx) -> dict:
    """-s (file:line, no inlined frames) and -sn (no DWARF at all) with the kernel's DWARF at hand (6.1)."""
    if not ctx.vmlinux:
        return {"vmlinux": None}
    return {"vmlinux": ctx.vmlinux, "s": _one_capture(ctx, ["-k", ctx.vmlinux, "-s"]),
            "sn": _one_capture(ctx, ["-k", ctx.vmlinux, "-sn"])}

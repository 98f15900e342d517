"""Guest side of the trace command's other end-to-end checks (issue 2): --dry-run and the kernel cache, -T and -A.

Runs inside the VM (tests/vm/guest_batch.py calls every scenario_* function); the host-side
assertions live in tests/vm/test_trace_e2e.py. The capture in each attach mode: trace_modes.py.
"""

from __future__ import annotations

import json

from tests.vm.scenarios.kernel_cache_moves import as_if_cached_at_another_boot, symbols_as_read
from tests.vm.scenarios.trace_modes import PY, trace_mode
from tests.vm.traced_run import our_progs


def scenario_trace_dry_run(ctx) -> dict:
    """--dry-run -v: what would be attached and why the rest is skipped; nothing is loaded.

    Run three times over one kernel cache directory: empty (the kernel is read and the cache filled),
    again (kallsyms, available_filter_functions and BTF come from the cache), and after loading a
    module (the symbols are read again; BTF and the feature answers, which belong to the kernel build, still come
    cached).
    The second run lists each module Python imports (-X importtime, on its standard error): a warm start's."""
    before = our_progs(ctx)
    cmd = [PY, "-m", "retsnoop_otel", "trace", "--dry-run", "-v", "-e", "*sys_bpf", "-a", "array_map_*",
           "-d", "array_map_free"]
    env = f"RETSNOOP_OTEL_CACHE={ctx.tmpdir}/cache"
    runs = []
    for step in ("cold", "warm", "module", "reloaded", "another boot"):
        extra: dict = {}
        if step == "module":
            mod_rc, _, mod_err = ctx.run("modprobe dummy", 60)
            if mod_rc != 0:
                runs.append({"step": step, "skipped": mod_err})
                break
        if step == "reloaded":  # dummy again, above a module loaded meanwhile: the same set, dummy elsewhere
            was = _module_base("dummy")
            mod_rc, _, mod_err = ctx.run("rmmod dummy && modprobe ifb && modprobe dummy && rmmod ifb", 60)
            extra = {"dummy_moved_by": _module_base("dummy") - was, "reload_rc": mod_rc, "reload_err": mod_err}
        if step == "another boot":
            extra = {"rewritten": as_if_cached_at_another_boot(f"{ctx.tmpdir}/cache")}
        step_env = f"{env} PYTHONPROFILEIMPORTTIME=1" if step == "warm" else env
        rc, out, err = ctx.run(f"{step_env} {' '.join(repr(c) if '*' in c else c for c in cmd)}", 300)
        runs.append({"step": step, "rc": rc, "out": out, "err": err, **extra,
                     **symbols_as_read(f"{ctx.tmpdir}/cache")})
    ctx.run("rmmod dummy", 60)
    # a first start on one CPU (pinned): the symbols are not read beside the imports, the run reads them itself
    one = f"RETSNOOP_OTEL_CACHE={ctx.tmpdir}/cache-one-cpu"
    rc, out, err = ctx.run(f"{one} taskset -c 0 {' '.join(repr(c) if '*' in c else c for c in cmd)}", 300)
    runs.append({"step": "one cpu", "rc": rc, "out": out, "err": err, **symbols_as_read(f"{ctx.tmpdir}/cache-one-cpu")})
    # retsnoop's presets (-c) resolve on this kernel: both cases' entry functions found, nothing loaded
    rc, out, err = ctx.run(f"{env} {PY} -m retsnoop_otel trace --dry-run -c bpf -c perf", 300)
    runs.append({"step": "cases", "rc": rc, "out": out, "err": err})
    first = runs[0]
    return {"rc": first["rc"], "out": first["out"], "err": first["err"], "runs": runs, "progs_before": before,
            "progs_after": our_progs(ctx)}


def _module_base(name: str) -> int:
    for line in open("/proc/modules").read().splitlines():
        f = line.split()
        if f[0] == name:
            return int(f[5], 16)
    return 0


def scenario_trace_calls_args(ctx) -> dict:
    """-T table and -A arguments for the max-entries failure; -T JSON for Perfetto. Then again with retsnoop's
    args.fmt-mode=multiline and stacks.emit-addrs (the stack under the table, -E, shows the addresses)."""
    out = {}
    trace_json = f"{ctx.tmpdir}/trace.json"
    out.update(trace_mode(ctx, "-v", "bpf-bad-map-max-entries-array",
                           ["-a", "map_create", "-T", "-A", "--trace-json", trace_json]))
    try:
        with open(trace_json) as fh:
            out["trace_json"] = json.load(fh)
    except OSError as exc:
        out["trace_json_error"] = str(exc)
    out["multiline"] = trace_mode(ctx, "-v", "bpf-bad-map-max-entries-array",
                                   ["-a", "map_create", "-T", "-A", "-E", "-C", "args.fmt-mode=multiline",
                                    "-C", "stacks.emit-addrs=true"])
    return out

"""Guest side of the trace command's other end-to-end checks (issue 2): --dry-run and the kernel cache, -T and -A.

Runs inside the VM (tests/vm/guest_batch.py calls every scenario_* function); the host-side
assertions live in tests/vm/test_trace_e2e.py. The capture in each attach mode: trace_modes.py.
"""

from __future__ import annotations

import json

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
            extra = {"rewritten": _as_if_cached_at_another_boot(f"{ctx.tmpdir}/cache")}
        step_env = f"{env} PYTHONPROFILEIMPORTTIME=1" if step == "warm" else env
        rc, out, err = ctx.run(f"{step_env} {' '.join(repr(c) if '*' in c else c for c in cmd)}", 300)
        runs.append({"step": step, "rc": rc, "out": out, "err": err, **extra,
                     **_symbols_as_read(f"{ctx.tmpdir}/cache")})
    ctx.run("rmmod dummy", 60)
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


def _symbols_as_read(cache_dir: str) -> dict:
    """The symbols the cache holds now (what the run before left there) against kallsyms read whole."""
    from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
    from retsnoop_otel.symbols.kallsyms import Kallsyms
    from retsnoop_otel.symbols.kernel_facts import load_symbols
    cached, _, source = load_symbols(KernelCache.at(cache_dir), kernel_identity())
    have, want = list(cached.items()), list(Kallsyms.load(stable=True).items())
    differ = [(hex(a[0]), a[1], a[2], hex(b[0]), b[1], b[2]) for a, b in zip(have, want, strict=False) if a != b]
    return {"symbols_source": source, "symbols_same": have == want, "symbols_count": len(want),
            "symbols_differ": differ[:5], "symbols_modules": sorted({m for _, _, m in want if m})}


CORE_SHIFT, MODULE_SHIFT = 0x4000000, 0x10000


def _as_if_cached_at_another_boot(cache_dir: str) -> dict:
    """Rewrite this boot's cache entry of symbols as another boot would have left it: another boot id, the
    kernel's text 64 MB lower (KASLR) and every module 64 kB lower, with the layout saying so."""
    from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
    from retsnoop_otel.symbols.kallsyms import Kallsyms
    ident, cache = kernel_identity(), KernelCache.at(cache_dir)
    name = f"symbols-{ident.build_id}"
    key, (ksyms, available, layout) = cache.read_keyed(name)  # type: ignore[misc]
    tables = Kallsyms.from_state(ksyms)
    mods = {m for _, _, m in tables.items() if m}
    moved = tables.moved({"": -CORE_SHIFT, **{m: -MODULE_SHIFT for m in mods}})
    layout_key, (text, anchor), bases = layout
    bases = {m: (base - MODULE_SHIFT, bid) for m, (base, bid) in bases.items()}
    cache.write(name, key.replace(ident.boot_id, "another-boot"),
                (moved.state(), available, (layout_key, (text - CORE_SHIFT, anchor), bases)))  # type: ignore[union-attr]
    return {"anchor": anchor, "modules": sorted(bases), "build_ids": sorted(b for _, b in bases.values() if b)}


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

"""Guest side of the kernel cache's move to another boot, on every kernel: the symbols cached in this boot, the entry
rewritten as another boot would have left it (another boot id, the kernel's text and every module lower), then
loaded: moved, not read, and equal to kallsyms read whole. Host-side assertions: tests/vm/test_kernel_cache_moves.py;
the same through the trace command on the newest kernel (a module reloaded elsewhere too): trace_e2e.py.
"""

from __future__ import annotations


def scenario_kernel_cache_moves(ctx) -> dict:
    from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
    from retsnoop_otel.symbols.kernel_facts import load_symbols
    cache_dir = f"{ctx.tmpdir}/kcache"
    had_dummy = _loaded("dummy")
    rc, _, err = ctx.run("modprobe dummy", 60)  # at least one module, whatever the scenarios before loaded
    try:
        _, _, first = load_symbols(KernelCache.at(cache_dir), kernel_identity())
        rewritten = as_if_cached_at_another_boot(cache_dir)
        return {"first": first, "rewritten": rewritten, **symbols_as_read(cache_dir), "modprobe": [rc, err],
                "modules_loaded": sorted(_modules())}
    finally:
        if not had_dummy:
            ctx.run("rmmod dummy", 60)


def _modules() -> set[str]:
    return {line.split()[0] for line in open("/proc/modules").read().splitlines()}


def _loaded(name: str) -> bool:
    return name in _modules()


def symbols_as_read(cache_dir: str) -> dict:
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


def as_if_cached_at_another_boot(cache_dir: str) -> dict:
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

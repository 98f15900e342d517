"""kallsyms parsing and lookups, on the fixture tree and (when readable) on the host's real file."""

from __future__ import annotations

import bisect
import random
from pathlib import Path

import pytest

from retsnoop_otel.symbols.kallsyms import Kallsyms, KallsymsError, KSym

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ROOT = FIXTURES / "kernel_root"


@pytest.fixture(scope="module")
def ksyms() -> Kallsyms:
    return Kallsyms.load(str(ROOT))


def _fixture_functions() -> list[tuple[int, str, str | None]]:
    out = []
    for line in (ROOT / "proc/kallsyms").read_text().splitlines():
        parts = line.split()
        if parts[1] in "tTwW":
            out.append((int(parts[0], 16), parts[2], parts[3][1:-1] if len(parts) > 3 else None))
    return sorted(out)


def test_keeps_only_code_symbols(ksyms: Kallsyms) -> None:
    assert len(ksyms) == len(_fixture_functions()) == 47
    assert ksyms.by_name("init_task") == []  # D
    assert ksyms.by_name("nf_tables_net_ops") == []  # d, in a module
    assert [s.name for s in ksyms.by_name("bpf_jit_supports_kfunc_call")] == ["bpf_jit_supports_kfunc_call"]  # W


def test_lookup_name_offset_and_size(ksyms: Kallsyms) -> None:
    assert ksyms.lookup(0xFFFFFFFF81001010 + 0x35) == KSym("do_syscall_64", 0xFFFFFFFF81001010, 0x35, None, 0x280)
    assert ksyms.lookup(0xFFFFFFFF81001010).offset == 0
    # the byte before a function belongs to the one before it (here its call padding symbol)
    assert ksyms.lookup(0xFFFFFFFF8100100F).name == "__pfx_do_syscall_64"
    assert ksyms.lookup(0xFFFFFFFF80FFFFFF) is None
    assert ksyms.lookup(0) is None


def test_modules_are_sorted_into_place(ksyms: Kallsyms) -> None:
    """Module symbols follow vmlinux in load order; lookups still find them by address."""
    sym = ksyms.lookup(0xFFFFFFFFC0400810)
    # its size runs to the next module's first function, which kallsyms listed before it
    assert (sym.name, sym.offset, sym.module) == ("show_stat", 0x10, "kvm")
    assert sym.size == 0xFFFFFFFFC0A01000 - 0xFFFFFFFFC0400800
    assert ksyms.lookup(0xFFFFFFFFA0002040).name == "bpf_trampoline_6442491234"
    last = ksyms.lookup(0xFFFFFFFFC0A02000 + 0x999)
    assert (last.name, last.module, last.size) == ("nft_bpf_helper", "nf_tables", 0)


def test_lookup_matches_linear_scan(ksyms: Kallsyms) -> None:
    funcs = _fixture_functions()
    rng = random.Random(7)
    lo, hi = funcs[0][0] - 64, funcs[-1][0] + 64
    for a in [rng.randrange(lo, hi) for _ in range(2000)] + [f[0] for f in funcs]:
        below = [f for f in funcs if f[0] <= a]
        got = ksyms.lookup(a)
        if not below:
            assert got is None
            continue
        start = below[-1][0]
        assert got is not None and got.addr == start and got.offset == a - start
        assert got.name in {f[1] for f in funcs if f[0] == start}


def test_by_name_lists_every_instance(ksyms: Kallsyms) -> None:
    inst = ksyms.by_name("show_stat")
    assert [(s.addr, s.module) for s in inst] == [(0xFFFFFFFF81030000, None), (0xFFFFFFFF81230000, None),
                                                  (0xFFFFFFFFC0400800, "kvm")]
    assert all(s.size > 0 and s.offset == 0 for s in inst)
    assert ksyms.by_name("map_check_btf") == []  # only its .isra.0 / .cold parts exist
    assert "map_check_btf.isra.0" in ksyms and "init_task" not in ksyms


def test_stext(ksyms: Kallsyms) -> None:
    assert ksyms.stext == 0xFFFFFFFF81000000


def test_zero_addresses_name_the_fix() -> None:
    with pytest.raises(KallsymsError) as exc:
        Kallsyms.load(str(FIXTURES / "kptr_restricted"))
    assert "kptr_restrict" in str(exc.value) and "root" in str(exc.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KallsymsError, match="cannot read .*kallsyms"):
        Kallsyms.load(str(tmp_path))


def test_unpadded_addresses_sort_numerically() -> None:
    ks = Kallsyms.parse("ffff0000 T big\n10 t small\n9 t smaller\n")
    assert ks.lookup(0xF).name == "smaller" and ks.lookup(0x10).name == "small"
    assert ks.lookup(0xFFFF0001) == KSym("big", 0xFFFF0000, 1, None, 0)


def test_real_kallsyms() -> None:
    """The host's own /proc/kallsyms: every function found by name is found again by address."""
    try:
        ks = Kallsyms.load("/")
    except KallsymsError as exc:
        pytest.skip(f"host kallsyms unusable here: {exc}")
    assert len(ks) > 10_000
    stext = ks.stext
    assert stext is not None and ks.lookup(stext).addr == stext
    for name in ("do_syscall_64", "schedule", "vfs_read"):
        for sym in ks.by_name(name):
            assert ks.lookup(sym.addr + 1).addr == sym.addr


def test_built_from_items_it_keeps_every_symbol(ksyms: Kallsyms) -> None:
    again = Kallsyms(list(ksyms.items()))
    assert list(again.items()) == list(ksyms.items()) and again.by_name("bpf_trampoline_6442491234")
    assert again.lookup(0xFFFFFFFFC0400810) == ksyms.lookup(0xFFFFFFFFC0400810)


def test_state_round_trip_and_other_layouts(ksyms: Kallsyms) -> None:
    """What the kernel cache stores gives the same answers; a state of another layout is refused (a miss)."""
    back = Kallsyms.from_state(ksyms.state())
    assert list(back.items()) == list(ksyms.items()) and len(back) == 47
    assert back.by_name("show_stat") == ksyms.by_name("show_stat") and back.lookup(0xFFFFFFFFC0400810).module == "kvm"
    old_layout = (16, [("ffffffff81000000", "_stext", "")], {"_stext": 0}, {}, "\n_stext\n")
    for bad in (old_layout, ("kallsyms-columns-0", *ksyms.state()[1:])):
        with pytest.raises((ValueError, TypeError)):
            Kallsyms.from_state(bad)


def test_bpf_symbols_come_and_go(ksyms: Kallsyms) -> None:
    ks = Kallsyms.from_state(Kallsyms.load(str(ROOT), stable=True).state())
    base = list(ks.items())
    trampoline = "ffffffffa0002000 t bpf_trampoline_9\t[bpf]\n"
    assert ks.sync_bpf_symbols("ffffffffa0001000 t bpf_prog_abc_x\t[bpf]\n" + trampoline) == 2 and ks.generation == 1
    assert ks.lookup(0xFFFFFFFFA0001010)[:2] == ("bpf_prog_abc_x", 0xFFFFFFFFA0001000)
    assert ks.lookup(0xFFFFFFFFA0001010).module == "bpf" and ks.by_name("bpf_trampoline_9")[0].module == "bpf"
    assert ks.sync_bpf_symbols(trampoline) == 0 and ks.generation == 2
    assert ks.by_name("bpf_prog_abc_x") == [] and len(ks) == len(base) + 1
    ks.sync_bpf_symbols("")
    assert list(ks.items()) == base


def test_stable_leaves_out_what_comes_and_goes_without_a_module_load(ksyms: Kallsyms) -> None:
    stable = Kallsyms.load(str(ROOT), stable=True)
    gone = {name for _, name, mod in ksyms.items() if mod == "bpf" or mod.startswith("__builtin__")}
    assert len(gone) == 4 and len(stable) == len(ksyms) - 4
    assert not any(name in stable for name in gone) and all(name in ksyms for name in gone)
    assert list(stable.items()) == [it for it in ksyms.items() if it[1] not in gone]


def test_bpf_symbols_land_in_address_order_among_every_module(ksyms: Kallsyms) -> None:
    stable = Kallsyms.load(str(ROOT), stable=True)
    items = list(stable.items())
    rng = random.Random(5)
    addrs = sorted({rng.randrange(items[0][0] - 64, items[-1][0] + 64) for _ in range(40)})
    text = "".join(f"{a:016x} t bpf_prog_{i}\t[bpf]\n" for i, a in enumerate(addrs))
    assert stable.sync_bpf_symbols(text) == len(addrs)
    assert list(stable.items()) == sorted(items + [(a, f"bpf_prog_{i}", "bpf") for i, a in enumerate(addrs)])
    assert [s.name for s in stable.by_name("bpf_prog_3")] == ["bpf_prog_3"] and "show_stat" in stable
    every = list(stable.items())  # by address; at one address the [bpf] symbol last, as they were merged
    every.sort(key=lambda it: (it[0], it[2] == "bpf"))
    starts = [a for a, _, _ in every]
    for target in [*addrs, *(a + 1 for a in addrs), *(a - 1 for a in addrs), *(a for a, _, _ in items[::7])]:
        i = bisect.bisect_right(starts, target) - 1
        want = None if i < 0 else KSym(every[i][1], starts[i], target - starts[i], every[i][2] or None,
                                       starts[i + 1] - starts[i] if i + 1 < len(every) else 0)
        assert stable.lookup(target) == want, hex(target)

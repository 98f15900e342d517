"""tracefs reading, glob parsing and function discovery against the fixture kernel tree."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.kernel import tracefs
from retsnoop_otel.symbols.discovery import (
    BUILTIN_DENY,
    Discovery,
    DiscoveryError,
    GlobSpec,
    discover,
    expand_glob_args,
    format_dry_run,
    parse_glob,
)
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.names import SEARCHES_BEFORE_INDEX, SearchThenIndex
from retsnoop_otel.symbols.traceable import Traceable

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ROOT = FIXTURES / "kernel_root"
RET = {"__x64_sys_bpf": RetKind.SIGNED, "bpf_map_alloc_percpu": RetKind.POINTER, "bpf_ksym_add": RetKind.VOID}


@pytest.fixture(scope="module")
def ksyms() -> Kallsyms:
    return Kallsyms.load(str(ROOT))


@pytest.fixture(scope="module")
def available() -> Traceable:
    return Traceable.load(str(ROOT))


def run(ksyms, available, entry, allow=(), deny=(), mode="fentry", **kw) -> Discovery:
    return discover(list(entry), list(allow), list(deny), ksyms, available, lambda n: RET.get(n, RetKind.INT32),
                    mode, **kw)


def names(d: Discovery) -> list[str]:
    return [f.name for f in d.funcs]


# ---- tracefs --------------------------------------------------------------------------------------


def test_find_tracefs_prefers_native_mount() -> None:
    assert tracefs.find_tracefs(str(ROOT)) == ROOT / "sys/kernel/tracing"
    legacy = FIXTURES / "debugfs_root"
    assert tracefs.find_tracefs(str(legacy)) == legacy / "sys/kernel/debug/tracing"
    assert tracefs.read_available_filter_functions(str(legacy)) == [("do_syscall_64", None), ("kvm_vcpu_ioctl", "kvm")]


def test_tracefs_not_mounted(tmp_path: Path) -> None:
    with pytest.raises(tracefs.TracefsError, match="mount -t tracefs"):
        tracefs.read_available_filter_functions(str(tmp_path))


def test_available_filter_functions_parsing(available: Traceable) -> None:
    pairs = tracefs.read_available_filter_functions(str(ROOT))
    assert not any(name.startswith("__ftrace_invalid_address__") for name, _ in pairs)
    assert ("show_stat", "kvm") in pairs and ("nft_bpf_helper", "nf_tables") in pairs
    assert pairs.count(("show_stat", None)) == 2
    assert len(pairs) == len(available) == 24
    assert available.count("show_stat") == 3 and "nft_bpf_helper" in available and "init_task" not in available


def test_name_lookups_by_binary_search_agree_with_a_scan() -> None:
    names = [f"f{i % 50}" for i in range(400)] + ["solo", "x.isra.0", "f1.cold", "a"]
    ks = Kallsyms.parse("".join(f"ffffffff81{i:06x} T {n}\n" for i, n in enumerate(names)))
    ks = Kallsyms.from_state(ks.state())  # as the kernel cache gives it back
    tr = Traceable.from_state(Traceable(names + ["solo"]).state())
    asked = sorted({*names, "f", "x.isra", "zzz", "", "f1\nf2"})
    for name in asked * (SEARCHES_BEFORE_INDEX // len(asked) + 2):  # past the searches that build an index
        assert ks.positions(name) == [i for i, n in enumerate(names) if n == name], name
        assert tr.count(name) == names.count(name) + (name == "solo"), name
    assert ks.by_name("f1.cold")[0].addr == 0xFFFFFFFF81000000 + 402 and "x.isra.0" in tr and "f1" in ks


def test_lookups_search_until_the_index_pays_then_build_it_once() -> None:
    calls = {"search": 0, "index": 0}

    def search(name: str) -> int | None:
        calls["search"] += 1
        return len(name) if name != "missing" else None

    def index() -> dict[str, int]:
        calls["index"] += 1
        return {n: len(n) for n in ("a", "bb", "ccc")}

    lookup = SearchThenIndex(search, index)
    asked = ["a", "bb", "missing", "ccc"] * SEARCHES_BEFORE_INDEX
    assert [lookup.get(n) for n in asked] == [None if n == "missing" else len(n) for n in asked]
    assert calls == {"search": SEARCHES_BEFORE_INDEX, "index": 1}


@pytest.mark.parametrize("err, expect", [(errno.EPERM, "does not allow function tracing"),
                                         (errno.EACCES, "run retsnoop-otel as root")])
def test_refused_reads_give_one_sentence(monkeypatch: pytest.MonkeyPatch, err: int, expect: str) -> None:
    def refuse(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(err, "refused", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(tracefs.TracefsError) as exc:
        tracefs.read_available_filter_functions(str(ROOT))
    assert expect in str(exc.value) and "\n" not in str(exc.value)


# ---- globs ----------------------------------------------------------------------------------------


def test_parse_glob_forms() -> None:
    assert parse_glob("*sys_bpf") == GlobSpec("*sys_bpf", func="*sys_bpf")
    assert parse_glob("show_* [kv?]") == GlobSpec("show_* [kv?]", func="show_*", module="kv?")
    assert parse_glob(":kernel/bpf/*.c") == GlobSpec(":kernel/bpf/*.c", source="kernel/bpf/*.c")
    for bad in ("", "a b", "foo[1]", ":", "x [m] y"):
        with pytest.raises(DiscoveryError):
            parse_glob(bad)


def test_glob_files_expand_in_place(tmp_path: Path) -> None:
    f = tmp_path / "globs.txt"
    f.write_text("# bpf syscall side\nbpf_prog_load\n\n  array_map_* \n# end\n")
    assert expand_glob_args(["a", f"@{f}", "b"]) == ["a", "bpf_prog_load", "array_map_*", "b"]
    with pytest.raises(DiscoveryError, match="glob file"):
        expand_glob_args([f"@{tmp_path / 'missing'}"])


# ---- discovery ------------------------------------------------------------------------------------


def test_entry_first_ids_and_kernel_facts(ksyms, available) -> None:
    d = run(ksyms, available, ["*sys_bpf"], ["array_map_alloc*", "bpf_map_alloc_percpu"])
    assert names(d) == ["__sys_bpf", "__x64_sys_bpf", "array_map_alloc", "array_map_alloc_check",
                        "bpf_map_alloc_percpu"]
    assert [f.id for f in d.funcs] == [0, 1, 2, 3, 4]
    assert [f.is_entry for f in d.funcs] == [True, True, False, False, False]
    x64 = d.funcs[1]
    assert (x64.addr, x64.size, x64.ret, x64.module) == (0xFFFFFFFF81200000, 0x40, RetKind.SIGNED, None)
    assert d.funcs[4].ret is RetKind.POINTER
    assert ("__ia32_sys_bpf", "not in available_filter_functions") in d.skipped


def test_entry_glob_matching_nothing(ksyms, available) -> None:
    with pytest.raises(DiscoveryError) as exc:
        run(ksyms, available, ["*sys_bpf", "no_such_func*"])
    assert str(exc.value).startswith("Entry glob 'no_such_func*' doesn't match any kernel function!")


def test_deny_wins_over_entry_and_the_error_says_why(ksyms, available) -> None:
    with pytest.raises(DiscoveryError) as exc:
        run(ksyms, available, ["__*_sys_bpf"], deny=["__x64*"])
    msg = str(exc.value)
    assert "doesn't match any kernel function!" in msg
    assert "__x64_sys_bpf: denied by '__x64*'" in msg and "__ia32_sys_bpf: not in available_filter_functions" in msg


def test_entry_wins_over_allow_and_deny_over_allow(ksyms, available) -> None:
    d = run(ksyms, available, ["bpf_prog_load"], ["bpf_prog_*", "bpf_*ksym*"], deny=["bpf_ksym_add"])
    assert names(d) == ["bpf_prog_load", "bpf_prog_kallsyms_add"]
    assert d.funcs[0].is_entry and not d.funcs[1].is_entry
    assert ("bpf_ksym_add", "denied by 'bpf_ksym_add'") in d.skipped


def test_builtin_deny_list(ksyms, available) -> None:
    d = run(ksyms, available, ["__x64_sys_bpf"], ["rcu_read_lock_held", "htab_map_lookup_elem"])
    skipped = dict(d.skipped)
    assert skipped["rcu_read_lock_held"].startswith("built-in deny list: RCU")
    assert "own BPF programs" in skipped["htab_map_lookup_elem"]
    # a kprobe or fprobe there would fire inside our programs too (skipped by the kernel, but paid for)
    for mode in ("kprobe", "kprobe_multi", "kprobe_session"):
        d = run(ksyms, available, ["__x64_sys_bpf"], ["rcu_read_lock_held", "htab_map_lookup_elem"], mode=mode)
        assert names(d) == ["__x64_sys_bpf"] and "own BPF programs" in dict(d.skipped)["htab_map_lookup_elem"]
    assert all(g.reason and g.globs and g.modes is None for g in BUILTIN_DENY)


def test_what_our_programs_call_at_an_error_is_denied_in_every_mode() -> None:
    # the stack taken at the error runs the unwinder, which looks up the BPF programs and trampolines on
    # the stack (bpf_ksym_find fired 4 times per failing call under fentry); the session map is an LRU hash
    names_ = ["__x64_sys_bpf", "bpf_ksym_find", "is_bpf_text_address", "unwind_next_frame", "__kernel_text_address",
              "htab_lru_map_lookup_elem", "bpf_lru_pop_free", "bpf_prog_load"]
    ks = Kallsyms.parse("".join(f"ffffffff8100{i:04x} T {n}\n" for i, n in enumerate(names_)))
    for mode in ("fentry", "kprobe", "kprobe_multi", "kprobe_session"):
        d = run(ks, Traceable(names_), ["__x64_sys_bpf"], ["*"], mode=mode)
        assert names(d) == ["__x64_sys_bpf", "bpf_prog_load"], mode
        assert all("own BPF programs" in why for _, why in d.skipped)


def test_tracing_machinery_is_never_attached(ksyms, available) -> None:
    allow = ["*kretprobe*", "trace_call_bpf", "bpf_get_stack", "ftrace_trampoline"]
    d = run(ksyms, available, ["__x64_sys_bpf"], allow, mode="kprobe")
    assert names(d) == ["__x64_sys_bpf"]
    skipped = dict(d.skipped)
    for name in ("__kretprobe_trampoline", "__kretprobe_trampoline_handler", "kretprobe_dispatcher",
                 "kretprobe_perf_func", "trace_call_bpf", "ftrace_trampoline [__builtin__ftrace]"):
        assert skipped[name] == "built-in deny list: probe delivery machinery"
    assert "own BPF programs" in skipped["bpf_get_stack"]


def test_several_instances(ksyms, available) -> None:
    """show_stat: 3 in kallsyms (one in kvm) and 3 in tracefs; dup_mismatch: 2 vs 1."""
    d = run(ksyms, available, ["__x64_sys_bpf"], ["show_stat", "dup_mismatch"])
    skipped = dict(d.skipped)
    assert skipped["show_stat"].startswith("ambiguous instances (3 in kallsyms, 3 in available_filter_functions")
    assert skipped["dup_mismatch"].startswith("ambiguous instances (2 in kallsyms, 1 in")
    for mode in ("kprobe", "kprobe_multi"):
        d = run(ksyms, available, ["__x64_sys_bpf"], ["show_stat", "dup_mismatch"], mode=mode)
        got = [(f.name, f.addr, f.module) for f in d.funcs[1:]]
        assert got == [("dup_mismatch", 0xFFFFFFFF81030400, None), ("dup_mismatch", 0xFFFFFFFF81230400, None),
                       ("show_stat", 0xFFFFFFFF81030000, None), ("show_stat", 0xFFFFFFFF81230000, None),
                       ("show_stat", 0xFFFFFFFFC0400800, "kvm")]
        assert len({f.id for f in d.funcs}) == len(d.funcs)


def test_module_globs(ksyms, available) -> None:
    d = run(ksyms, available, ["__x64_sys_bpf"], ["* [nf_*]", "show_stat [kvm]"], mode="kprobe")
    assert [(f.name, f.module) for f in d.funcs[1:]] == [
        ("nf_tables_newrule", "nf_tables"), ("nft_bpf_helper", "nf_tables"), ("show_stat", "kvm")]
    # deny applies per instance: the module copy goes, the vmlinux ones stay
    d = run(ksyms, available, ["__x64_sys_bpf"], ["show_stat"], ["show_stat [kvm]"], mode="kprobe")
    assert [(f.name, f.module) for f in d.funcs[1:]] == [("show_stat", None), ("show_stat", None)]
    # a plain glob matches module functions too
    d = run(ksyms, available, ["kvm_vcpu_ioctl"], mode="kprobe")
    assert [(f.name, f.module, f.is_entry) for f in d.funcs] == [("kvm_vcpu_ioctl", "kvm", True)]
    # a module glob never matches vmlinux functions
    with pytest.raises(DiscoveryError, match="Entry glob 'do_syscall_64 \\[\\*\\]'"):
        run(ksyms, available, ["do_syscall_64 [*]"], mode="kprobe")
    for mode in ("fentry", "fsession", "fsession_multi"):  # by vmlinux BTF id: one instance per name, no modules
        d = run(ksyms, available, ["__x64_sys_bpf"], ["kvm_vcpu_ioctl [kvm]", "show_stat"], mode=mode)
        assert dict(d.skipped)["kvm_vcpu_ioctl [kvm]"] == \
            f"module function: {mode} mode attaches vmlinux functions only (use -K)"
        assert dict(d.skipped)["show_stat"].startswith("ambiguous instances (3 in kallsyms")


def test_compiler_suffixes_are_distinct_names(ksyms, available) -> None:
    d = run(ksyms, available, ["__x64_sys_bpf"], ["map_check_btf*", "bpf_obj_name_cpy", "__bpf_prog_put*"])
    assert names(d)[1:] == ["__bpf_prog_put.part.0", "map_check_btf.isra.0"]
    assert dict(d.skipped)["map_check_btf.cold"].startswith("cold part")
    assert "bpf_obj_name_cpy" not in dict(d.skipped)  # the exact glob matches no '.constprop.0' clone


def test_padding_symbols_and_tracefs_only_names(ksyms, available) -> None:
    d = run(ksyms, available, ["*do_syscall_64"], ["only_in_*", "*rcu_read_lock_held"], mode="kprobe")
    assert names(d) == ["do_syscall_64"]
    assert not any(name.startswith("__pfx_") for name, _ in d.skipped)
    assert ("only_in_aff", "not in kallsyms") in d.skipped


def test_source_globs(ksyms, available) -> None:
    seen = []

    def resolve(glob: str) -> set[str]:
        seen.append(glob)
        return {"__sys_bpf", "bpf_prog_load", "array_map_alloc", "bpf_notrace_thing", "nft_bpf_helper"}

    d = run(ksyms, available, ["__x64_sys_bpf"], [":kernel/bpf/*.c"], resolve_source_glob=resolve, mode="kprobe")
    assert seen == ["kernel/bpf/*.c"]
    assert names(d) == ["__x64_sys_bpf", "__sys_bpf", "array_map_alloc", "bpf_prog_load"]
    assert ("bpf_notrace_thing", "not in available_filter_functions") in d.skipped
    # a source entry glob: entry functions come from the DWARF index, and none matching is not fatal alone
    d = run(ksyms, available, [":kernel/bpf/syscall.c", "__x64_sys_bpf"], resolve_source_glob=lambda g: set())
    assert names(d) == ["__x64_sys_bpf"]
    with pytest.raises(DiscoveryError, match="no entry function"):
        run(ksyms, available, [":kernel/bpf/syscall.c"], resolve_source_glob=lambda g: set())
    with pytest.raises(DiscoveryError, match="DWARF"):
        run(ksyms, available, ["__x64_sys_bpf"], [":kernel/bpf/*.c"])


def test_glob_file_and_repeated_flags(ksyms, available, tmp_path: Path) -> None:
    f = tmp_path / "allow.txt"
    f.write_text("# verifier side\nbpf_prog_load\n")
    d = run(ksyms, available, ["__x64_sys_bpf"], expand_glob_args([f"@{f}", "bpf_ksym_add"]))
    assert names(d) == ["__x64_sys_bpf", "bpf_ksym_add", "bpf_prog_load"]


def test_a_file_named_twice_in_one_input_is_read_once(tmp_path: Path, monkeypatch) -> None:
    from retsnoop_otel.inputs import files
    f = tmp_path / "globs.txt"
    f.write_text("bpf_prog_load\n")
    reads = []
    real = files.read_text
    monkeypatch.setattr(files, "read_text", lambda path, *a: reads.append(path) or real(path, *a))
    read: dict[str, list[str]] = {}
    assert expand_glob_args([f"@{f}", "x"], read) + expand_glob_args([f"@{f}"], read) == ["bpf_prog_load", "x",
                                                                                          "bpf_prog_load"]
    assert reads == [str(f)]


def test_bad_mode(ksyms, available) -> None:
    with pytest.raises(DiscoveryError, match="attach mode"):
        run(ksyms, available, ["__x64_sys_bpf"], mode="uprobe")


def test_dry_run_report(ksyms, available) -> None:
    d = run(ksyms, available, ["__x64_sys_bpf"], ["array_map_alloc*", "rcu_read_lock_held", "show_stat"])
    text = format_dry_run(d, verbose=0)
    lines = text.splitlines()
    assert lines[0] == "24 functions are available for tracing; would attach 3 (1 entry) in fentry mode, skipped 2."
    assert lines[1:3] == ["Entry functions:", "    __x64_sys_bpf  returns signed"]
    assert "    array_map_alloc_check  returns int32" in lines
    assert "        1  ambiguous instances (3 in kallsyms, 3 in available_filter_functions; use -K to attach each " \
        "by address): show_stat" in lines
    assert lines[-1] == "    (-v lists every skipped function)"
    verbose = format_dry_run(d, verbose=1).splitlines()
    assert "    rcu_read_lock_held  built-in deny list: RCU read side and preempt count, used by the probes " \
        "themselves" in verbose
    assert sum(1 for line in verbose if line.startswith("    show_stat ")) == 1


def test_traceable_names_missing_from_kallsyms_are_found_once_and_cached(ksyms, available) -> None:
    fresh = Traceable.load(str(ROOT))
    unnamed = fresh.not_in(ksyms)
    assert unnamed == ("only_in_aff",)
    cached = Traceable.from_state(fresh.state())  # what the kernel cache gives back: no second set difference
    assert cached.not_in(Kallsyms.parse("ffffffff81000000 T only_in_aff\n")) == unnamed
    assert Traceable.from_state(Traceable.load(str(ROOT)).state()).not_in(ksyms) == unnamed  # not cached: found

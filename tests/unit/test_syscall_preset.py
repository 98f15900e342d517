"""Issue 46 point 5: the syscall preset's choice, on recorded BTF data, and its key, flags and refusals.

The fixture tests/fixtures/syscall_preset/btf_funcs_6.18.txt is "KIND NAME" lines of a real kernel's BTF
(symbols/btf_index.py FuncTypes of /sys/kernel/btf/vmlinux, Linux 6.18 x86_64): every *sys_* and *check* function
and 1 in 16 of the others by CRC-32 of the name. The host's available_filter_functions cannot be read here, so the
tests take the recorded names as the traceable ones, less the few each test removes.
"""

from __future__ import annotations

import array
import zlib
from pathlib import Path

import pytest

from retsnoop_otel.agent.config_file import ConfigError, parse_config
from retsnoop_otel.capture.model import RET_KIND_CODES, RetKind
from retsnoop_otel.command.errors import SetupError
from retsnoop_otel.runtime.config import ProbeSetConfig
from retsnoop_otel.runtime.environment import KernelEnv
from retsnoop_otel.runtime.syscall_set import with_preset
from retsnoop_otel.symbols import syscall_preset as sp
from retsnoop_otel.symbols.btf_index import FuncTypes
from retsnoop_otel.symbols.discovery import BUILTIN_DENY
from retsnoop_otel.symbols.globs import glob_to_regex
from retsnoop_otel.symbols.traceable import Traceable
from retsnoop_otel.trace.flags import parse

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "syscall_preset" / "btf_funcs_6.18.txt"


def _recorded() -> dict[str, RetKind]:
    rows = (line.split() for line in RECORDED.read_text().splitlines() if line and not line.startswith("#"))
    return {name: RetKind(kind) for kind, name in rows}


KINDS = _recorded()
ERRNO = [n for n, k in KINDS.items() if k in sp.ERRNO_KINDS]


def _types(kinds: dict[str, RetKind]) -> FuncTypes:
    names = sorted(kinds)
    packed = array.array("Q", [(i + 1) << 4 | RET_KIND_CODES[kinds[n]] for i, n in enumerate(names)])
    return FuncTypes.from_state(FuncTypes({n: 0 for n in names}).state()[:1] + (packed.tobytes(),))


def _matches(name: str, globs: list[str]) -> bool:
    return any(glob_to_regex(g).fullmatch(name) for g in globs)


def test_the_recorded_kernel_has_what_the_tests_rely_on() -> None:
    assert len(KINDS) > 4000 and KINDS["__x64_sys_bpf"] is RetKind.SIGNED
    assert KINDS["array_map_alloc_check"] is RetKind.INT32
    assert {k for k in KINDS.values()} >= {RetKind.VOID, RetKind.POINTER, RetKind.UNSIGNED, RetKind.BOOL}


def test_func_types_list_the_functions_that_can_return_an_errno() -> None:
    got = _types(KINDS).names_returning(sp.ERRNO_KINDS)
    assert got == sorted(ERRNO)


def test_entries_are_every_traceable_syscall_entry_of_the_arch() -> None:
    traceable = [n for n in KINDS if n != "__x64_sys_read"]  # one entry ftrace does not list
    p = sp.select(ERRNO, Traceable(traceable), "__x64_sys_")
    want = sorted(n for n in traceable if n.startswith("__x64_sys_"))
    assert list(p.entry) == want and len(want) > 300
    assert "__x64_sys_read" not in p.entry and "__ia32_sys_bpf" not in p.entry


def test_the_allow_set_keeps_the_lsm_hooks_and_leaves_each_modules_implementation_out() -> None:
    p = sp.select(ERRNO, Traceable(list(KINDS)), "__x64_sys_", budget=50000)
    modules = [n for n in ERRNO if _matches(n, sp.LSM_MODULES)]
    assert {"selinux_inode_permission", "yama_ptrace_access_check", "hook_ptrace_access_check"} <= set(modules)
    assert not set(modules) & set(p.allow)
    hooks = [n for n in ERRNO if n.startswith("security_")]
    assert len(hooks) > 20 and not [n for n in hooks if _matches(n, sp.LSM_MODULES)]
    assert {"security_bprm_check", "security_inode_get_acl", "security_file_ioctl_compat"} <= set(p.allow)


def test_the_allow_set_is_bounded_and_holds_only_errno_returning_attachable_functions() -> None:
    twice = "array_map_alloc_check"
    p = sp.select(ERRNO, Traceable([*KINDS, twice]), "__x64_sys_", budget=300)
    assert len(p.allow) == 300 and p.candidates > 300
    assert all(KINDS[n] in sp.ERRNO_KINDS for n in p.allow)
    assert twice not in p.allow  # listed twice by ftrace: not chosen
    deny = [g for group in BUILTIN_DENY for g in group.globs] + list(sp.HOT_PATHS)
    assert not [n for n in p.allow if _matches(n, deny)]
    assert not [n for n in p.allow if "sys_" in n and n.startswith(("__x64", "__ia32", "__se_", "__do_"))]
    assert set(p.allow).isdisjoint(p.entry)


def test_the_budget_fills_with_checks_first_in_a_fixed_order() -> None:
    small = sp.select(ERRNO, Traceable(KINDS), "__x64_sys_", budget=50)
    assert all(sp.origin_rank(n, zlib.crc32)[0] == 0 for n in small.allow), small.allow
    again = sp.select(list(reversed(ERRNO)), Traceable(list(reversed(KINDS))), "__x64_sys_", budget=50)
    assert again == small
    bigger = sp.select(ERRNO, Traceable(KINDS), "__x64_sys_", budget=400)
    assert set(small.allow) < set(bigger.allow)  # a larger budget keeps what a smaller one chose
    assert sp.select(ERRNO, Traceable(KINDS), "__x64_sys_", budget=0).allow == ()
    assert "array_map_alloc_check" in sp.select(ERRNO, Traceable(KINDS), "__x64_sys_").allow  # the default budget


def test_the_sets_deny_globs_apply_to_entries_and_allow_set() -> None:
    p = sp.select(ERRNO, Traceable(KINDS), "__x64_sys_", deny=["__x64_sys_bpf", "*map_alloc_check", "u:/x:f", ":a.c"])
    assert "__x64_sys_bpf" not in p.entry and "__x64_sys_close" in p.entry
    assert not [n for n in p.allow if n.endswith("map_alloc_check")]


def test_entry_prefix_by_arch() -> None:
    assert sp.entry_prefix("x86_64") == "__x64_sys_" and sp.entry_prefix("aarch64") == "__arm64_sys_"
    with pytest.raises(ValueError, match="riscv64"):
        sp.entry_prefix("riscv64")


def _env(auto_mode: str = "kprobe_session", refusal: str = "", types: object | None = None) -> KernelEnv:
    return KernelEnv(ksyms=None, available=Traceable(KINDS), ret_kind=types or _types(KINDS),  # type: ignore[arg-type]
                     btf_func_id=None, auto_mode=auto_mode, kernel_mode=lambda m: m, symbolizer=None,
                     kernel_refusal=refusal)


def test_a_set_with_the_preset_gets_its_functions_before_its_own_globs() -> None:
    cfg = ProbeSetConfig(name="sys", entry=("my_entry",), allow=("my_func",), syscalls=True, syscalls_budget=20)
    out = with_preset(cfg, _env(), machine="x86_64")
    assert out.entry[-1] == "my_entry" and "__x64_sys_bpf" in out.entry
    assert out.allow[-1] == "my_func" and len(out.allow) == 21
    plain = ProbeSetConfig(name="p", entry=("x",))
    assert with_preset(plain, _env(auto_mode="kprobe")) is plain


@pytest.mark.parametrize(("env", "says"), [
    (lambda: _env(auto_mode="kprobe"), "kprobe.session or kprobe.multi"),
    (lambda: _env(refusal="this kernel has no kprobes"), "no kprobes"),
    (lambda: _env(types=lambda _n: RetKind.INT32), "BTF"),
])
def test_refusals_name_what_is_missing(env, says: str) -> None:
    with pytest.raises(SetupError, match=says):
        with_preset(ProbeSetConfig(name="s", syscalls=True), env(), machine="x86_64")


def test_an_attach_mode_asked_for_is_used_even_without_multi_attach() -> None:
    cfg = ProbeSetConfig(name="s", syscalls=True, attach_mode="kprobe", syscalls_budget=5)
    assert len(with_preset(cfg, _env(auto_mode="kprobe"), machine="x86_64").allow) == 5


def test_trace_flags() -> None:
    ps = parse(["--syscalls"], {}).config.probe_sets[0]
    assert ps.syscalls and ps.entry == () and ps.syscalls_budget == sp.DEFAULT_BUDGET
    ps = parse(["--syscalls", "--syscalls-budget", "100", "-a", "x"], {}).config.probe_sets[0]
    assert ps.syscalls_budget == 100 and ps.allow == ("x",)
    for argv in (["--syscalls-budget", "100", "-e", "x"], ["--syscalls", "--syscalls-budget", "-1"], []):
        with pytest.raises(SystemExit):
            parse(argv, {})
    assert ProbeSetConfig._field_defaults["syscalls_budget"] == sp.DEFAULT_BUDGET


def test_agent_keys() -> None:
    cfg = parse_config("probe_sets:\n  all:\n    syscalls: true\n    syscalls_budget: 300\n")
    ps = cfg.runtime.probe_sets[0]
    assert ps.syscalls and ps.syscalls_budget == 300 and ps.entry == ()
    for text, says in (("probe_sets:\n  all:\n    mode: stack\n", "missing 'entry'"),
                       ("probe_sets:\n  all:\n    entry: [x]\n    syscalls_budget: 3\n", "syscalls: true too")):
        with pytest.raises(ConfigError, match=says):
            parse_config(text)

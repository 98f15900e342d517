"""User-space functions (issue 35): spec parsing, finding the binary, error rules, the user attach mode, and how the
dry run and the stack show them. ELF reading and attaching are driven on the host: tests/native/test_user_funcs_host.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from retsnoop_otel.capture.model import (
    RetKind,
    Session,
    StackEntry,
    TracedFunc,
    error_type,
    format_result,
    is_failure,
)
from retsnoop_otel.kernel.uprobes import UprobeModeError, choose_user_mode
from retsnoop_otel.render.stack import render_stack
from retsnoop_otel.symbols.discovery import Discovery, expand_glob_args, format_dry_run, user_and_kernel_globs
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import KallsymsSymbolizer
from retsnoop_otel.symbols.user_funcs import RULES, UserFuncError, UserSpec, parse_user_spec, resolve_binary

NEG = 1 << 64
U32 = 1 << 32


@pytest.mark.parametrize(("text", "spec"), [
    ("u:/usr/bin/app:handle_*", UserSpec("u:/usr/bin/app:handle_*", "/usr/bin/app", "handle_*", None)),
    ("u:libc.so.6:open*=neg", UserSpec("u:libc.so.6:open*=neg", "libc.so.6", "open*", "neg")),
    (" u:./a:b?=null ", UserSpec("u:./a:b?=null", "./a", "b?", "null")),
    ("u:/opt/x:y/z:f", UserSpec("u:/opt/x:y/z:f", "/opt/x:y/z", "f", None)),  # the glob follows the last ':'
])
def test_user_specs_parse(text: str, spec: UserSpec) -> None:
    assert parse_user_spec(text) == spec


@pytest.mark.parametrize(("text", "says"), [
    ("u:app", "expected 'u:BINARY:GLOB[=RULE]'"),
    ("u::f", "expected 'u:BINARY:GLOB[=RULE]'"),
    ("u:/bin/x:", "expected 'u:BINARY:GLOB[=RULE]'"),
    ("u:/bin/x:f=maybe", "unknown error rule 'maybe' (expected one of errno, neg, zero, null, ptr, none)"),
])
def test_bad_user_specs_say_the_form(text: str, says: str) -> None:
    with pytest.raises(UserFuncError, match=None) as exc:
        parse_user_spec(text)
    assert says in str(exc.value)


def test_user_specs_are_told_from_kernel_globs_after_glob_files(tmp_path: Path) -> None:
    listed = tmp_path / "globs"
    listed.write_text("# app functions\nu:/bin/app:handle_*\n__x64_sys_bpf\n")
    assert user_and_kernel_globs(expand_glob_args(["*sys_bpf", f"@{listed}", "u:libc.so.6:open"])) == (
        ["u:/bin/app:handle_*", "u:libc.so.6:open"], ["*sys_bpf", "__x64_sys_bpf"])


def _root(tmp_path: Path) -> Path:
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (tmp_path / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text("# multiarch\n/lib/x86_64-linux-gnu\n")
    (tmp_path / "lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"\x7fELF")
    (tmp_path / "lib/x86_64-linux-gnu/libssl.so.3").write_bytes(b"\x7fELF")
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/libfoo.so").write_bytes(b"\x7fELF")
    (tmp_path / "proc/42").mkdir(parents=True)
    (tmp_path / "proc/42/maps").write_text(
        "55d0c0000000-55d0c0001000 r--p 00000000 08:01 1 /srv/app/bin/app\n"
        "7f0000000000-7f0000100000 r-xp 00000000 08:01 2 /srv/app/lib/libapp.so.1\n"
        "7f0000200000-7f0000300000 r-xp 00000000 08:01 3 /lib/x86_64-linux-gnu/libc.so.6\n")
    return tmp_path


def test_libraries_are_found_as_ld_so_and_the_process_would_find_them(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert resolve_binary("libc.so.6", root=str(root)) == str(root / "lib/x86_64-linux-gnu/libc.so.6")
    assert resolve_binary("libssl", root=str(root)) == str(root / "lib/x86_64-linux-gnu/libssl.so.3")
    assert resolve_binary("libfoo", root=str(root)) == str(root / "usr/lib/libfoo.so")
    # the process's own mapping first, through its root (a container's files, a library off the search path)
    assert resolve_binary("libapp", pids=[42], root=str(root)) == str(root / "proc/42/root/srv/app/lib/libapp.so.1")
    assert resolve_binary("/lib/x86_64-linux-gnu/libc.so.6", root=str(root)) == \
        str(root / "lib/x86_64-linux-gnu/libc.so.6")


def test_a_binary_found_nowhere_says_where_it_looked_and_what_to_give(tmp_path: Path) -> None:
    root = _root(tmp_path)
    with pytest.raises(UserFuncError) as exc:
        resolve_binary("libnothere.so", pids=[42], root=str(root))
    assert str(exc.value) == ("'libnothere.so': not found in the maps of process 42, PATH or ld.so's search path: "
                              "give the binary's path (for example u:/usr/lib/x86_64-linux-gnu/libc.so.6:GLOB)")
    with pytest.raises(UserFuncError, match="no such file"):
        resolve_binary(str(tmp_path / "missing"), root="/")


@pytest.mark.parametrize(("rule", "raw", "fails", "err", "shown"), [
    ("errno", U32 - 22, True, "EINVAL", "-EINVAL"),  # an int -EINVAL: the upper half is not sign-extended
    ("errno", NEG - 22, True, "EINVAL", "-EINVAL"),  # a long
    ("errno", 7, False, None, "7"),
    ("neg", U32 - 1, True, "EPERM", "-EPERM"),
    ("neg", U32 - 100000, True, "-100000", "-100000"),
    ("neg", 0, False, None, "0"),
    ("zero", 0, True, "0", "0"),
    ("zero", 1, False, None, "1"),
    ("null", 0, True, "NULL", "NULL"),
    ("null", 0x7F00_0000_1000, False, None, "0x7f0000001000"),
    ("ptr", NEG - 12, True, "ENOMEM", "-ENOMEM"),
    ("none", U32 - 22, False, None, "0xffffffea"),
])
def test_the_error_rules_of_user_functions(rule: str, raw: int, fails: bool, err: str | None, shown: str) -> None:
    kind = RULES[rule]
    assert is_failure(raw, kind) is fails
    assert error_type(raw, kind) == err
    assert format_result(raw, kind) == shown


def test_the_user_attach_mode_is_the_cheapest_the_kernel_has() -> None:
    both = {"BPF_TRACE_UPROBE_MULTI", "BPF_TRACE_UPROBE_SESSION"}
    assert choose_user_mode(both, cookies=True) == "uprobe_session"
    assert choose_user_mode({"BPF_TRACE_UPROBE_MULTI"}, cookies=True) == "uprobe_multi"
    assert choose_user_mode(set(), cookies=True) == "uprobe"
    assert choose_user_mode(both, cookies=True, asked="uprobe_multi") == "uprobe_multi"
    assert choose_user_mode(set(), cookies=True, asked="uprobe") == "uprobe"
    with pytest.raises(UprobeModeError, match=r"this kernel has no uprobe.session \(Linux 6.13\+ needed\)"):
        choose_user_mode({"BPF_TRACE_UPROBE_MULTI"}, cookies=True, asked="uprobe_session")
    with pytest.raises(UprobeModeError, match=r"need BPF cookies, which this kernel lacks \(Linux 5.15\+"):
        choose_user_mode(both, cookies=False)


APP = "/srv/app/bin/app"
HANDLE = TracedFunc(2, "handle_request", 0x11a5, RetKind.INT32, True, binary=APP, offset=0x11a5,
                    source="/src/app.c:25")
FIND = TracedFunc(3, "find_handler", 0x1192, RetKind.NULL, False, binary=APP, offset=0x1192)


def test_the_dry_run_lists_user_functions_with_their_binary_rule_and_line() -> None:
    kernel = TracedFunc(0, "__x64_sys_bpf", 0xffffffff81000000, RetKind.SIGNED, False)
    text = format_dry_run(Discovery([kernel, HANDLE, FIND], [], "kprobe_session", 50000, "uprobe_session"))
    assert text.splitlines() == [
        "50000 functions are available for tracing; would attach 1 (0 entry) in kprobe_session mode, skipped 0.",
        "Would attach 2 user-space functions (1 entry) with uprobe.session.",
        "Entry functions:",
        "    handle_request [u:/srv/app/bin/app]  errors: errno  (/src/app.c:25)",
        "Other functions:",
        "    __x64_sys_bpf                      returns signed",
        "    find_handler [u:/srv/app/bin/app]  errors: null",
    ]
    alone = format_dry_run(Discovery([HANDLE], [("helper [app]", "denied by 'u:app:helper'")], "", 0, "uprobe"))
    assert alone.splitlines()[0] == "Would attach 1 user-space functions (1 entry) with single uprobes, skipped 1."


def test_a_user_function_heads_the_stack_above_the_kernel_frames() -> None:
    ksyms = Kallsyms.load(str(Path(__file__).resolve().parent.parent / "fixtures" / "kernel_root"))
    sys_bpf = next(s for s in ksyms.by_name("__x64_sys_bpf") if s.module is None)
    entry = next(s for s in ksyms.by_name("entry_SYSCALL_64_after_hwframe") if s.module is None)
    funcs = {2: HANDLE, 0: TracedFunc(0, "__x64_sys_bpf", sys_bpf.addr, RetKind.SIGNED, False)}
    s = Session(tid=7, pid=7, comm="app", proc_comm="app", start_ns=0, end_ns=400_000, is_err=True,
                chain=[StackEntry(2, U32 - 22, 300_000), StackEntry(0, NEG - 22, 90_000)],
                kstack=[sys_bpf.addr + 0x1a, entry.addr + 0x63])
    lines = render_stack(s, funcs, KallsymsSymbolizer(ksyms), 0).splitlines()
    rows = [line for line in lines if line.strip()]
    assert rows[-3:] == [
        "   300us [-EINVAL]  handle_request [app]  (/src/app.c:25)",
        "                    entry_SYSCALL_64_after_hwframe+0x63",
        "    90us [-EINVAL]  __x64_sys_bpf+0x1a",
    ]


def test_a_host_refusing_kernel_tracing_is_refused_in_one_line_unless_a_set_traces_user_functions() -> None:
    from retsnoop_otel.command.errors import SetupError
    from retsnoop_otel.runtime.config import ProbeSetConfig
    from retsnoop_otel.runtime.environment import KernelEnv

    env = KernelEnv(ksyms=None, available=None, ret_kind=lambda _n: RetKind.INT32, btf_func_id=None, auto_mode="",
                    check_mode=lambda _m: None, symbolizer=None, kernel_refusal="this kernel refuses fentry")
    kernel = ProbeSetConfig("k", entry=("*sys_bpf",))
    user = ProbeSetConfig("u", entry=("u:/bin/app:handle_*",), allow=("*sys_bpf",))
    with pytest.raises(SetupError, match="^this kernel refuses fentry$"):
        env.refuse_kernel_only([kernel])
    env.refuse_kernel_only([kernel, user])  # each set is then resolved, and refused, on its own
    KernelEnv(ksyms=None, available=None, ret_kind=lambda _n: RetKind.INT32, btf_func_id=None, auto_mode="kprobe",
              check_mode=lambda _m: None, symbolizer=None).refuse_kernel_only([kernel])


def test_a_weak_alias_names_its_function_and_an_address_is_traced_once(tmp_path: Path) -> None:
    """libc's getpid is a weak alias of its global __getpid: `u:libc.so.6:getpid` must find it, as bpftrace's
    uprobe:libc:getpid does; a glob matching both names still makes one function (one uprobe) of the address."""
    import subprocess

    from retsnoop_otel.symbols.user_funcs import discover_user
    src = tmp_path / "alias.c"
    src.write_text("int impl(int x) { return x + 1; }\n"
                   "int alias(int x) __attribute__((weak, alias(\"impl\")));\n")
    lib = tmp_path / "libalias.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    funcs, _ = discover_user([f"u:{lib}:alias"], [], [], 1, lines=False)
    assert [(f.name, f.is_entry) for f in funcs] == [("alias", True)]
    both, _ = discover_user([f"u:{lib}:impl", f"u:{lib}:alias"], [], [], 1, lines=False)
    assert [f.name for f in both] == ["impl"] and both[0].addr == funcs[0].addr  # the first name given, once

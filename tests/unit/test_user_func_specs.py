"""User-space functions (issue 35): spec parsing, finding the binary, error rules, the user attach mode, and how the
dry run and the stack show them. ELF reading and attaching are driven on the host: tests/native/test_user_funcs_host.py.
"""

from __future__ import annotations

import os
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
from retsnoop_otel.symbols.user_funcs import (
    RULES,
    UserFuncError,
    UserSpec,
    parse_user_spec,
    read_elf_funcs,
    resolve_binary,
)

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


X86_64 = (2, 1, 62)  # ELF class, byte order, machine: what resolve_binary checks a library against
I386 = (1, 1, 3)


def _elf(arch: tuple[int, int, int] = X86_64) -> bytes:
    """An ELF header of that architecture: as much of a library as finding it reads."""
    cls, order, machine = arch
    return b"\x7fELF" + bytes([cls, order, 1]) + bytes(9) + (3).to_bytes(2, "little") + \
        machine.to_bytes(2, "little" if order == 1 else "big") + bytes(44)


LD_SCRIPT = b"/* GNU ld script\n*/\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/libc.so.6 )\n"


def _root(tmp_path: Path) -> Path:
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (tmp_path / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text("# multiarch\n/lib/x86_64-linux-gnu\n")
    (tmp_path / "lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib/x86_64-linux-gnu/libc.so.6").write_bytes(_elf())
    (tmp_path / "lib/x86_64-linux-gnu/libssl.so.3").write_bytes(_elf())
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/libfoo.so").write_bytes(_elf())
    (tmp_path / "proc/42").mkdir(parents=True)
    (tmp_path / "proc/42/maps").write_text(
        "55d0c0000000-55d0c0001000 r--p 00000000 08:01 1 /srv/app/bin/app\n"
        "7f0000000000-7f0000100000 r-xp 00000000 08:01 2 /srv/app/lib/libapp.so.1\n"
        "7f0000200000-7f0000300000 r-xp 00000000 08:01 3 /lib/x86_64-linux-gnu/libc.so.6\n")
    return tmp_path


def test_libraries_are_found_as_ld_so_and_the_process_would_find_them(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert resolve_binary("libc.so.6", root=str(root), arch=X86_64) == str(root / "lib/x86_64-linux-gnu/libc.so.6")
    assert resolve_binary("libssl", root=str(root), arch=X86_64) == str(root / "lib/x86_64-linux-gnu/libssl.so.3")
    assert resolve_binary("libfoo", root=str(root), arch=X86_64) == str(root / "usr/lib/libfoo.so")
    # the process's own mapping first, through its root (a container's files, a library off the search path)
    assert resolve_binary("libapp", pids=[42], root=str(root)) == str(root / "proc/42/root/srv/app/lib/libapp.so.1")
    assert resolve_binary("libc.so", pids=[42], root=str(root)) == \
        str(root / "proc/42/root/lib/x86_64-linux-gnu/libc.so.6")
    assert resolve_binary("/lib/x86_64-linux-gnu/libc.so.6", root=str(root)) == \
        str(root / "lib/x86_64-linux-gnu/libc.so.6")


def _ld_so_cache(entries: list[tuple[str, str]]) -> bytes:
    """/etc/ld.so.cache as glibc 2.32+'s ldconfig writes it: the header, 24-byte entries (flags, name and path
    as offsets from the file's start, OS version, hwcaps), then the strings."""
    import struct
    strings, table = b"", b""
    first = 48 + 24 * len(entries)
    for name, path in entries:
        key = first + len(strings)
        strings += name.encode() + b"\0"
        value = first + len(strings)
        strings += path.encode() + b"\0"
        table += struct.pack("<iIIIQ", 0x0303, key, value, 0, 0)
    head = b"glibc-ld.so.cache1.1" + struct.pack("<IIB3xI3I", len(entries), len(strings), 2, 0, 0, 0, 0)
    return head + table + strings


def _multiarch_root(tmp_path: Path, cache: bool) -> Path:
    """Debian's libc: libc.so.6 (the ELF file), libc.so beside it (the linker script -lc reads), an i386 libc.so.6
    in /lib32 searched first, and a library only the cache knows."""
    root = _root(tmp_path)
    (root / "etc/ld.so.conf.d/0-lib32.conf").write_text("/lib32\n")
    (root / "lib32").mkdir()
    (root / "lib32/libc.so.6").write_bytes(_elf(I386))
    (root / "lib32/libc.so").write_bytes(LD_SCRIPT)
    (root / "lib/x86_64-linux-gnu/libc.so").write_bytes(LD_SCRIPT)
    (root / "lib/x86_64-linux-gnu/libssl.so.1.1").write_bytes(_elf())
    (root / "opt/only").mkdir(parents=True)
    (root / "opt/only/libonly.so.2").write_bytes(_elf())
    if cache:
        (root / "etc/ld.so.cache").write_bytes(_ld_so_cache([
            ("libssl.so.3", "/lib/x86_64-linux-gnu/libssl.so.3"),
            ("libssl.so.1.1", "/lib/x86_64-linux-gnu/libssl.so.1.1"),
            ("libonly.so.2", "/opt/only/libonly.so.2"), ("libc.so.6", "/lib32/libc.so.6"),
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"), ("libc.so", "/lib/x86_64-linux-gnu/libc.so")]))
    return root


@pytest.mark.parametrize("cache", [True, False], ids=["ld.so.cache", "search-path"])
def test_libc_and_libc_so_are_the_soname_d_libc_of_this_machine_not_the_linker_script(tmp_path: Path,
                                                                                        cache: bool) -> None:
    root = _multiarch_root(tmp_path, cache)
    libc = str(root / "lib/x86_64-linux-gnu/libc.so.6")
    for name in ("libc", "libc.so", "libc.so.6"):
        assert resolve_binary(name, root=str(root), arch=X86_64) == libc, name
        assert resolve_binary(name, root=str(root), arch=I386) == str(root / "lib32/libc.so.6"), name
    # the highest version of a bare or linker name; an exact SONAME is that file
    assert resolve_binary("libssl", root=str(root), arch=X86_64) == str(root / "lib/x86_64-linux-gnu/libssl.so.3")
    assert resolve_binary("libssl.so.1.1", root=str(root), arch=X86_64) == \
        str(root / "lib/x86_64-linux-gnu/libssl.so.1.1")
    if cache:  # off the search path: only the cache knows it
        assert resolve_binary("libonly", root=str(root), arch=X86_64) == str(root / "opt/only/libonly.so.2")


def test_a_linker_script_alone_is_not_found_and_said_so(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "usr/lib/libscript.so").write_bytes(LD_SCRIPT)
    with pytest.raises(UserFuncError) as exc:
        resolve_binary("libscript.so", root=str(root), arch=X86_64)
    assert str(exc.value) == (f"'libscript.so': not found in PATH or ld.so's search path (passed over "
                              f"{root}/usr/lib/libscript.so: not an ELF file): give the binary's path "
                              "(for example u:/usr/lib/x86_64-linux-gnu/libc.so.6:GLOB)")
    with pytest.raises(UserFuncError) as exc:  # named by its path, it is read and refused with what it is
        read_elf_funcs(str(root / "usr/lib/libscript.so"))
    assert str(exc.value) == (f"'{root}/usr/lib/libscript.so': not an ELF file (a linker script: give the library "
                              "it names, for example libc.so.6 for libc.so)")


def test_a_binary_found_nowhere_says_where_it_looked_and_what_to_give(tmp_path: Path) -> None:
    root = _root(tmp_path)
    with pytest.raises(UserFuncError) as exc:
        resolve_binary("libnothere.so", pids=[42], root=str(root))
    assert str(exc.value) == ("'libnothere.so': not found in the maps of process 42, PATH or ld.so's search path: "
                              "give the binary's path (for example u:/usr/lib/x86_64-linux-gnu/libc.so.6:GLOB)")


def test_a_binary_path_that_is_no_regular_file_says_what_it_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "file").write_bytes(_elf())
    cases = {
        str(tmp_path): "is a directory",
        str(tmp_path / "fifo"): "not a regular file (a FIFO)",
        "/dev/null": "not a regular file (a character device)",
        str(tmp_path / "loop"): "too many levels of symbolic links",
        str(tmp_path / "file/app"): "a part of the path is not a directory",
        str(tmp_path / "missing"): "no such file",
    }
    for path, why in cases.items():
        with pytest.raises(UserFuncError) as exc:
            resolve_binary(path, root="/")
        assert str(exc.value) == f"'{path}': {why} (give the path of an executable or shared library)"


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
                    kernel_mode=lambda m: m, symbolizer=None, kernel_refusal="this kernel refuses fentry")
    kernel = ProbeSetConfig("k", entry=("*sys_bpf",))
    user = ProbeSetConfig("u", entry=("u:/bin/app:handle_*",), allow=("*sys_bpf",))
    with pytest.raises(SetupError, match="^this kernel refuses fentry$"):
        env.refuse_kernel_only([kernel])
    env.refuse_kernel_only([kernel, user])  # each set is then resolved, and refused, on its own
    KernelEnv(ksyms=None, available=None, ret_kind=lambda _n: RetKind.INT32, btf_func_id=None, auto_mode="kprobe",
              kernel_mode=lambda m: m, symbolizer=None).refuse_kernel_only([kernel])


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


VERSIONED = """int impl(int x) { return x + 1; }
int alias(int x) __attribute__((weak, alias("impl")));
int f_old(int x) { return x; }
int f_new(int x) { return x * 2; }
__asm__(".symver f_old,f@V1");
__asm__(".symver f_new,f@@V2");
"""


def test_versioned_names_name_their_function_as_ld_so_binds_them(tmp_path: Path) -> None:
    """f@@V2 (the default version: what a program linked now calls) is also `f`; f@V1 (kept for programs linked
    before V2) only by its versioned name. From .dynsym and .gnu.version (the stripped copy) as from .symtab."""
    import subprocess

    from retsnoop_otel.symbols.user_funcs import discover_user
    (tmp_path / "v.c").write_text(VERSIONED)
    (tmp_path / "v.map").write_text("V1 { global: impl; alias; f; local: *; };\nV2 { global: f; } V1;\n")
    lib = tmp_path / "libv.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-Wl,--version-script={tmp_path / 'v.map'}", "-o", str(lib),
                    str(tmp_path / "v.c")], check=True)
    stripped = tmp_path / "libv-stripped.so"
    subprocess.run(["strip", "-o", str(stripped), str(lib)], check=True)

    def found(binary: Path, *globs: str, deny: tuple[str, ...] = ()) -> list[tuple[str, int]]:
        funcs, _ = discover_user([f"u:{binary}:{g}" for g in globs], [], [f"u:{binary}:{d}" for d in deny], 1,
                                 lines=False)
        return [(f.name, f.addr) for f in funcs]

    for binary in (lib, stripped):
        (_, new), = found(binary, "f")
        (_, old), = found(binary, "f@V1")
        assert new != old
        assert found(binary, "f") == [("f", new)] and found(binary, "f@@V2") == [("f@@V2", new)]  # the name asked
        assert found(binary, "f@*") == [("f@@V2", new), ("f@V1", old)]  # sorted by name, each address once
        assert found(binary, "f@V1") == [("f@V1", old)]
        (_, impl), = found(binary, "impl")
        assert found(binary, "alias@@V1") == [("alias@@V1", impl)]
        # a glob matching several names of one address reports one, the same each time: fewest leading '_', then
        # global before weak before local (impl before alias, f@V1 of .dynsym before .symtab's local f_old)
        assert [n for n, a in found(binary, "*") if a in (impl, new, old)] == ["f", "f@V1", "impl"]
        # a deny matches any name of the address: denying `impl` denies the function `alias` names too
        assert found(binary, "alias", "f", deny=("impl",)) == [("f", new)]
        assert found(binary, "f", "impl", deny=("alias@@V1",)) == [("f", new)]
    assert found(lib, "f_*") == [("f_new", new), ("f_old", old)]  # .symtab's local names too

"""UserSymbolizer against real processes: C programs built here print their own return addresses
(backtrace(): innermost first, like bpf_get_stack), then wait for stdin to close."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from retsnoop_otel.symbols import user_symbols
from retsnoop_otel.symbols.user_symbols import UserFrame, UserSymbolizer

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

# the wait: a stack that is symbolized while (or after) the process sits here
WAIT = r"""
    for (int i = 0; i < n; i++) printf("%p\n", buf[i]);
    printf("READY\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
"""
HEAD = "#include <execinfo.h>\n#include <stdio.h>\n#include <unistd.h>\n"
INNER = ("__attribute__((noinline)) void inner(void) {\n    void *buf[16];\n"
         "    int n = backtrace(buf, 16);  /* CALL_BT */\n" + WAIT + "}\n")
MIDDLE = "__attribute__((noinline)) void middle(void) {\n    inner();  /* CALL_INNER */\n}\n"
OUTER = "__attribute__((noinline)) void outer(void) {\n    middle();  /* CALL_MIDDLE */\n}\n"
MAIN = "int main(void) {\n    outer();  /* CALL_OUTER */\n    return 0;\n}\n"
CHAIN = HEAD + INNER + MIDDLE + OUTER + MAIN
NAMES = ["inner", "middle", "outer", "main"]

INLINE = HEAD + r"""
static inline __attribute__((always_inline)) int leaf(int x) {
    void *buf[16];
    int n = backtrace(buf, 16);  /* CALL_BT */
""" + WAIT + r"""
    return n + x;
}
__attribute__((noinline)) int inner(int x) { int r = leaf(x); __asm__ volatile(""); return r + 1; }
static inline __attribute__((always_inline)) int hop(int x) {
    int r = inner(x);  /* CALL_INNER */
    __asm__ volatile("");
    return r * 3;
}
__attribute__((noinline)) int middle(int x) { int r = hop(x); __asm__ volatile(""); return r - 1; }
int main(int argc, char **argv) { (void)argv; return middle(argc) == 42; }
"""


def line_of(source: str, marker: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def build(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    src, out = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    subprocess.run(["gcc", "-o", str(out), str(src), *flags], check=True)  # libraries after the source
    return out


class Prog:
    """A running test program and the return addresses it printed."""

    def __init__(self, exe: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        self.pid = self.proc.pid
        self.addrs: list[int] = []
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            if text.strip() == "READY":
                break
            self.addrs.append(int(text, 16))
        assert self.addrs, "the program printed no addresses"

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=10)
        self.proc.stdout.close()  # type: ignore[union-attr]


@pytest.fixture
def run():
    progs: list[Prog] = []

    def start(exe: Path, env: dict[str, str] | None = None) -> Prog:
        progs.append(Prog(exe, env))
        return progs[-1]

    yield start
    for p in progs:
        p.finish()


@pytest.fixture
def sym():
    s = UserSymbolizer()
    yield s
    s.close()


def sizes(path: Path) -> dict[str, int]:
    """Function sizes from nm (-D for a stripped binary's .dynsym)."""
    out: dict[str, int] = {}
    for args in (["nm", "-S", str(path)], ["nm", "-D", "-S", str(path)]):
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
        for row in proc.stdout.splitlines():
            parts = row.split()
            if len(parts) == 4 and parts[2] in "Tt":
                out[parts[3]] = int(parts[1], 16)
    return out


def real(frames: list[UserFrame]) -> list[UserFrame]:
    return [f for f in frames if not f.inlined]


def check_chain(frames: list[UserFrame], exe: Path, lines: bool, source: str = CHAIN) -> None:
    top = real(frames)[:4]
    assert [f.function for f in top] == NAMES
    size = sizes(exe)
    for f in top:
        assert 0 < f.offset < size[f.function], f  # a return address lies inside its function
        assert f.module == str(exe)
    if lines:
        want = [line_of(source, m) for m in ("CALL_BT", "CALL_INNER", "CALL_MIDDLE", "CALL_OUTER")]
        assert [(Path(f.file).name if f.file else None, f.line) for f in top] == [(exe.name + ".c", n) for n in want]
    else:
        assert all(f.file is None and f.line is None for f in top)


def test_pie_executable_names_offsets_lines(tmp_path, run, sym):
    exe = build(tmp_path, "pie", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer", "-pie", "-fPIE")
    p = run(exe)
    assert p.addrs[0] > 0x500000000000  # really loaded at a random high base, far from its link addresses
    sym.remember(p.pid)
    frames = sym.frames(p.pid, p.addrs)
    check_chain(frames, exe, lines=True)
    assert frames[0].addr == p.addrs[0] and real(frames)[1].addr == p.addrs[1]  # original addresses reported
    text = sym.describe(frames[0])
    assert text.startswith("inner+0x") and text.endswith(f"pie.c:{line_of(CHAIN, 'CALL_BT')}")


def test_non_pie_executable(tmp_path, run, sym):
    exe = build(tmp_path, "nopie", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer", "-no-pie")
    p = run(exe)
    frames = sym.frames(p.pid, p.addrs)  # never remembered: snapshotted on first use
    check_chain(frames, exe, lines=True)
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout.split()
    middle_at = int(nm[nm.index("middle") - 2], 16)
    assert real(frames)[1].offset == p.addrs[1] - middle_at  # link address == run address


def test_chain_through_shared_library(tmp_path, run, sym):
    lib_src = HEAD + INNER + MIDDLE
    (tmp_path / "libchain.c").write_text(lib_src)
    lib = tmp_path / "libchain.so"
    subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-fPIC", "-shared", "-o", str(lib),
                    str(tmp_path / "libchain.c")], check=True)
    exe_src = "void middle(void);\n" + OUTER + MAIN
    exe = build(tmp_path, "uselib", exe_src, "-O0", "-g", "-fno-omit-frame-pointer", f"-L{tmp_path}", "-lchain",
                f"-Wl,-rpath,{tmp_path}")
    p = run(exe)
    sym.remember(p.pid)
    top = real(sym.frames(p.pid, p.addrs))[:4]
    assert [f.function for f in top] == NAMES
    assert [f.module for f in top] == [str(lib), str(lib), str(exe), str(exe)]
    assert [(Path(f.file).name, f.line) for f in top] == [
        ("libchain.c", line_of(lib_src, "CALL_BT")), ("libchain.c", line_of(lib_src, "CALL_INNER")),
        ("uselib.c", line_of(exe_src, "CALL_MIDDLE")), ("uselib.c", line_of(exe_src, "CALL_OUTER"))]
    assert all(0 < f.offset < sizes(Path(f.module))[f.function] for f in top)


def test_stripped_binary_resolves_from_dynsym(tmp_path, run, sym):
    exe = build(tmp_path, "stripped", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer", "-rdynamic")
    subprocess.run(["strip", str(exe)], check=True)
    assert "no symbols" in subprocess.run(["nm", str(exe)], capture_output=True, text=True).stderr
    p = run(exe)
    sym.remember(p.pid)
    frames = sym.frames(p.pid, p.addrs)
    check_chain(frames, exe, lines=False)
    assert sym.describe(frames[0]).endswith(f" ({exe})")


def test_lines_off(tmp_path, run):
    exe = build(tmp_path, "nolines", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    p = run(exe)
    s = UserSymbolizer(lines=False)
    try:
        s.remember(p.pid)
        check_chain(s.frames(p.pid, p.addrs), exe, lines=False)
    finally:
        s.close()


def test_unknown_addresses_and_processes(tmp_path, run, sym):
    exe = build(tmp_path, "unknown", CHAIN, "-O0", "-g")
    p = run(exe)
    sym.remember(p.pid)
    frames = sym.frames(p.pid, [p.addrs[0], 0x10, 0xFFFFFFFFFFFF])
    assert frames[1:] == [UserFrame(0x10, None, 0, None), UserFrame(0xFFFFFFFFFFFF, None, 0, None)]
    assert sym.describe(frames[1]) == "0x10"
    assert sym.frames(p.pid, []) == []
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert sym.frames(dead.pid, [0x401000, 0]) == [UserFrame(0x401000, None, 0, None), UserFrame(0, None, 0, None)]


def test_process_exits_after_remember(tmp_path, run, sym):
    exe = build(tmp_path, "exits", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    p = run(exe)
    sym.remember(p.pid)
    p.finish()
    assert not os.path.exists(f"/proc/{p.pid}")
    check_chain(sym.frames(p.pid, p.addrs), exe, lines=True)  # names and lines from the snapshot


def test_zombie_keeps_its_snapshot(tmp_path, run, sym, monkeypatch):
    """Exited but not yet reaped: /proc/PID/maps is empty, and a refresh must not forget the mappings."""
    monkeypatch.setattr(user_symbols, "REFRESH_AFTER", 0.0)
    exe = build(tmp_path, "zombie", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    p = run(exe)
    sym.remember(p.pid)
    p.proc.stdin.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the program did not exit"
        time.sleep(0.01)
    frames = sym.frames(p.pid, [0x10, *p.addrs])  # the unknown address makes it re-read the (empty) maps
    assert frames[0] == UserFrame(0x10, None, 0, None)
    check_chain(frames[1:], exe, lines=True)


def test_inlined_frames(tmp_path, run, sym):
    exe = build(tmp_path, "inl", INLINE, "-O2", "-g", "-fno-omit-frame-pointer")
    p = run(exe)
    sym.remember(p.pid)
    frames = sym.frames(p.pid, p.addrs)
    names = [(f.function, f.inlined) for f in frames[:4]]
    assert names == [("leaf", True), ("inner", False), ("hop", True), ("middle", False)]
    leaf, inner, hop, middle = frames[:4]
    assert leaf.addr == inner.addr == p.addrs[0] and hop.addr == middle.addr == p.addrs[1]
    first, last = line_of(INLINE, "static inline __attribute__((always_inline)) int leaf"), line_of(INLINE, "n + x")
    assert first <= leaf.line <= last
    assert inner.line == line_of(INLINE, "int r = leaf(x)")
    assert hop.line == line_of(INLINE, "CALL_INNER")  # the call site, found through addr - 1
    assert middle.line == line_of(INLINE, "int r = hop(x)")
    assert sym.describe(hop) == f"hop inl.c:{hop.line} (inlined)"


def test_one_parse_per_binary(tmp_path, run, sym):
    exe = build(tmp_path, "twice", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    a = run(exe)
    sym.remember(a.pid)
    after_first = sym.parses
    assert after_first >= 2  # the program, libc, the dynamic loader
    b = run(exe)
    sym.remember(b.pid)
    assert sym.parses == after_first  # same inode: nothing parsed again
    copy = tmp_path / "copy"
    shutil.copy(exe, copy)
    c = run(copy)
    sym.remember(c.pid)
    assert sym.parses == after_first  # another inode, same build-id
    for p in (a, b):
        check_chain(sym.frames(p.pid, p.addrs), exe, lines=True)
    assert [f.function for f in real(sym.frames(c.pid, c.addrs))[:4]] == NAMES


def test_without_map_files_opens_through_the_process_root(tmp_path, run):
    """No CAP_SYS_ADMIN (no map_files): the file is opened at /proc/PID/root/<path>, the container's view."""
    exe = build(tmp_path, "viaroot", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    p = run(exe)
    fake = tmp_path / "proc" / str(p.pid)
    fake.mkdir(parents=True)
    (fake / "maps").write_text(Path(f"/proc/{p.pid}/maps").read_text())
    (fake / "root").symlink_to(f"/proc/{p.pid}/root")
    s = UserSymbolizer(proc_root=str(tmp_path / "proc"))
    try:
        check_chain(s.frames(p.pid, p.addrs), exe, lines=True)
    finally:
        s.close()


def held() -> set[str]:
    """What this test process has open."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_evicted_elfs_close_their_files(tmp_path, run, monkeypatch):
    """Bounded caches: an ELF leaving them (and every process mapping it) closes its DWARF fd, and
    llvm-symbolizer, which caches objects by path forever, starts afresh."""
    monkeypatch.setattr(user_symbols, "MAX_ELFS", 3)
    first = build(tmp_path, "first", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    second = build(tmp_path, "second", CHAIN, "-O0", "-g", "-fno-omit-frame-pointer")
    s = UserSymbolizer(max_processes=1)
    try:
        a = run(first)
        s.remember(a.pid)
        check_chain(s.frames(a.pid, a.addrs), first, lines=True)
        assert str(first) in held()
        b = run(second)
        s.remember(b.pid)  # evicts a's process, then nothing holds a's program any more
        assert str(first) not in held() and str(second) in held()
        assert s._llvm is not None and s._llvm.stale
        check_chain(s.frames(b.pid, b.addrs), second, lines=True)
        check_chain(s.frames(a.pid, a.addrs), first, lines=True)  # still running: snapshotted again
    finally:
        s.close()

"""TlsLocator against real processes: small C writers built here with gcc publish otel_thread_ctx_v1 in each of
their threads and print, per thread, `pid thread_pointer &otel_thread_ctx_v1 value`. From the location alone,
the test then walks /proc/PID/mem exactly as the BPF side will (tp + tp_offset, or the DTV at tp + 8 and its
16-byte entry [modid], plus offset) and must land on the printed address and read back the printed pointer,
which points at a valid 28-byte record header. Every writer runs two threads with different records.
"""

from __future__ import annotations

import os
import select
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from retsnoop_otel.appctx import thread_ctx
from retsnoop_otel.appctx.thread_ctx import ThreadCtxError, TlsLocation, TlsLocator

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the writers")

WRITER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(EXE_TLS)
__thread void *otel_thread_ctx_v1;
#elif defined(EXTERN_TLS)
extern __thread void *otel_thread_ctx_v1;
#endif
#if defined(EXE_TLS) || defined(EXTERN_TLS)
static void otel_set(void *p) { otel_thread_ctx_v1 = p; }
static void *otel_addr(void) { return &otel_thread_ctx_v1; }
static void *otel_get(void) { return otel_thread_ctx_v1; }
#elif defined(USE_DLOPEN)
static void (*otel_set)(void *);
static void *(*otel_addr)(void);
static void *(*otel_get)(void);
#else
void otel_set(void *);
void *otel_addr(void);
void *otel_get(void);
#endif
#ifdef EXE_OTHER_TLS  /* the executable's own TLS, before the variable: module id 1, and a big aligned block */
__thread char exe_other_tls[40] __attribute__((aligned(64))) = {1};
#endif
#ifdef WITH_OTHER
int other_touch(int);
#endif

static unsigned char records[2][64] __attribute__((aligned(8)));
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void publish(int i) {
    records[i][0] = 0xa0 + i;   /* trace-id[0] */
    records[i][24] = 1;         /* valid */
    otel_set(records[i]);
    pthread_mutex_lock(&mu);
    printf("%d %lu %lu %lu\n", (int)getpid(), (unsigned long)__builtin_thread_pointer(),
           (unsigned long)otel_addr(), (unsigned long)otel_get());
    fflush(stdout);
    pthread_mutex_unlock(&mu);
}

static void *second_thread(void *arg) {
    publish(1);
    for (;;) pause();
    return arg;
}

int main(int argc, char **argv) {
#ifdef USE_DLOPEN
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    otel_set = (void (*)(void *))dlsym(h, "otel_set");
    otel_addr = (void *(*)(void))dlsym(h, "otel_addr");
    otel_get = (void *(*)(void))dlsym(h, "otel_get");
#endif
#ifdef EXE_OTHER_TLS
    exe_other_tls[1]++;
#endif
#ifdef WITH_OTHER
    other_touch(1);
#endif
    publish(0);
    pthread_t t;
    pthread_create(&t, NULL, second_thread, NULL);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {}
    return argc > 99;
}
"""
LIBCTX = r"""
__thread void *otel_thread_ctx_v1;
void otel_set(void *p) { otel_thread_ctx_v1 = p; }
void *otel_addr(void) { return &otel_thread_ctx_v1; }
void *otel_get(void) { return otel_thread_ctx_v1; }
"""
# Written through a hidden alias, after another variable: the library's relocations name no symbol (index 0,
# the module's own block, local-dynamic style) and the variable does not start the block.
LIBALIAS = r"""
__thread long lib_pad_tls[5] = {1};
__thread void *otel_thread_ctx_v1;
extern __thread void *otel_ctx_local __attribute__((alias("otel_thread_ctx_v1"), visibility("hidden")));
void otel_set(void *p) { otel_ctx_local = p; lib_pad_tls[1]++; }
void *otel_addr(void) { return &otel_ctx_local; }
void *otel_get(void) { return otel_ctx_local; }
"""
LIBPASSIVE = "__thread void *otel_thread_ctx_v1;\n"  # defines it, never touches it: no relocation of its own
LIBSETTER = r"""
extern __thread void *otel_thread_ctx_v1;
void otel_set(void *p) { otel_thread_ctx_v1 = p; }
void *otel_addr(void) { return &otel_thread_ctx_v1; }
void *otel_get(void) { return otel_thread_ctx_v1; }
"""
LIBOTHER = "__thread int other_tls[16];\nint other_touch(int v) { other_tls[3] += v; return other_tls[3]; }\n"
NO_AS_NEEDED_LIBC = ["-Wl,--no-as-needed", "-lc"]  # libc's DT_NEEDED first: its TLS module id comes before ours


class Build:
    def __init__(self, root: Path) -> None:
        self.root = root
        for name, text in (("writer.c", WRITER), ("libctx.c", LIBCTX), ("libalias.c", LIBALIAS),
                           ("libpassive.c", LIBPASSIVE),
                           ("libsetter.c", LIBSETTER), ("libother.c", LIBOTHER)):
            (root / name).write_text(text)
        self.built: set[str] = set()

    def __call__(self, out: str, *args: str) -> str:
        path = self.root / out
        if out not in self.built:
            link = [] if "-static-pie" in args else ["-L", str(self.root), f"-Wl,-rpath,{self.root}"]  # RUNPATH
            cmd = ["gcc", "-O1", "-o", str(path), *args, *link, "-pthread"]  # crashes glibc 2.36's static-pie start
            subprocess.run(cmd, cwd=self.root, check=True, capture_output=True, text=True, timeout=120)
            self.built.add(out)
        return str(path)

    def lib(self, out: str, source: str, *args: str) -> str:
        return self(out, "-fPIC", "-shared", source, *args)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    return Build(tmp_path_factory.mktemp("tls"))


class Writer:
    """A running writer and the two lines its threads printed (raw fd + select: nothing hides in a buffer)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.pid = self.proc.pid
        data, deadline = b"", time.monotonic() + 20
        while data.count(b"\n") < 2:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                self.close()
                raise AssertionError(f"{argv[0]} printed {data!r}, stderr {self.proc.stderr.read()!r}")
            data += chunk
        self.threads = [tuple(int(x) for x in line.split()) for line in data.decode().splitlines()]
        assert all(t[0] == self.pid for t in self.threads)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.proc.stderr.close()


def _u64(mem: int, addr: int) -> int:
    return struct.unpack("<Q", os.pread(mem, 8, addr))[0]


def variable_address(pid: int, loc: TlsLocation, tp: int) -> int:
    """What the BPF program will do with the thread pointer of the thread it caught."""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        if loc.modid == 0:
            return tp + loc.tp_offset
        dtv = _u64(fd, tp + 8)  # tcbhead_t.dtv
        block = _u64(fd, dtv + 16 * loc.modid)  # dtv_t[modid].pointer.val
        assert block not in (0, 2**64 - 1), "DTV entry not allocated"
        return block + loc.offset
    finally:
        os.close(fd)


def check_writer(argv: list[str], how: str, locator: TlsLocator | None = None,
                 before: Callable[[], object] = lambda: None) -> TlsLocation:
    writer = Writer(argv)
    try:
        before()
        loc = (locator or TlsLocator()).locate(writer.pid)
        assert loc is not None and loc.how == how, loc
        values = set()
        for _pid, tp, addr, value in writer.threads:
            assert variable_address(writer.pid, loc, tp) == addr
            fd = os.open(f"/proc/{writer.pid}/mem", os.O_RDONLY)
            try:
                assert _u64(fd, addr) == value
                record = os.pread(fd, 28, value)  # the OTEP 4947 header the pointer leads to
            finally:
                os.close(fd)
            assert record[24] == 1 and record[0] in (0xA0, 0xA1)
            values.add(value)
        assert len(values) == 2 and len({t[1] for t in writer.threads}) == 2  # two threads, own records
        return loc
    finally:
        writer.close()


EXPORT = "-Wl,--export-dynamic-symbol=otel_thread_ctx_v1"


@pytest.mark.parametrize("flags", [
    ["-fPIE", "-pie"],
    ["-fPIE", "-pie", "-ftls-model=initial-exec"],
    ["-fPIE", "-pie", "-ftls-model=local-exec"],
    ["-fPIC", "-pie", "-mtls-dialect=gnu2", "-DEXE_OTHER_TLS"],
    ["-fno-pie", "-no-pie", "-rdynamic", "-DEXE_OTHER_TLS"],
    ["-static-pie", "-DEXE_OTHER_TLS"],
], ids=["pie", "pie-initial-exec", "pie-local-exec", "pie-tlsdesc-aligned-block", "no-pie", "static-pie"])
def test_variable_in_the_executable(build: Build, flags: list[str]) -> None:
    exe = build("exe-" + "".join(f for f in "".join(flags) if f.isalnum()), "writer.c", "-DEXE_TLS", EXPORT, *flags)
    loc = check_writer([exe], "executable")
    assert loc.modid == 0 and loc.tp_offset < 0 and loc.module == exe


def test_tlsdesc_library_linked_at_start_is_in_static_tls(build: Build) -> None:
    lib = build.lib("libctx_desc.so", "libctx.c", "-mtls-dialect=gnu2")
    build.lib("libother.so", "libother.c")
    exe = build("start-desc", "writer.c", "-DEXE_OTHER_TLS", "-DWITH_OTHER", *NO_AS_NEEDED_LIBC,
                "-l:libother.so", "-l:libctx_desc.so")
    loc = check_writer([exe], "static-tls")
    assert loc.module == lib and loc.modid == 0


def test_gd_library_linked_at_start_through_the_dtv(build: Build) -> None:
    """Module ids: the executable's own TLS 1, libc 2, libother 3, ours 4 (DT_NEEDED order = load order)."""
    lib = build.lib("libctx_gd.so", "libctx.c", "-mtls-dialect=gnu")
    build.lib("libother.so", "libother.c")
    exe = build("start-gd", "writer.c", "-DEXE_OTHER_TLS", "-DWITH_OTHER", *NO_AS_NEEDED_LIBC,
                "-l:libother.so", "-l:libctx_gd.so")
    loc = check_writer([exe], "dtv")
    assert (loc.module, loc.modid, loc.offset) == (lib, 4, 0)


def test_module_id_counted_along_r_map_when_the_library_has_no_relocation(build: Build) -> None:
    """libpassive only defines the variable (the executable writes it, initial-exec), so nothing in it was
    relocated: the module id comes from counting PT_TLS objects along r_debug.r_map."""
    lib = build.lib("libpassive.so", "libpassive.c")
    build.lib("libother.so", "libother.c")
    exe = build("start-passive", "writer.c", "-DEXTERN_TLS", "-DEXE_OTHER_TLS", "-DWITH_OTHER",
                *NO_AS_NEEDED_LIBC, "-l:libother.so", "-l:libpassive.so")
    loc = check_writer([exe], "dtv")
    assert (loc.module, loc.modid) == (lib, 4)


@pytest.mark.parametrize("lib_name,source,flags,how", [
    ("libctx_gd.so", "libctx.c", ["-mtls-dialect=gnu"], "dtv"),
    # glibc gives a dlopen'ed TLSDESC library optional static TLS and never fills in its DTV entries:
    ("libctx_desc.so", "libctx.c", ["-mtls-dialect=gnu2"], "static-tls"),
    # the setter (GD, no TLS of its own) pulls in libpassive; only counting gives libpassive's id
    ("libsetter.so", "libsetter.c", ["-mtls-dialect=gnu", "-l:libpassive.so"], "dtv"),
    ("libalias_gd.so", "libalias.c", ["-mtls-dialect=gnu"], "dtv"),
    ("libalias_desc.so", "libalias.c", ["-mtls-dialect=gnu2"], "static-tls"),
], ids=["gd", "tlsdesc", "passive-via-setter", "hidden-alias-gd", "hidden-alias-tlsdesc"])
def test_library_dlopened_after_start(build: Build, lib_name: str, source: str, flags: list[str], how: str) -> None:
    build.lib("libpassive.so", "libpassive.c")
    build.lib("libother.so", "libother.c")
    lib = build.lib(lib_name, source, *flags)
    exe = build("dlopener", "writer.c", "-DUSE_DLOPEN", "-DEXE_OTHER_TLS", "-DWITH_OTHER", *NO_AS_NEEDED_LIBC,
                "-l:libother.so", "-ldl")
    loc = check_writer([exe, lib], how)
    if how == "dtv":  # exe 1, libc 2, libother 3, then the dlopen'ed module (the setter has no TLS)
        assert loc.modid == 4
    assert loc.offset == (40 if "alias" in lib_name else 0)  # after lib_pad_tls


def test_deleted_library_is_read_through_map_files(build: Build, tmp_path: Path) -> None:
    """A library replaced or removed on disk since it was loaded: /proc/PID/root/<path> is gone, the
    mapping's own file (/proc/PID/map_files/<range>) is not."""
    gone = tmp_path / "libctx_gone.so"
    shutil.copy(build.lib("libctx_gd.so", "libctx.c", "-mtls-dialect=gnu"), gone)
    build.lib("libother.so", "libother.c")
    exe = build("dlopener", "writer.c", "-DUSE_DLOPEN", "-DEXE_OTHER_TLS", "-DWITH_OTHER", *NO_AS_NEEDED_LIBC,
                "-l:libother.so", "-ldl")
    loc = check_writer([exe, str(gone)], "dtv", before=gone.unlink)
    assert (loc.module, loc.modid) == (f"{gone} (deleted)", 4)


def test_maps_order_fallback_when_r_debug_cannot_be_followed(build: Build, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without r_debug (static executable, unreadable memory) the load order of the libraries linked at start is
    guessed from where they were mapped: top-down, so the highest first mapping was loaded first. (dlopen'ed
    libraries often land in holes above older ones: the documented limit of this approximation.)"""
    def unresolved(self, exe):
        raise thread_ctx._Unresolved("r_debug")

    monkeypatch.setattr(thread_ctx._Process, "link_order", unresolved)
    lib = build.lib("libpassive.so", "libpassive.c")
    build.lib("libother.so", "libother.c")
    exe = build("start-passive", "writer.c", "-DEXTERN_TLS", "-DEXE_OTHER_TLS", "-DWITH_OTHER",
                *NO_AS_NEEDED_LIBC, "-l:libother.so", "-l:libpassive.so")
    loc = check_writer([exe], "dtv")
    assert (loc.module, loc.modid) == (lib, 4)


def test_libraries_are_parsed_once_across_processes(build: Build, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    real = thread_ctx._read_elf

    def counting(f, abi):
        parsed.append(f.name)
        return real(f, abi)

    monkeypatch.setattr(thread_ctx, "_read_elf", counting)
    build.lib("libctx_gd.so", "libctx.c", "-mtls-dialect=gnu")
    build.lib("libother.so", "libother.c")
    exe = build("start-gd", "writer.c", "-DEXE_OTHER_TLS", "-DWITH_OTHER", *NO_AS_NEEDED_LIBC,
                "-l:libother.so", "-l:libctx_gd.so")
    locator = TlsLocator()
    check_writer([exe], "dtv", locator)
    first = len(parsed)
    check_writer([exe], "dtv", locator)
    assert first >= 4 and len(parsed) == first


def test_process_without_the_symbol_is_none(build: Build) -> None:
    build.lib("libother.so", "libother.c")
    build.lib("libctx_gd.so", "libctx.c", "-mtls-dialect=gnu")
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not os.readlink(f"/proc/{proc.pid}/exe").endswith("/cat") and time.monotonic() < deadline:
            time.sleep(0.01)  # until the exec is done: before it, this is a copy of Python
        assert TlsLocator().locate(proc.pid) is None
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_processes_with_the_same_files_are_answered_from_the_first_absence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second of two processes mapping the same files (none defines the symbol) is answered without a stat of
    its files; after ABSENT_S it is read again."""
    now = [100.0]
    locator = TlsLocator(monotonic=lambda: now[0])
    procs = [subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL) for _ in range(2)]
    stats: list[str] = []
    real_stat = os.stat

    def counting(path, *args, **kwargs):
        stats.append(str(path))
        return real_stat(path, *args, **kwargs)

    try:
        deadline = time.monotonic() + 10
        for p in procs:
            while not os.readlink(f"/proc/{p.pid}/exe").endswith("/cat") and time.monotonic() < deadline:
                time.sleep(0.01)
            while "libc" not in Path(f"/proc/{p.pid}/maps").read_text() and time.monotonic() < deadline:
                time.sleep(0.01)  # its libraries mapped: the same files as the other's from here on
        monkeypatch.setattr(os, "stat", counting)
        assert locator.locate(procs[0].pid) is None
        assert any(f"/proc/{procs[0].pid}/" in s for s in stats), stats
        stats.clear()
        assert locator.locate(procs[1].pid) is None
        assert stats == []
        now[0] += thread_ctx.ABSENT_S
        assert locator.locate(procs[1].pid) is None
        assert any(f"/proc/{procs[1].pid}/" in s for s in stats), stats
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=10)


def test_exited_process_is_an_error() -> None:
    child = subprocess.Popen(["true"])
    child.wait(timeout=10)
    with pytest.raises(ThreadCtxError, match=rf"^pid {child.pid}: .*exited"):
        TlsLocator().locate(child.pid)
    with pytest.raises(ThreadCtxError) as info:
        TlsLocator().locate(2**22 + 12345)  # beyond pid_max's range: never existed
    assert "\n" not in str(info.value)


def test_a_check_past_its_deadline_is_deferred_and_goes_on_from_the_files_it_read() -> None:
    """One file read per call once the deadline has passed: this interpreter maps dozens of ELF files, so a check
    with a deadline already gone is deferred call after call, and each call reads one more, until the answer,
    the same as one check without a deadline (the poll loop's turns stay short: appctx/watch.py)."""
    from retsnoop_otel.appctx.deferral import CheckDeferred

    parsed: list[str] = []
    real = thread_ctx._read_elf

    def counting(f, abi):
        parsed.append(f.name)
        return real(f, abi)

    locator, calls, answer = TlsLocator(), 0, None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(thread_ctx, "_read_elf", counting)
        while True:
            calls += 1
            before = len(parsed)
            try:
                answer = locator.locate(os.getpid(), deadline=0.0)
                break
            except CheckDeferred:
                assert len(parsed) == before + 1, parsed[before:]
            assert calls < 500
    assert calls >= 3 and answer == TlsLocator().locate(os.getpid())

"""read_process_context against real writers: a C program built here publishes an OTEP 4719 process context
exactly as the publication protocol says (memfd_create("OTEL_CTX") + ftruncate + mmap + close, MADV_DONTFORK,
header fields, a barrier, the signature last, prctl(PR_SET_VMA_ANON_NAME) attempted), with a payload the test
serialized with opentelemetry-proto; the reader must return exactly it, and nothing for invalid headers."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from retsnoop_otel.appctx.process_context import read_process_context

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the writer")

WRITER = r"""
#define _GNU_SOURCE
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif

struct otel_ctx {
    char signature[8];
    uint32_t version;
    uint32_t payload_size;
    uint64_t published_at_ns;
    uint64_t payload;
};

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    char *buf = malloc(1 << 20);
    *size = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int stdin_open(int timeout_ms) {
    struct pollfd p = {0, POLLIN, 0};
    char buf[64];
    if (poll(&p, 1, timeout_ms) <= 0) return 1;
    return read(0, buf, sizeof buf) > 0;
}

int main(int argc, char **argv) {
    const char *mode = argv[1];
    size_t size, other_size = 0;
    char *payload = slurp(argv[2], &size), *other = argc > 3 ? slurp(argv[3], &other_size) : NULL;
    size_t total = (sizeof(struct otel_ctx) + size + 4095) & ~(size_t)4095;
    struct otel_ctx *h;
    if (!strcmp(mode, "anon-shmem") || !strcmp(mode, "anon-private")) {
        int flags = !strcmp(mode, "anon-shmem") ? MAP_SHARED : MAP_PRIVATE;
        h = mmap(NULL, total, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
    } else {
        int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, total) < 0) { perror("memfd"); return 1; }
        h = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (h == MAP_FAILED) { perror("mmap"); return 1; }
    madvise(h, total, MADV_DONTFORK);
    char *where = payload;  /* "elsewhere": the heap */
    if (strcmp(mode, "memfd-elsewhere")) {
        where = (char *)(h + 1);  /* right after the header */
        memcpy(where, payload, size);
    }
    h->version = !strcmp(mode, "version-1") ? 1 : !strcmp(mode, "version-3") ? 3 : 2;
    h->payload_size = (uint32_t)size;
    h->published_at_ns = !strcmp(mode, "updating") ? 0 : now_ns();
    h->payload = (uint64_t)(uintptr_t)where;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memcpy(h->signature, !strcmp(mode, "bad-signature") ? "OTEL_CTY" : "OTEL_CTX", 8);
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)h, total, (unsigned long)"OTEL_CTX");
    printf("%d\n", (int)getpid());
    fflush(stdout);
    if (!strcmp(mode, "flip")) {
        /* The updating protocol, back and forth until stdin closes, rewriting the payload in place and slowly:
           a reader that skips published_at_ns == 0 or the header re-read sees half of each payload. */
        char *live = malloc(1 << 20);
        memcpy(live, payload, size);
        h->payload = (uint64_t)(uintptr_t)live;
        for (int n = 0; stdin_open(0); n++) {
            const char *src = n % 2 ? payload : other;
            size_t len = n % 2 ? size : other_size;
            h->published_at_ns = 0;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            memcpy(live, src, len / 2);
            usleep(100);
            memcpy(live + len / 2, src + len / 2, len - len / 2);
            h->payload_size = (uint32_t)len;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            h->published_at_ns = now_ns();
            usleep(200);
        }
        return 0;
    }
    while (stdin_open(-1)) {}
    return 0;
}
"""


def _kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def _resource(name: str, extra: int = 0, fill: str = "x") -> Resource:
    keys = ArrayValue(values=[AnyValue(string_value="http.route"), AnyValue(string_value="user")])
    return Resource(attributes=[
        _kv("service.name", string_value=name),
        _kv("threadlocal.schema_version", string_value="tls_v1"),
        _kv("threadlocal.attribute_key_map", array_value=keys),
        _kv("process.pid.extra", int_value=extra),
        _kv("feature.on", bool_value=True),
        _kv("ratio", double_value=0.25),
        _kv("padding", string_value=fill * extra),
    ])


EXPECTED = {
    "service.name": "checkout", "threadlocal.schema_version": "tls_v1",
    "threadlocal.attribute_key_map": ("http.route", "user"), "process.pid.extra": 0, "feature.on": True,
    "ratio": 0.25, "padding": "",
}


@pytest.fixture(scope="module")
def writer_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pctx")
    (root / "writer.c").write_text(WRITER)
    subprocess.run(["gcc", "-O1", "-o", str(root / "writer"), str(root / "writer.c")], check=True,
                   capture_output=True, text=True, timeout=120)
    return root / "writer"


class Writer:
    def __init__(self, exe: Path, mode: str, *payloads: Path) -> None:
        self.proc = subprocess.Popen([str(exe), mode, *map(str, payloads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = os.read(self.proc.stdout.fileno(), 64) if ready else b""
        if not line.strip().isdigit():
            self.close()
            raise AssertionError(f"writer {mode}: {line!r}")
        self.pid = int(line)

    def mapping_names(self) -> list[str]:
        with open(f"/proc/{self.pid}/maps") as f:
            return [parts[5].rstrip("\n") for parts in (line.split(None, 5) for line in f) if len(parts) == 6]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    path = tmp_path / "resource.pb"
    path.write_bytes(_resource("checkout").SerializeToString())
    return path


@pytest.mark.parametrize("mode", ["memfd-after", "memfd-elsewhere", "version-1", "anon-shmem", "anon-private"])
def test_published_context_is_read_back(writer_exe: Path, payload: Path, mode: str) -> None:
    writer = Writer(writer_exe, mode, payload)
    try:
        names = writer.mapping_names()
        if mode.startswith("anon") and not any("OTEL_CTX" in n for n in names):
            pytest.skip("this kernel cannot name anonymous mappings (CONFIG_ANON_VMA_NAME)")
        if mode.startswith(("memfd", "version")):
            assert "/memfd:OTEL_CTX (deleted)" in names
        ctx = read_process_context(writer.pid)
    finally:
        writer.close()
    assert ctx is not None
    assert ctx.attributes == EXPECTED
    assert ctx.schema_version == "tls_v1" and ctx.key_map == ("http.route", "user")
    assert abs(ctx.published_at_ns - time.time_ns()) < 60 * 10**9


@pytest.mark.parametrize("mode", ["updating", "bad-signature", "version-3"])
def test_invalid_header_is_no_context(writer_exe: Path, payload: Path, mode: str) -> None:
    writer = Writer(writer_exe, mode, payload)
    try:
        assert read_process_context(writer.pid) is None
    finally:
        writer.close()


def test_payload_that_does_not_decode_is_no_context(writer_exe: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\x0a\xff\xff\xff\x0f")  # field 1, a length far beyond the data
    writer = Writer(writer_exe, "memfd-after", garbage)
    try:
        assert read_process_context(writer.pid) is None
    finally:
        writer.close()


def test_concurrent_updates_never_give_a_torn_read(writer_exe: Path, tmp_path: Path) -> None:
    """The writer rewrites one payload buffer in place, in two halves with a pause between, alternating between
    two resources of the same encoded layout: every read must be exactly one of them, never half of each."""
    a, b = tmp_path / "a.pb", tmp_path / "b.pb"
    a.write_bytes(_resource("alpha", 200, "a").SerializeToString())
    b.write_bytes(_resource("omega", 200, "b").SerializeToString())
    assert len(a.read_bytes()) == len(b.read_bytes())
    writer = Writer(writer_exe, "flip", a, b)
    seen = []
    try:
        for _ in range(300):
            ctx = read_process_context(writer.pid)
            if ctx is not None:
                seen.append((ctx.attributes["service.name"], "".join(sorted(set(ctx.attributes["padding"])))))
    finally:
        writer.close()
    assert set(seen) == {("alpha", "a"), ("omega", "b")}
    assert len(seen) > 100


def test_process_without_context_or_gone_is_none() -> None:
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        assert read_process_context(proc.pid) is None
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert read_process_context(proc.pid) is None

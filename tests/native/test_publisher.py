"""The thread-context publisher (retsnoop_otel.publisher) as a reader outside the service finds it.

Every scenario runs in a child Python process with OTEL_PYTHON_CONTEXT=retsnoop_thread_ctx and the real
OpenTelemetry SDK. The child reads its thread's record twice: through the library's current() and, like an
out-of-process reader, through /proc/self/mem (the pointer in otel_thread_ctx_v1, then the record it points
to); both must agree. The process context is found the reader's way too: /proc/self/maps, then the header
and payload through /proc/self/mem. The ELF checks read the built library with pyelftools and nm.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from retsnoop_otel.publisher import native

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not native.LIBRARY.exists(), reason="libotel_thread_ctx.so not built (make bpf)")

PRELUDE = textwrap.dedent("""
    import asyncio, base64, ctypes, json, os, sys, threading
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
    from retsnoop_otel.publisher import native

    LIB = native.library()
    sampler = ParentBased(ALWAYS_OFF) if os.environ.get("TEST_UNSAMPLED") else ALWAYS_ON
    trace.set_tracer_provider(TracerProvider(sampler=sampler))
    tracer = trace.get_tracer("test")
    MEM = os.open("/proc/self/mem", os.O_RDONLY)

    def mem(addr, n):
        return os.pread(MEM, n, addr)

    def u64(addr):
        return int.from_bytes(mem(addr, 8), sys.byteorder)

    def parse(raw, ptr):
        size = int.from_bytes(raw[26:28], sys.byteorder)
        return {"ptr": ptr, "trace_id": raw[:16].hex(), "span_id": raw[16:24].hex(), "valid": raw[24],
                "flags": raw[25], "attrs_size": size, "attrs": raw[28:28 + size].hex()}

    def via_mem(var_addr):
        ptr = u64(var_addr)
        if not ptr:
            return None
        head = mem(ptr, 28)
        return parse(head + mem(ptr + 28, int.from_bytes(head[26:28], sys.byteorder)), ptr)

    def read_record(address):
        \"\"\"The record at `address`, read in-process: its head and attrs-data.\"\"\"
        head = ctypes.string_at(address, 28)
        size = int.from_bytes(head[26:28], sys.byteorder)
        return head + ctypes.string_at(address + 28, min(size, native.RECORD_SIZE - 28))

    def record():
        \"\"\"This thread's record: /proc/self/mem at otel_thread_ctx_v1, checked against current().\"\"\"
        seen = via_mem(LIB.otel_thread_ctx_addr())
        ptr = native.current()
        assert (seen and seen["ptr"]) == ptr, (seen, ptr)
        assert seen is None or parse(read_record(ptr), ptr) == seen
        return seen

    def ids(span):
        sc = span.get_span_context()
        return {"trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}", "flags": int(sc.trace_flags)}

    def otel_ctx_mappings():
        return [line.split() for line in open("/proc/self/maps")
                if "/memfd:OTEL_CTX" in line or "[anon_shmem:OTEL_CTX]" in line]

    def process_ctx():
        \"\"\"The header and payload, read as OTEP 4719's reader does.\"\"\"
        (m,) = otel_ctx_mappings()
        start = int(m[0].split("-")[0], 16)
        head = mem(start, 32)
        size = int.from_bytes(head[12:16], sys.byteorder)
        ptr = int.from_bytes(head[24:32], sys.byteorder)
        return {"start": start, "name": " ".join(m[5:]), "signature": head[:8].decode(),
                "version": int.from_bytes(head[8:12], sys.byteorder), "size": size,
                "published_at_ns": int.from_bytes(head[16:24], sys.byteorder), "payload_ptr": ptr,
                "payload": base64.b64encode(mem(ptr, size)).decode()}

    def vmflags(start):
        \"\"\"The VmFlags of the mapping at `start` (/proc/self/smaps).\"\"\"
        current = None
        for line in open("/proc/self/smaps"):
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                current = int(first.split("-")[0], 16)
            elif first == "VmFlags:" and current == start:
                return line.split()[1:]

    out = {}
""")


def run_child(body: str, warning: str | None = None, **env: str) -> dict:
    """Run PRELUDE + body in a child with the publisher selected; returns the `out` dict it prints.
    `warning`: the publisher's one warning expected on stderr (otherwise none)."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint('RESULT', json.dumps(out))\n"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RETSNOOP_OTEL_"))}
    full_env.update(OTEL_PYTHON_CONTEXT="retsnoop_thread_ctx", PYTHONPATH=str(ROOT), **env)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Failed to load context" not in proc.stderr, proc.stderr  # the API did not fall back
    if warning is None:
        assert "retsnoop-otel" not in proc.stderr, proc.stderr  # no warning of ours
    else:
        assert [ln for ln in proc.stderr.splitlines() if "retsnoop-otel" in ln] == [warning], proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def entries(attrs_hex: str) -> list[tuple[int, str]]:
    """attrs-data as (key index, value) pairs."""
    data, out, off = bytes.fromhex(attrs_hex), [], 0
    while off + 2 <= len(data):
        n = data[off + 1]
        out.append((data[off], data[off + 2:off + 2 + n].decode()))
        off += 2 + n
    assert off == len(data), "attrs-data holds whole entries only"
    return out


def resource_attrs(payload_b64: str) -> dict:
    def value(v):
        kind = v.WhichOneof("value")
        if kind == "array_value":
            return [value(x) for x in v.array_value.values]
        return getattr(v, kind)

    res = Resource()
    res.ParseFromString(base64.b64decode(payload_b64))
    return {kv.key: value(kv.value) for kv in res.attributes}


def holds(rec: dict, span: dict) -> bool:
    return (rec["valid"], rec["trace_id"], rec["span_id"], rec["flags"]) == (
        1, span["trace_id"], span["span_id"], span["flags"])


def test_record_follows_the_current_span() -> None:
    """No record before any span; a, then nested b, then a again; invalid (same record) after a."""
    out = run_child("""
        out["before"] = record()
        with tracer.start_as_current_span("a") as a:
            out["a"], out["in_a"] = ids(a), record()
            with tracer.start_as_current_span("b") as b:
                out["b"], out["in_b"] = ids(b), record()
            out["back_in_a"] = record()
        out["after"] = record()
    """)
    assert out["before"] is None  # the thread never attached a context: NULL pointer
    # sampled bit set; the SDK may also set W3C level 2's random-trace-id bit (0x02): published as the span has them
    assert holds(out["in_a"], out["a"]) and out["a"]["flags"] & 0x01 == 0x01
    assert holds(out["in_b"], out["b"]) and out["b"]["trace_id"] == out["a"]["trace_id"]
    assert holds(out["back_in_a"], out["a"])
    after = out["after"]
    assert after["valid"] == 0 and after["trace_id"] == "0" * 32 and after["attrs_size"] == 0
    # one fixed record: the pointer is set once and only `valid` toggles
    assert after["ptr"] == out["in_a"]["ptr"] == out["in_b"]["ptr"] == out["back_in_a"]["ptr"]
    assert out["in_a"]["ptr"] % 8 == 0


def test_two_threads_each_see_their_own_span() -> None:
    out = run_child("""
        both_in, done = threading.Barrier(2), threading.Barrier(2)
        def work(name):
            with tracer.start_as_current_span(name) as span:
                both_in.wait()  # the other thread is inside its span now
                out[name] = {"span": ids(span), "rec": record(), "var": LIB.otel_thread_ctx_addr()}
                done.wait()
            out[name + "_after"] = record()
        threads = [threading.Thread(target=work, args=(n,)) for n in ("t1", "t2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["main"] = record()
    """)
    t1, t2 = out["t1"], out["t2"]
    assert holds(t1["rec"], t1["span"]) and holds(t2["rec"], t2["span"])
    assert t1["span"]["span_id"] != t2["span"]["span_id"] and t1["span"]["trace_id"] != t2["span"]["trace_id"]
    assert t1["var"] != t2["var"] and t1["rec"]["ptr"] != t2["rec"]["ptr"]  # per-thread variable and record
    assert out["t1_after"]["valid"] == 0 and out["t2_after"]["valid"] == 0
    assert out["main"] is None  # the main thread never attached


def test_unsampled_span_is_published_with_flags_0() -> None:
    out = run_child("""
        with tracer.start_as_current_span("a", attributes={"http.route": "/x"}) as a:
            out["recording"] = a.is_recording()
            out["a"], out["in_a"] = ids(a), record()
    """, TEST_UNSAMPLED="1", RETSNOOP_OTEL_THREAD_ATTRIBUTES="http.route")
    assert out["recording"] is False and out["a"]["flags"] & ~0x02 == 0  # no sampled bit (0x02: random trace id)
    assert holds(out["in_a"], out["a"])
    assert out["in_a"]["attrs_size"] == 0  # a non-recording span has no attributes to copy


def test_configured_attributes_in_key_map_order() -> None:
    out = run_child("""
        attrs = {"user.id": 42, "http.route": "/users/{id}", "flag": True, "other": "not published"}
        with tracer.start_as_current_span("a", attributes=attrs):
            out["in_a"] = record()
            with tracer.start_as_current_span("b", attributes={"user.id": "7"}):
                out["in_b"] = record()
            out["back_in_a"] = record()
        out["ctx"] = process_ctx()
    """, RETSNOOP_OTEL_THREAD_ATTRIBUTES="http.route, user.id,missing,flag")
    key_map = resource_attrs(out["ctx"]["payload"])["threadlocal.attribute_key_map"]
    assert key_map == ["http.route", "user.id", "missing", "flag"]
    assert entries(out["in_a"]["attrs"]) == [(0, "/users/{id}"), (1, "42"), (3, "true")]
    assert entries(out["in_b"]["attrs"]) == [(1, "7")]
    assert entries(out["back_in_a"]["attrs"]) == entries(out["in_a"]["attrs"])
    named = {key_map[k]: v for k, v in entries(out["in_a"]["attrs"])}
    assert named == {"http.route": "/users/{id}", "user.id": "42", "flag": "true"}


def test_record_stays_within_640_bytes_cut_at_whole_entries() -> None:
    out = run_child("""
        attrs = {f"k{i}": "v" * 300 for i in range(5)}
        attrs["k0"] = "\\u00e9" * 200  # 400 bytes of utf-8: cut at 254, a character boundary
        with tracer.start_as_current_span("a", attributes=attrs):
            out["in_a"] = record()
        # the C side alone: a last entry whose length runs past the buffer is dropped
        ok = bytes([0, 2]) + b"ab"
        out["kept"] = LIB.otel_thread_ctx_set(bytes(range(1, 17)), bytes(range(1, 9)), 1, ok + bytes([1, 9, 1]), 7)
        out["raw"] = record()
        out["size"] = LIB.otel_thread_ctx_record_size()
    """, RETSNOOP_OTEL_THREAD_ATTRIBUTES="k0,k1,k2,k3,k4")
    got = entries(out["in_a"]["attrs"])
    assert got == [(0, "\u00e9" * 127), (1, "v" * 255)]  # 256 + 257 bytes; a third entry would pass 612
    assert 28 + out["in_a"]["attrs_size"] <= 640 == out["size"]
    assert out["kept"] == 4 and entries(out["raw"]["attrs"]) == [(0, "ab")] and out["raw"]["valid"] == 1


def test_process_context_published_then_updated() -> None:
    out = run_child("""
        import opentelemetry.context  # creates the runtime context: publishes once
        from opentelemetry.sdk.resources import Resource
        from retsnoop_otel.publisher import publish_process_context
        out["first"] = process_ctx()
        out["header"] = LIB.otel_process_ctx_header()
        out["vmflags"] = vmflags(out["first"]["start"])
        publish_process_context(Resource.create({"service.name": "svc-test", "service.version": "1.2.3"}))
        out["second"] = process_ctx()
        out["count"] = len(otel_ctx_mappings())
        pid = os.fork()
        if pid == 0:  # MADV_DONTFORK: the child has no mapping until it publishes its own
            inherited = len(otel_ctx_mappings())
            publish_process_context({"service.name": "child"})
            os._exit(0 if inherited == 0 and len(otel_ctx_mappings()) == 1 else 1)
        out["fork_child_status"] = os.waitpid(pid, 0)[1]
    """, OTEL_SERVICE_NAME="svc-test", OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test,team=a%2Cb",
        RETSNOOP_OTEL_THREAD_ATTRIBUTES="http.route,user.id")
    first, second = out["first"], out["second"]
    assert first["name"] in ("/memfd:OTEL_CTX (deleted)", "[anon_shmem:OTEL_CTX]")
    assert (first["signature"], first["version"]) == ("OTEL_CTX", 2) and first["start"] == out["header"]
    assert first["published_at_ns"] > 0 and first["size"] > 0
    assert "dc" in out["vmflags"]  # MADV_DONTFORK
    assert resource_attrs(first["payload"]) == {
        "service.name": "svc-test", "telemetry.sdk.language": "python", "deployment.environment.name": "test",
        "team": "a,b", "threadlocal.schema_version": "tls_v1",
        "threadlocal.attribute_key_map": ["http.route", "user.id"]}
    # the update: same mapping, new timestamp, new payload with the SDK resource and the same key map
    assert out["count"] == 1 and second["start"] == first["start"] and second["signature"] == "OTEL_CTX"
    assert second["published_at_ns"] > first["published_at_ns"]
    assert second["payload_ptr"] != first["payload_ptr"] and second["payload"] != first["payload"]
    attrs = resource_attrs(second["payload"])
    assert attrs["service.name"] == "svc-test" and attrs["service.version"] == "1.2.3"
    assert attrs["telemetry.sdk.name"] == "opentelemetry"
    assert attrs["threadlocal.schema_version"] == "tls_v1"
    assert attrs["threadlocal.attribute_key_map"] == ["http.route", "user.id"]
    assert out["fork_child_status"] == 0


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_memfd_refused_falls_back_to_named_shared_memory(tmp_path: Path) -> None:
    """memfd_create failing (as under a seccomp filter; here an LD_PRELOAD shim): a shared anonymous mapping
    named OTEL_CTX; on a kernel that cannot name it (no CONFIG_ANON_VMA_NAME) no reader could find it, so
    nothing is published, one warning says so, and thread records still work."""
    src = tmp_path / "nomemfd.c"
    src.write_text("#include <errno.h>\n"
                   "int memfd_create(const char *n, unsigned f) { (void)n; (void)f; errno = ENOSYS; return -1; }\n")
    shim = tmp_path / "nomemfd.so"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-o", str(shim), str(src)], check=True)
    body = """
        import opentelemetry.context
        out["memfd"] = ctypes.CDLL(None).memfd_create(b"x", 1)  # the shim is in place
        out["header"] = LIB.otel_process_ctx_header()
        out["ctx"] = process_ctx() if out["header"] else None
        with tracer.start_as_current_span("a") as a:
            out["a"], out["in_a"] = ids(a), record()
    """
    if _can_name_shmem():
        out = run_child(body, LD_PRELOAD=str(shim))
        assert out["ctx"]["name"] == "[anon_shmem:OTEL_CTX]" and out["ctx"]["start"] == out["header"]
        assert out["ctx"]["signature"] == "OTEL_CTX"
        assert resource_attrs(out["ctx"]["payload"])["threadlocal.schema_version"] == "tls_v1"
    else:
        msg = ("retsnoop-otel: the OTEL_CTX process context was not published: [Errno 95] cannot publish the "
               "OTEL_CTX process context: no memfd and the kernel cannot name the mapping")
        out = run_child(body, warning=msg, LD_PRELOAD=str(shim))
        assert out["header"] is None
    assert out["memfd"] == -1 and holds(out["in_a"], out["a"])


def _can_name_shmem() -> bool:
    """Whether this kernel names shared anonymous mappings (CONFIG_ANON_VMA_NAME, Linux 6.2+ for shmem)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    m = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    try:
        return libc.prctl(0x53564D41, 0, ctypes.c_void_p(addr), ctypes.c_size_t(4096), b"probe") == 0
    finally:
        m.close()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the thread pointer is read with x86-64 arch_prctl")
def test_reader_reaches_the_variable_through_the_dtv() -> None:
    """What the kernel reader does for a dlopen'd library: dtv = *(thread pointer + 8), then
    dtv[modid].val + the symbol's st_value from .dynsym, in the main thread and another thread."""
    value = dynsym()["otel_thread_ctx_v1"].entry.st_value
    out = run_child(f"""
        libc = ctypes.CDLL(None, use_errno=True)
        modid = ctypes.c_size_t()
        assert libc.dlinfo(ctypes.c_void_p(LIB._handle), 9, ctypes.byref(modid)) == 0  # RTLD_DI_TLS_MODID
        def walk():
            fs = ctypes.c_ulong()
            assert libc.syscall(158, 0x1003, ctypes.byref(fs)) == 0  # arch_prctl(ARCH_GET_FS)
            dtv = u64(fs.value + 8)
            var = u64(dtv + 16 * modid.value) + {value}
            return {{"var": var, "expected": LIB.otel_thread_ctx_addr(), "rec": via_mem(var), "own": record()}}
        with tracer.start_as_current_span("a") as a:
            out["a"], out["main"] = ids(a), walk()
            def other():
                with tracer.start_as_current_span("t") as t:
                    out["t"], out["thread"] = ids(t), walk()
            th = threading.Thread(target=other)
            th.start()
            th.join()
        out["modid"] = modid.value
    """)
    assert out["modid"] > 0
    for span, seen in ((out["a"], out["main"]), (out["t"], out["thread"])):
        assert seen["var"] == seen["expected"] and seen["rec"] == seen["own"] and holds(seen["rec"], span)


def test_asyncio_task_switch_leaves_the_last_attach_published() -> None:
    """The documented limit: the record follows the thread's last attach/detach, not the running task."""
    out = run_child("""
        async def main():
            a_in, b_done = asyncio.Event(), asyncio.Event()
            async def task_a():
                with tracer.start_as_current_span("a") as a:
                    out["a"], out["a_start"] = ids(a), record()
                    a_in.set()
                    await b_done.wait()
                    out["a_resumed"] = record()
                out["a_after"] = record()
            async def task_b():
                await a_in.wait()
                out["b_without_span"] = record()
                with tracer.start_as_current_span("b") as b:
                    out["b"], out["b_in"] = ids(b), record()
                out["b_after"] = record()
                b_done.set()
            await asyncio.gather(task_a(), task_b())
        asyncio.run(main())
    """)
    assert holds(out["a_start"], out["a"])
    assert holds(out["b_without_span"], out["a"])  # B has no span, the reader still sees A's
    assert holds(out["b_in"], out["b"]) and out["b"]["trace_id"] != out["a"]["trace_id"]  # b is a root: B's context
    assert out["b_after"]["valid"] == 0  # B's detach published B's own context: no span
    assert out["a_resumed"]["valid"] == 0  # A runs inside a again, but no attach/detach happened since
    assert out["a_after"]["valid"] == 0


def dynsym() -> dict:
    with open(native.LIBRARY, "rb") as f:
        elf = ELFFile(f)
        table = elf.get_section_by_name(".dynsym")
        assert isinstance(table, SymbolTableSection)
        return {s.name: s for s in table.iter_symbols() if s.name}


def test_library_exports_the_tls_symbol_with_tlsdesc_relocations() -> None:
    syms = dynsym()
    var = syms["otel_thread_ctx_v1"]
    assert (var["st_info"]["type"], var["st_info"]["bind"]) == ("STT_TLS", "STB_GLOBAL")
    assert var["st_shndx"] != "SHN_UNDEF" and var["st_other"]["visibility"] == "STV_DEFAULT" and var["st_size"] == 8
    defined = {n for n, s in syms.items() if s["st_shndx"] != "SHN_UNDEF"}
    assert defined == {"otel_thread_ctx_v1", "otel_thread_ctx_set", "otel_thread_ctx_clear", "otel_thread_ctx_current",
                       "otel_thread_ctx_addr", "otel_thread_ctx_record_size", "otel_process_ctx_publish",
                       "otel_process_ctx_header"}  # -fvisibility=hidden: nothing else
    tlsdesc = {"x86_64": 36, "aarch64": 1031}[platform.machine()]  # R_X86_64_TLSDESC, R_AARCH64_TLSDESC
    with open(native.LIBRARY, "rb") as f:
        elf = ELFFile(f)
        relocs = [(r["r_info_type"], r["r_info_sym"]) for sec in elf.iter_sections()
                  if isinstance(sec, RelocationSection) for r in sec.iter_relocations()]
        symtab = elf.get_section_by_name(".dynsym")
        names = {symtab.get_symbol(i).name for t, i in relocs if t == tlsdesc}
    assert "otel_thread_ctx_v1" in names  # the gnu2/desc dialect: TLSDESC, not __tls_get_addr
    assert not any(s == "__tls_get_addr" for s in syms)
    if shutil.which("nm"):
        nm = subprocess.run(["nm", "-D", "--defined-only", str(native.LIBRARY)], capture_output=True, text=True,
                            check=True).stdout
        assert any(line.split()[-1] == "otel_thread_ctx_v1" for line in nm.splitlines())


def test_missing_library_is_one_line_naming_gcc(tmp_path: Path) -> None:
    with pytest.raises(native.PublisherUnavailable) as err:
        native.library(tmp_path / "libotel_thread_ctx.so")
    assert "\n" not in str(err.value) and "Debian package 'gcc'" in str(err.value)

"""Guest side of the syscall preset (issue 46 point 5); host asserts: tests/vm/test_syscalls_preset.py.

One `trace --syscalls` run with the preset as shipped (its default budget, auto attach mode): every syscall entry
of the kernel and about a thousand errno-returning functions, attached in one call. A small workload makes bpf()
fail in array_map_alloc_check (BPF_MAP_CREATE of an array with max_entries 0) and then makes one failing openat();
the tracer follows its comm only (-n), so that the guest's other failing syscalls stay out of its output.

Then a 32-bit process of the same comm makes one failing open() through int 0x80: ia32 syscall 5, which is fstat's
number on x86-64. The preset's sessions start at the syscall tracepoints by number, so that call must not become a
failing `__x64_sys_newfstat` session (the compat check of bpf/syscalls.bpf.h).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.vm.scenarios.filters import SETTLE_S, json_sessions, stop_tracer

PY = sys.executable
COMM = "sysc_wl"
FAILS = 3
START_TIMEOUT_S = 900  # the preset's discovery and one-call attach of ~1,400 functions under TCG, with slack
WORKLOAD = f"""
import ctypes, os, resource
resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, b"{COMM}", 0, 0, 0)  # PR_SET_NAME: the tracer follows this comm only
attr = (ctypes.c_uint32 * 30)(2, 4, 4, 0)  # BPF_MAP_TYPE_ARRAY, key 4, value 4, max_entries 0
failed = sum(libc.syscall(321, 0, attr, ctypes.sizeof(attr)) < 0 for _ in range({FAILS}))
missing = libc.open(b"/nonexistent/sysc_wl", 0) < 0
print(failed, missing, flush=True)
"""
# open("/nonexistent/sysc_ia32", O_RDONLY) by int 0x80 (ia32 nr 5), then exit(-result): 2 (ENOENT) when it ran
IA32_ASM = """
.globl _start
.text
_start:
    movl $5, %eax
    movl $path, %ebx
    xorl %ecx, %ecx
    int $0x80
    movl %eax, %ebx
    negl %ebx
    movl $1, %eax
    int $0x80
.data
path: .asciz "/nonexistent/sysc_ia32"
"""


def build_ia32(tmpdir: str) -> str | None:
    """The 32-bit workload (binutils assembles and links i386 without a 32-bit libc); None off x86-64."""
    if os.uname().machine != "x86_64":
        return None
    src, obj, exe = (os.path.join(tmpdir, n) for n in ("ia32.s", "ia32.o", COMM))
    with open(src, "w") as f:
        f.write(IA32_ASM)
    subprocess.run(["as", "--32", "-o", obj, src], check=True)
    subprocess.run(["ld", "-m", "elf_i386", "-o", exe, obj], check=True)
    return exe


def _workloads(ctx, ia32: str | None, result: dict) -> None:
    """The failing bpf() and open() calls, then (x86-64) the 32-bit open, each waited for."""
    wl = ctx.spawn([PY, "-c", WORKLOAD])
    wl.popen.wait(300)
    result["workload"] = [wl.terminate(), wl.output().strip()]
    if ia32:
        result["ia32_rc"] = subprocess.run([ia32], timeout=60).returncode


def scenario_syscalls_preset(ctx) -> dict:
    t0 = time.monotonic()
    ia32 = build_ia32(ctx.tmpdir)
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "trace", "--syscalls", "-n", COMM, "--json", "-v"])
    tracer.wait_for_line(r"^Receiving data\.\.\.", timeout=START_TIMEOUT_S)
    result: dict = {"attach_s": round(time.monotonic() - t0, 1)}
    ctx.log(f"--syscalls tracer ready in {result['attach_s']} s")
    try:
        _workloads(ctx, ia32, result)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and len(json_sessions(tracer.output())) < FAILS + 1:
            time.sleep(1)
        tracer.wait_output_settled(SETTLE_S, timeout=120)
    finally:
        result["tracer"] = stop_tracer(ctx, tracer)
    out = result["tracer"]["output"]
    result["sessions"] = [s for s in json_sessions(out) if s["comm"] == COMM]
    # -v's lines but the sessions and the listing of the ~1,400 functions (indented)
    result["log"] = [line for line in out.splitlines() if not line.startswith(("{", " "))][:200]
    result["guest_seconds"] = round(time.monotonic() - t0, 1)
    return result


def scenario_syscalls_origins_only(ctx) -> dict:
    """`trace --syscalls --origins-only`: the preset's functions with their returns hooked only, the syscalls' at the
    sys_exit tracepoint (no session); the same workload, and the origin table at stop must count its failing calls."""
    import json

    t0 = time.monotonic()
    ia32 = build_ia32(ctx.tmpdir)
    tracer = ctx.spawn([PY, "-m", "retsnoop_otel", "trace", "--syscalls", "--origins-only", "-n", COMM, "--json",
                        "-v"])
    tracer.wait_for_line(r"^Receiving data\.\.\.", timeout=START_TIMEOUT_S)
    result: dict = {"attach_s": round(time.monotonic() - t0, 1)}
    try:
        _workloads(ctx, ia32, result)
        time.sleep(SETTLE_S)
    finally:
        result["tracer"] = stop_tracer(ctx, tracer)
    out = result["tracer"]["output"]
    result["sessions"] = json_sessions(out)
    result["table"] = [json.loads(line) for line in out.splitlines() if line.startswith('{"origins"')]
    result["log"] = [line for line in out.splitlines() if not line.startswith(("{", " "))][:200]
    return result


# functions of 1, 3 and 9 arguments (do_mmap's last three on the stack: the trampoline copies them to its frame),
# each called by what the scenario below does on its own thread
STACK_FUNCS = ("array_map_alloc_check", "path_openat", "do_mmap")
STACK_CALLS = 3


def scenario_stack_position(ctx) -> dict:
    """FEXIT_RET_SLOT (bpf/vmlinux_min.h), the stack pointer --origins-only's fexit.multi programs derive, against
    the one kretprobe.multi reads at the same returns (tests/native/stack_position.bpf.c): both kinds of link order
    one chain where the trampoline refuses a function. Where the feature check finds no fexit.multi, only that."""
    import ctypes
    import mmap
    import struct
    import threading

    from retsnoop_otel.kernel import bpfsys
    from retsnoop_otel.kernel import libbpf as lb
    from retsnoop_otel.kernel.libbpf_btf import BTF_KIND_FUNC, Btf
    from retsnoop_otel.kernel.modes.origin_fexits import probe_fexit_multi

    machine = os.uname().machine
    btf = Btf.load_vmlinux()
    try:
        feature = probe_fexit_multi(btf, machine)
        ids = {name: btf.find(name, BTF_KIND_FUNC) for name in STACK_FUNCS}
        args = {name: btf.shape(btf.shape(tid)[2])[1] for name, tid in ids.items() if tid}
    finally:
        btf.free()
    result: dict = {"fexit_multi": [feature.available, feature.detail], "args": args}
    if not feature.available:
        return result
    assert all(ids.values()), f"not in this kernel's BTF: {[n for n, i in ids.items() if not i]}"
    obj_path = os.path.join(ctx.tmpdir, "stack_position.bpf.o")
    include = os.path.join(ctx.cwd, "build", f"libbpf-{machine}", "include")
    rc, _, err = ctx.run(["clang", "-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", f"-I{include}", "-c",
                          os.path.join(ctx.cwd, "tests/native/stack_position.bpf.c"), "-o", obj_path], timeout=300)
    assert rc == 0, err
    obj = lb.BpfObject.open_file(obj_path)
    links: list[lb.Link] = []
    try:
        fexit, kret = obj.program("at_fexit"), obj.program("at_kretprobe")
        fexit.set_type(lb.PROG_TYPE_TRACING)
        fexit.set_expected_attach_type(bpfsys.ATTACH_TRACE_FEXIT_MULTI)
        for prog in (fexit, kret):
            prog.set_autoload(True)
        obj.load()
        cookies = list(range(len(STACK_FUNCS)))
        links.append(lb.Link(fd=bpfsys.link_create_tracing_multi(fexit.fd, [ids[n] for n in STACK_FUNCS], cookies,
                                                                  bpfsys.ATTACH_TRACE_FEXIT_MULTI)))
        links.append(kret.attach_kprobe_multi(syms=list(STACK_FUNCS), cookies=cookies, retprobe=True))
        obj.map("counts").update(struct.pack("I", 63), struct.pack("I", threading.get_native_id()))
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 30)(2, 4, 4, 0)  # an array map of max_entries 0: array_map_alloc_check fails
        for _ in range(STACK_CALLS):
            libc.syscall(321, 0, attr, ctypes.sizeof(attr))
            try:
                os.open("/nonexistent/stack_position", os.O_RDONLY)
            except OSError:
                pass
            mmap.mmap(-1, 4096).close()
        obj.map("counts").update(struct.pack("I", 63), struct.pack("I", 0))
        seen = obj.map("seen")
        result["sp"] = {name: [[int.from_bytes(seen.lookup(struct.pack("III", i, kind, call)) or b"", "little")
                                for call in range(STACK_CALLS)] for kind in (0, 1)]
                        for i, name in enumerate(STACK_FUNCS)}
    finally:
        for link in reversed(links):
            link.destroy()
        obj.close()
    return result

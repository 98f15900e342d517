"""Guest facts every other scenario relies on: kernel, BTF, tracefs, bpftool, loopback TCP.

Also exercises the Context itself (run, spawn/wait_for_line/terminate) inside the guest.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import time
from pathlib import Path

from tests.vm.guest_batch import Context

ECHO_SERVER = """
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print("LISTENING", s.getsockname()[1], flush=True)
conn, _ = s.accept()
conn.sendall(conn.recv(64).upper())
conn.close()
print("SERVED", flush=True)
import time
time.sleep(3600)
"""


SYS_BPF_X86_64 = 321
BPF_PROG_LOAD = 5
BPF_PROG_TYPE_SOCKET_FILTER = 1
PROBE_PROG_NAME = "smoke_probe"


def _load_socket_filter() -> int:
    """Load `r0 = 0; exit` as a named socket filter; returns its fd (the program lives while it is open)."""
    insns = struct.pack("<BBhi", 0xB7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)
    insn_buf = ctypes.create_string_buffer(insns, len(insns))
    license_buf = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("<IIQQ", attr, 0, BPF_PROG_TYPE_SOCKET_FILTER, 2, ctypes.addressof(insn_buf),
                     ctypes.addressof(license_buf))
    struct.pack_into("16s", attr, 48, PROBE_PROG_NAME.encode())
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(SYS_BPF_X86_64, BPF_PROG_LOAD, attr, len(attr))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "BPF_PROG_LOAD failed")
    return fd


def _mounts() -> dict[str, str]:
    """mount point -> filesystem type."""
    out = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3:
            out[fields[1]] = fields[2]
    return out


def _mount_options(point: Path) -> str:
    """The options of the mount that is on top at `point` (the last one listed there)."""
    found = ""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == str(point):
            found = fields[3]
    return found


def _tcp_echo(ctx: Context) -> dict:
    """A server on 127.0.0.1 in another process, reached from this one (later tests run gRPC like this)."""
    server = ctx.spawn([sys.executable, "-c", ECHO_SERVER])
    port = int(server.wait_for_line(r"LISTENING (\d+)", timeout=120).group(1))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(b"ping")
        reply = conn.recv(64)
    server.wait_for_line(r"SERVED", timeout=60)
    return {"port": port, "reply": reply.decode(), "server_rc": server.terminate(timeout=30)}


def scenario_smoke(ctx: Context) -> dict:
    rc, release, _ = ctx.run(["uname", "-r"], timeout=30)
    result: dict = {"uname_rc": rc, "release": release.strip(), "series": ctx.kernel_series,
                    "vmlinux": ctx.vmlinux, "vmlinux_exists": bool(ctx.vmlinux and Path(ctx.vmlinux).is_file()),
                    "btf_vmlinux": Path("/sys/kernel/btf/vmlinux").exists()}
    mounts = _mounts()
    result["tracefs_mounted"] = mounts.get("/sys/kernel/tracing") == "tracefs"
    result["repo_mount_options"] = _mount_options(Path(__file__).resolve().parents[3])
    result["debugfs_mounted"] = mounts.get("/sys/kernel/debug") == "debugfs"
    try:
        with open("/sys/kernel/tracing/available_filter_functions") as f:
            result["filter_functions"] = sum(1 for _ in f)
    except OSError as e:
        result["filter_functions_error"] = str(e)
    fd = _load_socket_filter()
    try:
        progs = ctx.bpf_prog_ids()
    finally:
        os.close(fd)
    result["probe_listed"] = [p for p in progs if p["name"] == PROBE_PROG_NAME]
    deadline = time.monotonic() + 30  # the id is released when the last reference goes; allow for lag
    while (after := [p for p in ctx.bpf_prog_ids() if p["name"] == PROBE_PROG_NAME]) and time.monotonic() < deadline:
        time.sleep(1)
    result["probe_listed_after_close"] = after
    result["tcp"] = _tcp_echo(ctx)
    return result

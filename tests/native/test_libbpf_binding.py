"""The ctypes binding against the real libbpf and the host kernel (no tracing privileges needed)."""

from __future__ import annotations

import errno
import struct

import pytest

from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import BTF_KIND_FUNC, BTF_KIND_FUNC_PROTO, Btf
from retsnoop_otel.kernel.tracer import bpf_object_path


def test_version_is_checked():
    assert lb.version() >= lb.MIN_VERSION


def test_missing_object_raises_with_errno():
    with pytest.raises(lb.LibbpfError) as exc:
        lb.BpfObject.open_file("/nonexistent/x.bpf.o")
    assert exc.value.errno == errno.ENOENT
    assert "open BPF object" in str(exc.value)


def test_maps_read_update_iterate_and_rodata():
    obj = lb.BpfObject.open_file(str(bpf_object_path()))
    try:
        for name in ("fentry_entry", "fexit_exit", "kmulti_entry", "kmulti_exit"):
            obj.program(name).set_autoload(False)
        layout = Btf.of_object(obj).datasec_vars(".rodata")
        assert layout["min_duration_ns"][1] == 8
        rodata = obj.map(".rodata")
        data = bytearray(rodata.initial_value())
        off, _ = layout["min_duration_ns"]
        data[off:off + 8] = struct.pack("<Q", 12345)
        rodata.set_initial_value(bytes(data))
        obj.map("func_infos").set_max_entries(3)
        obj.load()
        assert obj.map("func_infos").max_entries == 3
        # the kernel holds the configured value: read it back through the frozen map
        raw = rodata.lookup(struct.pack("<I", 0))
        assert raw is not None and struct.unpack_from("<Q", raw, off)[0] == 12345
        tgids = obj.map("tgid_filter")
        assert tgids.lookup(struct.pack("<I", 7)) is None
        tgids.update(struct.pack("<I", 7), b"\x01")
        tgids.update(struct.pack("<I", 9), b"\x02")
        assert tgids.lookup(struct.pack("<I", 7)) == b"\x01"
        assert sorted(struct.unpack("<I", k)[0] for k in tgids.keys()) == [7, 9]
        with pytest.raises(lb.LibbpfError) as exc:
            obj.program("kprobe_entry").attach_kprobe("no_such_kernel_function_xyz")
        assert exc.value.errno != 0
    finally:
        obj.close()


def test_kernel_btf_queries():
    btf = Btf.load_vmlinux()
    try:
        fid = btf.find("__sys_bpf", BTF_KIND_FUNC)
        assert fid
        proto = btf.type_by_id(btf.type_by_id(fid).size_or_type)
        assert proto.kind == BTF_KIND_FUNC_PROTO
        assert [name for name, _ in btf.func_params(proto.id)][:2] == ["cmd", "uattr"]
        assert btf.find("no_such_function_xyz", BTF_KIND_FUNC) is None
    finally:
        btf.free()


def test_refused_load_carries_errno_and_libbpf_log():
    """What the kernel refuses (here an ARRAY map of 0 entries) raises with the errno and libbpf's own
    explanation, not its debug chatter."""
    from retsnoop_otel.kernel.tracer import bpf_object_path
    obj = lb.BpfObject.open_file(str(bpf_object_path()))
    try:
        for name in ("fentry_entry", "fexit_exit", "kprobe_entry", "kretprobe_exit", "kmulti_entry", "kmulti_exit"):
            obj.program(name).set_autoload(name in ("kprobe_entry", "kretprobe_exit"))
        obj.map("func_infos").set_max_entries(0)
        with pytest.raises(lb.LibbpfError) as exc:
            obj.load()
    finally:
        obj.close()
    assert exc.value.errno == errno.EINVAL
    assert any("func_infos" in line for line in exc.value.log), exc.value.log
    assert not any("relo #" in line for line in exc.value.log), exc.value.log  # no debug-level lines
    assert "\n  " in str(exc.value)  # shown under the one-line summary

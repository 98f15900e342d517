"""-A decoding against the host kernel's real BTF (no tracing needed)."""

from __future__ import annotations

import struct

import pytest

from retsnoop_otel.capture.model import ArgValue
from retsnoop_otel.capture.records import ARG_PTR, ARG_RAW, ARG_STR
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.symbols.args import ArgFormatter, describe_args, spec_words


@pytest.fixture(scope="module")
def btf():
    b = Btf.load_vmlinux()
    yield b
    b.free()


def test_capture_plan_from_prototypes(btf):
    (attr,) = describe_args(btf, "array_map_alloc_check")
    assert (attr.name, attr.kind, attr.type_name) == ("attr", ARG_PTR, "union bpf_attr *")
    assert 0 < attr.size <= 256
    kinds = [d.kind for d in describe_args(btf, "bpf_obj_name_cpy")]
    assert kinds == [ARG_STR, ARG_STR, ARG_RAW]
    words = spec_words(describe_args(btf, "array_map_alloc_check"))
    assert words[0] == (ARG_PTR << 12) | attr.size and words[1:] == [0] * 5
    assert describe_args(btf, "no_such_function_xyz") == []


def test_union_bpf_attr_shows_map_create_fields(btf):
    descs = {0: describe_args(btf, "array_map_alloc_check")}
    data = struct.pack("<IIIII", 2, 4, 4, 0, 0) + bytes(200)
    (text,) = ArgFormatter(btf, descs).format(0, (ArgValue(0xffff888100000000, data),))
    assert text.startswith("attr=&{map_type=2,key_size=4,value_size=4,max_entries=0,map_flags=0,")
    assert len(text) <= len("attr=") + 120


def test_strings_ints_null_and_unreadable(btf):
    descs = {0: describe_args(btf, "bpf_obj_name_cpy")}
    fmt = ArgFormatter(btf, descs)
    vals = (ArgValue(0x1000, None), ArgValue(0x2000, b"simfail_map\0junk"), ArgValue(16))
    assert fmt.format(0, vals) == ["dst=0x1000", 'src="simfail_map"', "size=16"]
    assert fmt.format(0, (ArgValue(0), ArgValue(0), ArgValue(0)))[:2] == ["dst=NULL", "src=NULL"]
    assert ArgFormatter(btf, descs, show_pointers=False).format(0, vals)[0] == "dst=(unreadable)"

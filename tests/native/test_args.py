"""-A decoding against the host kernel's real BTF (no tracing needed)."""

from __future__ import annotations

import struct

import pytest

from retsnoop_otel.capture.model import ArgValue
from retsnoop_otel.capture.records import ARG_PTR, ARG_RAW, ARG_STR, MAX_ARG_DATA, ArgSizes
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
    assert len(text) <= len("attr=") + 120 + len("…")  # the value cut at args.fmt-max-arg-width, then the mark


def test_strings_ints_null_and_unreadable(btf):
    descs = {0: describe_args(btf, "bpf_obj_name_cpy")}
    fmt = ArgFormatter(btf, descs)
    vals = (ArgValue(0x1000, None), ArgValue(0x2000, b"simfail_map\0junk"), ArgValue(16))
    assert fmt.format(0, vals) == ["dst=0x1000", 'src="simfail_map"', "size=16"]
    assert fmt.format(0, (ArgValue(0), ArgValue(0), ArgValue(0)))[:2] == ["dst=NULL", "src=NULL"]
    assert ArgFormatter(btf, descs, show_pointers=False).format(0, vals)[0] == "dst=(unreadable)"


def test_sizes_cap_what_is_copied(btf):
    """args.max-*-size: strings and structs each capped, the call's total spent on the first arguments
    first; above MAX_ARG_DATA, what the kernel side copies at most, the size is capped there."""
    (attr,) = describe_args(btf, "array_map_alloc_check", ArgSizes(sized=16))
    assert attr.size == 16
    (attr,) = describe_args(btf, "array_map_alloc_check", ArgSizes(sized=16384))
    assert attr.size == min(MAX_ARG_DATA, attr.size) and attr.size > 16
    dst, src, _ = describe_args(btf, "bpf_obj_name_cpy", ArgSizes(string=8))
    assert (dst.size, src.size) == (8, 8)
    dst, src, _ = describe_args(btf, "bpf_obj_name_cpy", ArgSizes(total=300, string=16384))
    assert (dst.size, src.size) == (MAX_ARG_DATA, 300 - MAX_ARG_DATA)
    dst, src, _ = describe_args(btf, "bpf_obj_name_cpy", ArgSizes(total=10, string=10))
    assert (dst.size, src.size) == (10, 0)
    descs = {0: [dst, src, _]}
    vals = (ArgValue(0x2000, b"simfail_map\0"), ArgValue(0x3000, b"x\0"), ArgValue(16))
    # the kernel side copies a whole string: the formatter keeps args.max-str-arg-size of it
    assert ArgFormatter(btf, descs).format(0, vals) == ['dst="simfail_ma"', "src=(trunc)", "size=16"]


def test_format_modes_and_widths(btf):
    descs = {0: describe_args(btf, "array_map_alloc_check")}
    data = struct.pack("<IIIII", 2, 4, 4, 0, 0) + bytes(200)
    val = (ArgValue(0xffff888100000000, data),)
    (multi,) = ArgFormatter(btf, descs, mode="multiline").format(0, val)
    # retsnoop's multiline: `name = value`, zero fields left out
    assert multi.startswith("attr = &{map_type=2,key_size=4,value_size=4") and "=0" not in multi
    (verbose,) = ArgFormatter(btf, descs, mode="verbose", width=10).format(0, val)
    lines = verbose.splitlines()
    assert lines[:3] == ["attr = &{", "    map_type=2,", "    key_size=4,"] and lines[-1] == "}"
    assert "    max_entries=0," in lines and "…" not in verbose  # verbose: every field, no width limit
    (cut,) = ArgFormatter(btf, descs, width=20).format(0, val)
    assert cut == "attr=&{map_type=2,key_siz…"  # 20 characters of the value, then the mark
    (whole,) = ArgFormatter(btf, descs, width=0).format(0, val)
    assert "…" not in whole and whole.endswith("}") and len(whole) > 125
    (raw,) = ArgFormatter(btf, descs, raw_ptrs=True).format(0, val)
    assert raw.startswith("attr=(0xffff888100000000)&{map_type=2,")
    (hidden,) = ArgFormatter(btf, descs, raw_ptrs=True, show_pointers=False).format(0, val)
    assert hidden.startswith("attr=&{")  # exported data never carries a kernel address unless asked

"""A BPF object built from older sources is refused with the fix, not a KeyError."""

from __future__ import annotations

import errno

import pytest

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import capture_config, clones
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf


def test_an_object_without_a_setting_this_code_writes_says_to_rebuild_it(monkeypatch) -> None:
    class Rodata:
        def initial_value(self) -> bytes:
            return bytes(64)

    class Obj:
        path = "/pkg/bpf/retsnoop.bpf.o"

        def map(self, name: str) -> Rodata:
            assert name == ".rodata"
            return Rodata()

    class Layout:
        def datasec_vars(self, _sec: str) -> dict[str, tuple[int, int]]:
            return {"emit_calls": (0, 1)}  # an old object: none of the later settings

    monkeypatch.setattr(Btf, "of_object", staticmethod(lambda _obj: Layout()))
    funcs = [TracedFunc(1, "f", 0, RetKind.INT32, True)]
    with pytest.raises(lb.LibbpfError) as exc:
        capture_config.configure(Obj(), capture_config.CaptureConfig(mode="kprobe"), funcs,  # type: ignore[arg-type]
                                 clones.FentryPrograms(funcs, None), by_address=False, ncpus=1, hooks={})
    assert exc.value.errno == errno.ENOEXEC
    assert "/pkg/bpf/retsnoop.bpf.o was built from older sources" in str(exc.value)
    assert "func_counts" in str(exc.value) and "make bpf" in str(exc.value)

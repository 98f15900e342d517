"""A BPF object built from older sources is refused with the fix, not a KeyError."""

from __future__ import annotations

import errno

import pytest

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import tracer


def test_an_object_without_a_setting_this_code_writes_says_to_rebuild_it(monkeypatch) -> None:
    class Rodata:
        def initial_value(self) -> bytes:
            return bytes(64)

    class Obj:
        def map(self, name: str) -> Rodata:
            assert name == ".rodata"
            return Rodata()

    class Layout:
        def datasec_vars(self, _sec: str) -> dict[str, tuple[int, int]]:
            return {"emit_calls": (0, 1)}  # an old object: none of the later settings

    monkeypatch.setattr(lb, "num_possible_cpus", lambda: 1)
    monkeypatch.setattr(tracer.Btf, "of_object", staticmethod(lambda _obj: Layout()))
    t = tracer.Tracer([TracedFunc(1, "f", 0, RetKind.INT32, True)], tracer.CaptureConfig(mode="kprobe"))
    with pytest.raises(lb.LibbpfError) as exc:
        t._configure(Obj())  # type: ignore[arg-type]
    assert exc.value.errno == errno.ENOEXEC
    assert "func_counts" in str(exc.value) and "make bpf" in str(exc.value)

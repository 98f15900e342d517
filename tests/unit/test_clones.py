"""fentry clones are verified on as many threads as the CPUs this process may use."""

from __future__ import annotations

import os
import threading

from retsnoop_otel.kernel import clones
from retsnoop_otel.kernel import libbpf as lb


class F:
    def __init__(self, i: int) -> None:
        self.id = i


def _load(seen: set[int]):
    def load(f: F) -> clones.Clone:
        seen.add(threading.get_ident())
        if f.id == 3:
            raise lb.LibbpfError("refused", 22)
        return [(100 + f.id, 0, clones.TAGS["fexit_exit"])]
    return load


def test_one_usable_cpu_verifies_on_the_calling_thread() -> None:
    seen: set[int] = set()
    out = clones.load_all([F(i) for i in range(8)], _load(seen), threads=4, cpus=1)
    assert seen == {threading.get_ident()}
    assert out[0] == [(100, 0, clones.TAGS["fexit_exit"])] and isinstance(out[3], lb.LibbpfError)


def test_several_cpus_keep_each_functions_result() -> None:
    out = clones.load_all([F(i) for i in range(8)], _load(set()), threads=4, cpus=4)
    assert sorted(out) == list(range(8))
    assert all(out[i] == [(100 + i, 0, clones.TAGS["fexit_exit"])] for i in range(8) if i != 3)
    assert isinstance(out[3], lb.LibbpfError)


def test_usable_cpus_follow_the_affinity_mask() -> None:
    assert clones.usable_cpus() == len(os.sched_getaffinity(0)) <= (os.cpu_count() or 1)


def test_entry_functions_get_the_session_pair_and_the_others_the_inner_pair(monkeypatch) -> None:
    """Only entry functions start and end sessions: the rest are cloned from the smaller templates, under
    names of their own (which leftover checks and per-program statistics go by)."""
    from retsnoop_otel.capture.model import RetKind, TracedFunc
    from retsnoop_otel.kernel import libbpf_progs, tracer

    loaded: list[tuple[str, int, str]] = []

    def clone_program(prog, *, attach_btf_id: int, attach_type: int, name: str) -> int:  # noqa: ANN001
        loaded.append((prog.name, attach_btf_id, name))
        return 1000 + len(loaded)

    class Obj:
        def program(self, name: str) -> lb.BpfProgram:
            return lb.BpfProgram(0, name)

    monkeypatch.setattr(libbpf_progs, "clone_program", clone_program)
    monkeypatch.setattr(lb, "num_possible_cpus", lambda: 1)
    funcs = [TracedFunc(1, "__sys_bpf", 0, RetKind.INT32, True), TracedFunc(2, "map_create", 0, RetKind.INT32, False)]
    t = tracer.Tracer(funcs, tracer.CaptureConfig(mode="fentry"), btf_func_id={"__sys_bpf": 7, "map_create": 8}.get)
    t._obj = Obj()  # type: ignore[assignment]
    out = t._load_clones()
    assert loaded == [("fexit_exit", 7, "rs_fexit"), ("fentry_entry", 7, "rs_fentry"),
                      ("fexit_inner", 8, "rs_fexit_in"), ("fentry_inner", 8, "rs_fentry_in")]
    assert [tag for _, _, tag in out[2]] == ["rs_fexit_in", "rs_fentry_in"]
    assert [name for name, _ in t.programs()] == ["fexit_exit", "fentry_entry", "fexit_inner", "fentry_inner"]
    assert {tag for _, _, tag in loaded} | {"fexit_inner", "fentry_inner"} <= tracer.PROGRAM_NAMES

"""fentry clones are verified on as many threads as the CPUs this process may use."""

from __future__ import annotations

import concurrent.futures
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


def test_the_threads_are_bounded_by_the_usable_cpus(monkeypatch) -> None:
    """A cpuset, taskset or CPU quota (kernel/cgroups.py usable_cpus) leaves fewer CPUs than the machine has; a
    fraction of one more is worth a thread."""
    seen: list[int] = []

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, max_workers: int) -> None:
            seen.append(max_workers)
            super().__init__(max_workers)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(clones, "usable_cpus", lambda: 1.5)
    out = clones.load_all([F(i) for i in range(8)], _load(set()), threads=4)
    assert sorted(out) == list(range(8)) and seen == [2]


def test_entry_functions_get_the_session_pair_and_the_others_the_inner_pair(monkeypatch) -> None:
    """Only entry functions start and end sessions: the rest are cloned from the smaller templates, under
    names of their own (which leftover checks and per-program statistics go by). The function each
    template pair was verified against runs that pair itself: no clone of it is verified again."""
    from retsnoop_otel.capture.model import RetKind, TracedFunc
    from retsnoop_otel.kernel import libbpf_progs, tracer
    from retsnoop_otel.kernel.capture_config import CaptureConfig

    loaded: list[tuple[str, int, str]] = []

    def clone_program(prog, *, attach_btf_id: int, attach_type: int, name: str) -> int:  # noqa: ANN001
        loaded.append((prog.name, attach_btf_id, name))
        return 1000 + len(loaded)

    class Template:
        def __init__(self, name: str) -> None:
            self.name, self.fd = name, 50 + len(name)

    class Obj:
        def program(self, name: str) -> Template:
            return Template(name)

    monkeypatch.setattr(libbpf_progs, "clone_program", clone_program)
    monkeypatch.setattr(lb, "num_possible_cpus", lambda: 1)
    funcs = [TracedFunc(0, "no_btf_here", 0, RetKind.INT32, False),
             TracedFunc(1, "__sys_bpf", 0, RetKind.INT32, True), TracedFunc(2, "map_create", 0, RetKind.INT32, False),
             TracedFunc(3, "__x64_sys_bpf", 0, RetKind.INT32, True),
             TracedFunc(4, "array_map_alloc", 0, RetKind.INT32, False)]
    btf_ids = {"__sys_bpf": 7, "map_create": 8, "__x64_sys_bpf": 9, "array_map_alloc": 10}
    t = tracer.Tracer(funcs, CaptureConfig(mode="fentry"), btf_func_id=btf_ids.get)
    assert t._fentry.targets == {True: funcs[1], False: funcs[2]}  # the first of each kind with BTF
    assert (t._fentry.target(is_entry=True), t._fentry.target(is_entry=False)) == ("__sys_bpf", "map_create")
    t._obj = Obj()  # type: ignore[assignment]
    out = t._fentry.load(t._obj)
    assert isinstance(out[0], lb.LibbpfError) and "needs BTF" in str(out[0])
    assert loaded == [("fexit_exit", 9, "rs_fexit"), ("fentry_entry", 9, "rs_fentry"),
                      ("fexit_inner", 10, "rs_fexit_in"), ("fentry_inner", 10, "rs_fentry_in")]
    assert out[1] == [(50 + len("fexit_exit"), libbpf_progs.ATTACH_TRACE_FEXIT, "rs_fexit"),
                      (50 + len("fentry_entry"), libbpf_progs.ATTACH_TRACE_FENTRY, "rs_fentry")]
    assert [tag for _, _, tag in out[2]] == ["rs_fexit_in", "rs_fentry_in"]
    assert [tag for _, _, tag in out[4]] == ["rs_fexit_in", "rs_fentry_in"]
    assert [name for name, _ in t.programs()] == ["fexit_exit", "fentry_entry", "fexit_inner", "fentry_inner"] * 2
    assert {tag for _, _, tag in loaded} | {"fexit_inner", "fentry_inner"} <= tracer.PROGRAM_NAMES
    closed: list[int] = []
    monkeypatch.setattr(clones.os, "close", closed.append)
    t.detach()  # the clones' fds only: the templates belong to the object
    assert sorted(closed) == [1001, 1002, 1003, 1004] and t.programs() == []


def test_after_a_refused_template_target_the_templates_are_verified_against_a_harmless_function() -> None:
    """The kernel refuses fentry programs for some functions (a variadic one): if the first of a kind is
    one, the object would not load at all. The retry verifies the templates elsewhere, and every traced
    function then gets a clone of its own (the refused one fails alone)."""
    from retsnoop_otel.capture.model import RetKind, TracedFunc

    funcs = [TracedFunc(1, "__sys_bpf", 0, RetKind.INT32, True), TracedFunc(2, "_printk", 0, RetKind.INT32, False)]
    fp = clones.FentryPrograms(funcs, {"__sys_bpf": 7, "_printk": 8, "do_sys_openat2": 9}.get)
    assert fp.target(is_entry=False) == "_printk"
    fp.verify_against_harmless()
    assert fp.targets == {} and fp.target(is_entry=True) == fp.target(is_entry=False) == "do_sys_openat2"
    assert clones.FentryPrograms(funcs, None).target(is_entry=True) == "__sys_bpf"
    assert clones.FentryPrograms(funcs, {"_printk": 8}.get).targets == {False: funcs[1]}


def test_fsession_clones_one_program_per_function_from_its_kind_of_template(monkeypatch) -> None:
    """fsession mode: the fentry pair's work in one program per function (entry and exit), cloned the same way from
    the template of the function's kind, under names the leftover checks know."""
    from retsnoop_otel.capture.model import RetKind, TracedFunc
    from retsnoop_otel.kernel import bpfsys, libbpf_progs, tracer
    from retsnoop_otel.kernel.capture_config import CaptureConfig

    loaded: list[tuple[str, int, int, str]] = []

    def clone_program(prog, *, attach_btf_id: int, attach_type: int, name: str) -> int:  # noqa: ANN001
        loaded.append((prog.name, attach_btf_id, attach_type, name))
        return 1000 + len(loaded)

    class Template:
        def __init__(self, name: str) -> None:
            self.name, self.fd = name, 50 + len(name)

    class Obj:
        def program(self, name: str) -> Template:
            return Template(name)

    monkeypatch.setattr(libbpf_progs, "clone_program", clone_program)
    monkeypatch.setattr(lb, "num_possible_cpus", lambda: 1)
    funcs = [TracedFunc(1, "__sys_bpf", 0, RetKind.INT32, True), TracedFunc(2, "map_create", 0, RetKind.INT32, False),
             TracedFunc(3, "array_map_alloc", 0, RetKind.INT32, False)]
    t = tracer.Tracer(funcs, CaptureConfig(mode="fsession"),
                      btf_func_id={"__sys_bpf": 7, "map_create": 8, "array_map_alloc": 9}.get)
    t._obj = Obj()  # type: ignore[assignment]
    out = t._fentry.load(t._obj)
    fs = bpfsys.ATTACH_TRACE_FSESSION
    assert out[1] == [(50 + len("fsession_entry"), fs, "rs_fsession")]  # the templates' own targets
    assert out[2] == [(50 + len("fsession_inner"), fs, "rs_fsession_in")]
    assert loaded == [("fsession_inner", 9, fs, "rs_fsession_in")]
    assert [name for name, _ in t.programs()] == ["fsession_entry", "fsession_inner", "fsession_inner"]
    assert {"rs_fsession", "rs_fsession_in", "fsession_entry", "fsession_inner", "fsession_multi"} \
        <= tracer.PROGRAM_NAMES

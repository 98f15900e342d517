"""kprobe.multi links on kernels that refuse large ones with ENOMEM (Linux 6.7-6.11's objpool bug): the group is
split in halves until each link fits, every function is attached exactly once, and other errors stay errors.
fsession.multi's one tracing_multi link is halved the same way around the functions the kernel refuses."""

from __future__ import annotations

import errno
import struct
from types import SimpleNamespace

import pytest

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import libbpf_btf as lbtf
from retsnoop_otel.kernel import multi_link
from retsnoop_otel.kernel.modes import fsession_multi, kprobe_multi, origin_fexits
from retsnoop_otel.kernel.modes.base import AttachReport, Job


class FakeProgram:
    """Refuses links of more than `fits` functions the way 6.7-6.11 refuse large kretprobe.multi links."""

    def __init__(self, name: str, fits: int, err: int = errno.ENOMEM) -> None:
        self.name, self.fits, self.err = name, fits, err
        self.linked: list[list[int]] = []

    def attach_kprobe_multi(self, *, addrs=None, syms=None, retprobe=False, cookies=None) -> lb.Link:
        where = list(addrs if addrs is not None else syms)
        if len(where) > self.fits:
            raise lb.LibbpfError(f"attach kprobe.multi to {len(where)} functions", self.err)
        self.linked.append(where)
        return lb.Link(fd=-1)


def _funcs(n: int) -> list[TracedFunc]:
    return [TracedFunc(i, f"f{i}", 0x1000 + i, RetKind.INT32, i == 0) for i in range(n)]


def _attach_kprobe_multi(progs: list[FakeProgram], funcs: list[TracedFunc], links: list[lb.Link]) -> int:
    """kprobe_multi mode's attach on an object of these programs; returns the splits made."""
    obj = SimpleNamespace(program={p.name: p for p in progs}.__getitem__)
    report = AttachReport()
    kprobe_multi.MODE.attach(Job(obj, funcs, links, None, None, True, links.clear),  # type: ignore[arg-type]
                             report, None, False)
    return report.split_links


def test_a_link_the_kernel_has_no_memory_for_is_split_until_each_part_fits() -> None:
    funcs = _funcs(10)
    progs = [FakeProgram("kmulti_exit", fits=3), FakeProgram("kmulti_inner", fits=100),
             FakeProgram("kmulti_entry", fits=100)]
    links: list[lb.Link] = []
    splits = _attach_kprobe_multi(progs, funcs, links)
    exits = progs[0].linked
    assert [a for part in exits for a in part] == [f.addr for f in funcs]  # each exit once, in order
    assert max(len(part) for part in exits) <= 3 and splits == len(exits) - 1
    # one entry function: the entry program's link takes every function (multi_link.one_link)
    assert progs[1].linked == [] and progs[2].linked == [[f.addr for f in funcs]]
    assert len(links) == len(exits) + 1


def test_many_entry_functions_keep_a_link_of_their_own_and_few_share_the_others() -> None:
    """Past the addresses the entry program holds, the functions that cannot start a session go by kmulti_inner;
    within them one link for all, and the program told the entry addresses (the publish hooks' among them)."""
    few = multi_link.FEW_ENTRIES - multi_link.PUBLISH_ROOM
    for entries, one in ((few, True), (few + 1, False)):
        funcs = [TracedFunc(i, f"f{i}", 0x1000 + i, RetKind.INT32, i < entries) for i in range(entries + 5)]
        progs = [FakeProgram("kmulti_exit", fits=100), FakeProgram("kmulti_inner", fits=100),
                 FakeProgram("kmulti_entry", fits=100)]
        _attach_kprobe_multi(progs, funcs, [])
        assert multi_link.one_link(funcs) is one
        loads = ("kmulti_entry", "kmulti_exit") if one else kprobe_multi.MODE.programs
        assert kprobe_multi.MODE.autoload(funcs) == loads
        if one:
            assert progs[1].linked == [] and progs[2].linked == [[f.addr for f in funcs]]
        else:
            assert progs[1].linked == [[f.addr for f in funcs[entries:]]]
            assert progs[2].linked == [[f.addr for f in funcs[:entries]]]
    publish = [TracedFunc(0xFFFFFF00 + i, f"p{i}", 0x9000 + i, RetKind.SIGNED, True) for i in range(2)]
    funcs = [TracedFunc(i, f"f{i}", 0x1000 + i, RetKind.INT32, i < few) for i in range(few + 5)]
    values = multi_link.one_link_rodata(funcs, publish)
    addrs = struct.unpack(f"<{multi_link.FEW_ENTRIES}Q", values["few_entry_ips"])
    assert values["one_link"] == b"\x01" and struct.unpack("<I", values["few_entry_cnt"]) == (multi_link.FEW_ENTRIES,)
    assert addrs == (*(0x1000 + i for i in range(few)), 0x9000, 0x9001)
    assert multi_link.one_link_rodata([*funcs, TracedFunc(99, "g", 0x2000, RetKind.INT32, True)], publish) == {}


def test_other_errors_are_not_split() -> None:
    progs = [FakeProgram("kmulti_exit", fits=3, err=errno.EINVAL), FakeProgram("kmulti_inner", fits=100),
             FakeProgram("kmulti_entry", fits=100)]
    links: list[lb.Link] = []
    with pytest.raises(lb.LibbpfError) as exc:
        _attach_kprobe_multi(progs, _funcs(10), links)
    assert exc.value.errno == errno.EINVAL
    assert progs[0].linked == []  # by address, then by name: both refused whole


class FakeBtf:
    """Kernel BTF with functions 100.. each taking a pointer and returning int; `variadic` ones end in '...'."""

    def __init__(self, variadic: set[int]) -> None:
        self.variadic, self.freed = variadic, False

    def shape(self, tid: int) -> tuple[int, int, int]:
        if tid >= 1000:  # FUNC_PROTO of function tid - 1000, returning int
            return lbtf.BTF_KIND_FUNC_PROTO, len(self.param_types(tid)), 1
        if tid >= 100:  # FUNC
            return lbtf.BTF_KIND_FUNC, 0, 1000 + tid
        return (lbtf.BTF_KIND_INT, 0, 4) if tid == 1 else (lbtf.BTF_KIND_PTR, 0, 1)

    def param_types(self, proto_id: int) -> list[int]:
        return [2, 0] if proto_id - 1000 in self.variadic else [2]

    def free(self) -> None:
        self.freed = True


def test_fsession_multi_links_the_set_once_with_each_id_as_its_cookie(monkeypatch: pytest.MonkeyPatch) -> None:
    """One tracing_multi link: the functions by BTF id, each with its function id as cookie. The kernel refuses a
    link whole for one function it cannot trace: then the functions whose prototype it refuses (f5, variadic) are
    left out without asking it, and what it still refuses (f4) is halved out; the rest stays attached. Functions
    without vmlinux BTF (f7) are left out before the kernel is asked at all."""
    btf = {f"f{i}": 100 + i for i in range(10) if i != 7}  # f7: a module function, not in vmlinux's BTF
    bad = {100 + 4, 100 + 5}  # the kernel refuses f4 and f5 (EINVAL)
    calls: list[tuple[list[int], list[int]]] = []

    def link_create(prog_fd: int, btf_ids, cookies, attach_type: int) -> int:
        assert attach_type == fsession_multi.bpfsys.ATTACH_TRACE_FSESSION_MULTI
        calls.append((list(btf_ids), list(cookies)))
        if bad & set(btf_ids):
            raise OSError(errno.EINVAL, "bpf(BPF_LINK_CREATE tracing_multi)")
        return -1

    class Prog:
        fd = 5

    monkeypatch.setattr(fsession_multi.bpfsys, "link_create_tracing_multi", link_create)
    links: list[lb.Link] = []
    fake = FakeBtf(variadic={105})
    refused = fsession_multi.attach_set(Prog(), _funcs(10), btf.get, links, load_btf=lambda: fake)  # type: ignore
    assert calls[0] == ([100 + i for i in range(10) if i != 7], [i for i in range(10) if i != 7])
    assert fake.freed and not any(105 in ids for ids, _ in calls[1:])  # f5 was not offered again
    assert sorted(f.name for f, _ in refused) == ["f4", "f5", "f7"]
    why = dict((f.name, str(exc)) for f, exc in refused)
    assert why["f4"].startswith("attach fsession.multi to f4: Invalid argument")
    assert why["f5"].startswith("fsession.multi cannot attach f5: it takes variable arguments")
    assert "needs BTF for f7" in why["f7"]
    linked = sorted(i for ids, _ in calls[1:] if not bad & set(ids) for i in ids)
    assert linked == sorted(v for v in btf.values() if v not in bad)  # every other function exactly once
    assert len(links) == len(calls) - sum(1 for ids, _ in calls if bad & set(ids))


def test_the_kernels_prototype_rules_for_trampolines() -> None:
    """btf_distill_func_proto() (7.2) and x86-64's trampoline: what trampoline_fit refuses, from real kernel BTF."""
    from retsnoop_otel.kernel import trampoline_fit
    from retsnoop_otel.kernel.libbpf_btf import Btf
    btf = Btf.load_vmlinux()
    try:
        names = ("_printk", "do_exit", "__sys_bpf", "bpf_fentry_test1", "map_create")
        ids = {name: btf.find(name, lbtf.BTF_KIND_FUNC) for name in names}
        assert all(ids.values()), ids
        why = trampoline_fit.refusals(btf, ((tid, name) for name, tid in ids.items()))
        assert why == {ids["_printk"]: "it takes variable arguments", ids["do_exit"]: "it never returns"}
    finally:
        btf.free()


def test_fsession_multi_errors_of_the_whole_request_are_not_halved(monkeypatch: pytest.MonkeyPatch) -> None:
    def link_create(prog_fd: int, btf_ids, cookies, attach_type: int) -> int:
        raise OSError(errno.EPERM, "bpf(BPF_LINK_CREATE tracing_multi)")

    class Prog:
        fd = 5

    monkeypatch.setattr(fsession_multi.bpfsys, "link_create_tracing_multi", link_create)
    with pytest.raises(lb.LibbpfError) as exc:
        fsession_multi.attach_set(Prog(), _funcs(10), {f"f{i}": i + 1 for i in range(10)}.get, [])  # type: ignore
    assert exc.value.errno == errno.EPERM


def test_prototype_rules_on_a_made_up_btf() -> None:
    """Struct returns, struct arguments over 16 bytes, more than 12 arguments or 8-byte slots are refused; a
    16-byte struct argument takes two slots; typedefs are looked through."""
    from retsnoop_otel.kernel import trampoline_fit
    k = lbtf
    types = {1: (k.BTF_KIND_INT, 0, 8), 2: (k.BTF_KIND_STRUCT, 1, 16), 3: (k.BTF_KIND_STRUCT, 1, 24),
             4: (k.BTF_KIND_TYPEDEF, 0, 2), 5: (k.BTF_KIND_PTR, 0, 3)}
    protos = {"ok": (1, [1, 4, 5]), "struct_ret": (2, [1]), "big_arg": (1, [3]), "many": (1, [1] * 13),
              "slots": (1, [4] * 6 + [1]), "six_pairs": (1, [4] * 6)}

    class Btf:
        def shape(self, tid: int) -> tuple[int, int, int]:
            if tid >= 2000:  # FUNC_PROTO
                ret, params = list(protos.values())[tid - 2000]
                return k.BTF_KIND_FUNC_PROTO, len(params), ret
            if tid >= 1000:  # FUNC
                return k.BTF_KIND_FUNC, 0, tid + 1000
            return types[tid]

        def param_types(self, proto_id: int) -> list[int]:
            return list(protos.values())[proto_id - 2000][1]

    why = trampoline_fit.refusals(Btf(), ((1000 + i, name) for i, name in enumerate(protos)))  # type: ignore
    names = {1000 + i: name for i, name in enumerate(protos)}
    assert {names[tid]: text.split(" ")[1] for tid, text in why.items()} == {
        "struct_ret": "return", "big_arg": "argument", "many": "has", "slots": "arguments"}


def test_origins_only_by_fexit_multi_leaves_what_the_trampoline_refuses_on_kretprobe_multi(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """origin_fexits: the inner functions in one fexit.multi link per return kind; a module function (no vmlinux BTF
    id) goes with the entry functions to kretprobe.multi, to the program of its kind; each function attached once."""
    funcs = [TracedFunc(0, "entry", 0x1000, RetKind.INT32, True), TracedFunc(1, "a", 0x1001, RetKind.INT32, False),
             TracedFunc(2, "b", 0x1002, RetKind.POINTER, False), TracedFunc(3, "mod", 0x1003, RetKind.INT32, False)]
    tracing: list[tuple[int, list[int], int]] = []

    def link_create(prog_fd: int, btf_ids, cookies, attach_type: int) -> int:
        tracing.append((prog_fd, list(cookies), attach_type))
        return -1

    class Prog(FakeProgram):
        def __init__(self, name: str, fd: int = 0) -> None:
            super().__init__(name, fits=100)
            self.fd = fd

    progs = {p.name: p for p in (Prog("origin_entry_exit"), Prog("origin_exit_int"), Prog("origin_exit_ptr"),
                                 Prog("origin_fexit_int", 7), Prog("origin_fexit_ptr", 8))}
    monkeypatch.setattr(fsession_multi.bpfsys, "link_create_tracing_multi", link_create)
    links: list[lb.Link] = []
    report = AttachReport()
    job = Job(SimpleNamespace(program=progs.__getitem__), funcs, links, None,  # type: ignore[arg-type]
              {"a": 101, "b": 102, "entry": 100}.get, True, links.clear)
    origin_fexits.MODE.attach(job, report, None, False)
    fexit = origin_fexits.bpfsys.ATTACH_TRACE_FEXIT_MULTI
    assert sorted(tracing) == [(7, [1], fexit), (8, [2], fexit)]
    assert progs["origin_exit_int"].linked == [[0x1003]] and progs["origin_entry_exit"].linked == [[0x1000]]
    assert progs["origin_exit_ptr"].linked == []
    assert sorted(f.id for f in report.attached) == [0, 1, 2, 3] and len(links) == 4

"""The thread-context publish hooks: kprobes on the two syscalls' functions where the attach mode proves the kernel
has kprobe.multi, syscall tracepoints elsewhere; named the same in the program metrics either way."""

from __future__ import annotations

import pytest

from retsnoop_otel.kernel import app_hooks
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.attach_modes import BY_NAME


class Prog:
    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail
        self.autoload: bool | None = None
        self.attached: list[tuple] = []
        self.untraceable: tuple[str, ...] = ()
        self.fd = -1

    def set_autoload(self, on: bool) -> None:
        self.autoload = on
        self.fd = 10 if on else -1

    def _attach(self, *how: object) -> lb.Link:
        if self.fail:
            raise lb.LibbpfError("attach kprobe.multi to 1 functions", 2)
        self.attached.append(how)
        return lb.Link(fd=None)

    def attach_raw_tracepoint(self, tp: str) -> lb.Link:
        return self._attach("raw_tp", tp)

    def attach_tracepoint(self, category: str, name: str) -> lb.Link:
        return self._attach("tp", category, name)

    def attach_kprobe_multi(self, *, syms: list[str], cookies: list[int]) -> lb.Link:
        if any(s in self.untraceable for s in syms):
            raise lb.LibbpfError(f"attach kprobe.multi to {len(syms)} functions", 3)
        return self._attach("kprobe.multi", *zip(syms, cookies, strict=True))


class Obj:
    def __init__(self, failing: tuple[str, ...] = (), untraceable: tuple[str, ...] = ()) -> None:
        self.progs = {n: Prog(n, n in failing) for n in app_hooks.PROGRAMS}
        for p in self.progs.values():
            p.untraceable = untraceable

    def program(self, name: str) -> Prog:
        return self.progs[name]


@pytest.mark.parametrize(("feature", "machine", "want"), [
    ("kprobe_session", "x86_64", True), ("kprobe_multi", "aarch64", True),
    ("kprobes", "x86_64", False),  # 5.10's default: no kprobe.multi shown
    ("fentry", "x86_64", False), ("kprobe_session", "riscv64", False), ("", "x86_64", False)])
def test_kprobes_only_where_the_attach_mode_proves_kprobe_multi(feature: str, machine: str, want: bool) -> None:
    assert app_hooks.by_kprobe(feature, machine) is want


@pytest.mark.parametrize("kprobes", [True, False])
def test_one_kind_of_publish_hook_loads(kprobes: bool) -> None:
    obj = Obj()
    app_hooks.configure(obj, app_context=True, kprobes=kprobes)  # type: ignore[arg-type]
    loaded = {n for n, p in obj.progs.items() if p.autoload}
    assert loaded == {app_hooks.EXEC_PROGRAM, *((app_hooks.PUBLISH_KPROBE,) if kprobes else app_hooks.PUBLISH_PROGRAMS)}
    off = Obj()
    app_hooks.configure(off, app_context=False, kprobes=kprobes)  # type: ignore[arg-type]
    assert not any(p.autoload for p in off.progs.values())


def test_kprobes_attach_to_the_syscalls_entry_functions_of_the_architecture_by_one_link() -> None:
    obj = Obj()
    app_hooks.configure(obj, True, True)  # type: ignore[arg-type]
    links: list[lb.Link] = []
    assert app_hooks.attach(obj, links, True, "aarch64") == []  # type: ignore[arg-type]
    # one kprobe.multi link (one detach), the cookie naming the syscall as bpf/appctx.bpf.h reads it
    assert obj.progs["app_pub_kp"].attached == [("kprobe.multi", ("__arm64_sys_memfd_create", 0),
                                                  ("__arm64_sys_prctl", 1))]
    assert obj.progs["app_publish"].attached == [] and len(links) == 2
    # the program metrics name the kprobe program as the memfd_create tracepoint's: it runs at both
    assert sorted(n for n, _ in app_hooks.programs(obj, links)) == ["app_exec", "app_publish"]  # type: ignore[arg-type]


def test_a_publish_kprobe_that_does_not_attach_is_named_not_fatal() -> None:
    obj = Obj(untraceable=("__x64_sys_prctl",))
    app_hooks.configure(obj, True, True)  # type: ignore[arg-type]
    links: list[lb.Link] = []
    missing = app_hooks.attach(obj, links, True, "x86_64")  # type: ignore[arg-type]
    assert len(missing) == 1 and missing[0].startswith("kprobe __x64_sys_prctl (attach kprobe.multi to 1 functions")
    assert obj.progs["app_pub_kp"].attached == [("kprobe.multi", ("__x64_sys_memfd_create", 0))]  # the other alone
    assert len(links) == 2
    none = Obj(failing=("app_pub_kp",))
    app_hooks.configure(none, True, True)  # type: ignore[arg-type]
    assert len(app_hooks.attach(none, [], True, "x86_64")) == 2  # type: ignore[arg-type]


def test_tracepoints_where_there_is_no_kprobe_multi() -> None:
    obj = Obj()
    app_hooks.configure(obj, True, False)  # type: ignore[arg-type]
    links: list[lb.Link] = []
    assert app_hooks.attach(obj, links, False, "x86_64") == []  # type: ignore[arg-type]
    assert obj.progs["app_publish"].attached == [("tp", "syscalls", "sys_enter_memfd_create")]
    assert obj.progs["app_pub_kp"].attached == []


def _func(name: str, entry: bool = True, fid: int = 0):
    from retsnoop_otel.capture.model import RetKind, TracedFunc
    return TracedFunc(fid, name, 0x1000 + fid, RetKind.SIGNED, entry)


TARGETS = (("__x64_sys_memfd_create", 0xffffffff81300000), ("__x64_sys_prctl", 0xffffffff81100000))


def test_publish_targets_need_both_functions_once_and_traceable() -> None:
    addrs = dict(TARGETS)
    assert app_hooks.publish_targets(addrs.get, "x86_64") == TARGETS  # in cookie order
    assert app_hooks.publish_targets({TARGETS[0][0]: 1}.get, "x86_64") == ()  # prctl not traceable, or twice
    assert app_hooks.publish_targets(addrs.get, "riscv64") == ()


def test_the_publish_hooks_join_the_entry_link_of_kprobe_session_and_kprobe_multi() -> None:
    funcs = [_func("__x64_sys_bpf"), _func("array_map_alloc_check", entry=False, fid=1)]
    for mode in (BY_NAME["kprobe_session"], BY_NAME["kprobe_multi"]):
        pub = app_hooks.folded(mode, TARGETS, funcs)
        # ids above every traced function's (bpf/appctx.bpf.h APP_PUB_ID), in the cookies' order
        assert [(f.id, f.name, f.addr, f.is_entry) for f in pub] == [
            (app_hooks.PUB_ID, "__x64_sys_memfd_create", 0xffffffff81300000, True),
            (app_hooks.PUB_ID + 1, "__x64_sys_prctl", 0xffffffff81100000, True)]
    assert app_hooks.folded(BY_NAME["fentry"], TARGETS, funcs) == [] and \
        app_hooks.folded(BY_NAME["kprobe"], TARGETS, funcs) == [] and app_hooks.folded(None, TARGETS, funcs) == []
    assert app_hooks.folded(BY_NAME["kprobe_session"], (), funcs) == []
    assert app_hooks.folded(BY_NAME["kprobe_session"], TARGETS, funcs[1:]) == []  # no entry link (the preset's)
    traced = [*funcs, _func("__x64_sys_prctl", fid=2)]
    assert app_hooks.folded(BY_NAME["kprobe_session"], TARGETS, traced) == []  # the user's own: a link of their own


def test_folded_publish_hooks_load_and_attach_no_program_of_their_own() -> None:
    obj = Obj()
    app_hooks.configure(obj, True, True, fold=True)  # type: ignore[arg-type]
    assert {n for n, p in obj.progs.items() if p.autoload} == {app_hooks.EXEC_PROGRAM}
    links: list[lb.Link] = []
    assert app_hooks.attach(obj, links, True, "x86_64", fold=True) == []  # type: ignore[arg-type]
    assert obj.progs["app_pub_kp"].attached == [] and len(links) == 1  # the exec hook's
    assert [n for n, _ in app_hooks.programs(obj, links)] == ["app_exec"]  # type: ignore[arg-type]

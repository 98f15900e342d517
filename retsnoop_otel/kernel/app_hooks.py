"""The kernel side's hooks for the thread-context watcher (bpf/appctx.bpf.h, records for appctx/watch.py): a
process's exec, and its creation of an OTEL_CTX process context. Loaded and attached only for probe sets that
read thread context.

The exec hook is a raw tracepoint (every kernel from 5.10 on, and allowed where tracing programs are not); it
is required. The publish hooks are one program on the two syscalls' entry functions, by one kprobe.multi link
(its cookie says which syscall), where the run's attach mode shows the kernel has kprobe.multi, and syscall
tracepoints elsewhere (CONFIG_FTRACE_SYSCALLS, and tracefs to find them). A syscall tracepoint costs every
syscall of every task while attached and takes two RCU grace periods to detach (bpf/appctx.bpf.h); the kprobes
cost only memfd_create and prctl, and before 6.14 every kprobe.multi link took grace periods of its own to detach
(80-140 ms on 6.12 in the emulated VM): one link, not two, and none of their own where the attach mode links its
entry functions by kprobe.session or kprobe.multi: there the two functions join that link (fold), under ids above
every traced function's in map ip_ids, and the mode's entry program hands their calls to the publish code. Without
a publish hook the watcher still finds a process from its exec by its timed checks, later, so a hook that does not
attach is named in the attach report instead of refusing the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb

if TYPE_CHECKING:
    from retsnoop_otel.kernel.modes.base import AttachMode

EXEC_PROGRAM = "app_exec"  # on sched_process_exec
PUBLISH_PROGRAMS = {"app_publish": ("syscalls", "sys_enter_memfd_create"),  # memfd_create("OTEL_CTX", ...)
                    "app_publish_vma": ("syscalls", "sys_enter_prctl")}  # prctl(PR_SET_VMA, ..., "OTEL_CTX")
PUBLISH_KPROBE = "app_pub_kp"  # both, by kprobe.multi: its cookie is the syscall's place in PUBLISH_SYSCALLS
PUBLISH_SYSCALLS = ("memfd_create", "prctl")  # bpf/appctx.bpf.h APP_PUB_MEMFD_CREATE, APP_PUB_PRCTL
PUBLISH_KPROBE_SHOWN = next(iter(PUBLISH_PROGRAMS))  # its name in the program metrics: the first tracepoint's
PROGRAMS = (EXEC_PROGRAM, *PUBLISH_PROGRAMS, PUBLISH_KPROBE)
KPROBE_MULTI_FEATURES = frozenset({"kprobe_multi", "kprobe_session"})  # attach modes that prove kprobe.multi works
PUB_ID = 0xFFFFFF00  # bpf/appctx.bpf.h APP_PUB_ID: the first publish hook's id in ip_ids, the cookie's order after
SYSCALL_PREFIXES = {"x86_64": "__x64_sys_", "aarch64": "__arm64_sys_"}  # the syscalls' entry functions (uname -m)


def by_kprobe(feature: str, machine: str) -> bool:
    """Whether the publish hooks go by kprobe.multi: the run's attach mode (its feature name) uses it, so the kernel
    has it, and the entry functions' names are known for this architecture."""
    return feature in KPROBE_MULTI_FEATURES and machine in SYSCALL_PREFIXES


def publish_targets(addr_of: Callable[[str], int | None], machine: str | None = None) -> tuple[tuple[str, int], ...]:
    """(name, address) of the publish hooks' functions, in cookie order, for a fold; () when this architecture's
    (uname -m) names are unknown or either is not found once in kallsyms, or not traceable (`addr_of` says None)."""
    machine = machine or os.uname().machine
    if machine not in SYSCALL_PREFIXES:
        return ()
    found = []
    for name in (SYSCALL_PREFIXES[machine] + syscall for syscall in PUBLISH_SYSCALLS):
        addr = addr_of(name)
        if addr is None:
            return ()
        found.append((name, addr))
    return tuple(found)


def folded(mode: AttachMode | None, targets: Sequence[tuple[str, int]], kfuncs: Sequence[TracedFunc]
           ) -> list[TracedFunc]:
    """The publish hooks as members of the mode's entry link, or [] where they go by a link of their own: a mode
    whose entry link does not take them (takes_publish), no targets, no entry function for the mode to link (the
    syscall preset's entries at the tracepoints), or either function traced (its calls are the user's there)."""
    if mode is None or not mode.takes_publish or not targets or not any(f.is_entry for f in kfuncs):
        return []
    if {name for name, _ in targets} & {f.name for f in kfuncs}:
        return []
    return [TracedFunc(PUB_ID + i, name, addr, RetKind.SIGNED, True) for i, (name, addr) in enumerate(targets)]


def configure(obj: lb.BpfObject, app_context: bool, kprobes: bool, fold: bool = False) -> None:
    """Before load: the hooks' programs are loaded only when the probe set reads thread context, the publish hooks
    of one kind (`kprobes`: by_kprobe's answer), none where they are folded into the mode's entry link."""
    publish = () if fold else (PUBLISH_KPROBE,) if kprobes else tuple(PUBLISH_PROGRAMS)
    for name in PROGRAMS:
        obj.program(name).set_autoload(app_context and (name == EXEC_PROGRAM or name in publish))


def attach(obj: lb.BpfObject, links: list[lb.Link], kprobes: bool, machine: str, fold: bool = False) -> list[str]:
    """Attach the hooks, appending their links (the exec hook's alone where the publish hooks are folded: the mode
    attached them); returns the publish hooks that did not attach, with why."""
    links.append(obj.program(EXEC_PROGRAM).attach_raw_tracepoint("sched_process_exec"))
    missing: list[str] = []
    if fold:
        return missing
    if kprobes:
        prog = obj.program(PUBLISH_KPROBE)
        funcs = [SYSCALL_PREFIXES[machine] + syscall for syscall in PUBLISH_SYSCALLS]
        try:
            links.append(prog.attach_kprobe_multi(syms=funcs, cookies=list(range(len(funcs)))))
            return missing
        except lb.LibbpfError:
            pass  # one of them is not traceable here: each alone, so that the other still reports
        for cookie, func in enumerate(funcs):
            try:
                links.append(prog.attach_kprobe_multi(syms=[func], cookies=[cookie]))
            except lb.LibbpfError as exc:
                missing.append(f"kprobe {func} ({str(exc).splitlines()[0]})")
        return missing
    for name, (category, event) in PUBLISH_PROGRAMS.items():
        try:
            links.append(obj.program(name).attach_tracepoint(category, event))
        except lb.LibbpfError as exc:
            missing.append(f"tracepoint {category}:{event} ({str(exc).splitlines()[0]})")
    return missing


def programs(obj: lb.BpfObject, links: list[lb.Link]) -> list[tuple[str, int]]:
    """(name, fd) of the hooks' loaded programs while attached, for their run counts and times. The kprobe program
    of both publish hooks is named as the first tracepoint program (`app_publish`): it runs at both syscalls."""
    if not links:
        return []
    return [(PUBLISH_KPROBE_SHOWN if name == PUBLISH_KPROBE else name, fd) for name in PROGRAMS
            if (fd := obj.program(name).fd) >= 0]


def detach(links: list[lb.Link]) -> list[lb.Link]:
    """Destroys the links; returns the empty list the caller keeps."""
    for link in reversed(links):
        link.destroy()
    return []

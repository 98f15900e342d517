"""fsession_multi mode (--fsession-multi): one fsession.multi program, loaded without a target function, in one
tracing_multi link for the whole set (bpfsys: libbpf 1.1 cannot create these links), each function by its vmlinux
BTF id with its id as cookie. Linux 7.2+."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys, clones, trampoline_fit
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup, probe_fsession_kind
from retsnoop_otel.kernel.modes.base import AttachMode, AttachReport, Job, OnError
from retsnoop_otel.kernel.multi_link import link_halving

# errors of the whole request, not of one of its functions: halving a tracing_multi link would only repeat them
_NOT_PER_FUNCTION = (errno.EPERM, errno.EACCES, errno.EFAULT, errno.ENOMEM)


def probe_fsession_multi(btf: Btf | FuncIdLookup | None) -> Feature:
    """BPF_TRACE_FSESSION_MULTI through a tracing_multi link (Linux 7.2+): one link for a whole function set."""
    return probe_fsession_kind("fsession_multi", "fsession.multi", "Linux 7.2", btf, multi=True)


def attach_set(prog: lb.BpfProgram, funcs: Sequence[TracedFunc], btf_func_id: Callable[[str], int | None] | None,
              links: list[lb.Link], load_btf: Callable[[], Btf] = Btf.load_vmlinux,
              attach_type: int = bpfsys.ATTACH_TRACE_FSESSION_MULTI) -> list[tuple[TracedFunc, lb.LibbpfError]]:
    """fsession.multi: the set in one tracing_multi link, each function by its vmlinux BTF id with its id as cookie;
    returns the functions left out and why. The kernel takes or refuses a link whole (kernel/bpf/trampoline.c: a
    function it cannot trace refuses them all). After a refusal the functions whose BTF prototype it refuses are
    left out (trampoline_fit.py) and the rest linked again; what it still refuses is halved until the refused
    functions stand alone (k of n cost about 2k*log2(n) more attempts and leave about k*log2(n) links)."""
    refused: list[tuple[TracedFunc, lb.LibbpfError]] = []
    targets: dict[int, TracedFunc] = {}
    for f in funcs:
        btf_id = btf_func_id(f.name) if btf_func_id else None
        if btf_id is None:  # the program was loaded against vmlinux's BTF: a module's functions are not in it
            refused.append((f, lb.LibbpfError(f"fsession.multi needs BTF for {f.name} (module functions and functions "
                                              "without BTF are not supported in fsession.multi mode; use -K)",
                                              errno.EOPNOTSUPP)))
        elif btf_id in targets:  # the kernel refuses a link naming a function twice
            refused.append((f, lb.LibbpfError(f"{f.name} is the same BTF function as {targets[btf_id].name}, attached "
                                              "once", errno.EEXIST)))
        else:
            targets[btf_id] = f

    def link(group: Sequence[tuple[int, TracedFunc]]) -> lb.Link:
        what = group[0][1].name if len(group) == 1 else f"{len(group)} functions"
        try:
            return lb.Link(fd=bpfsys.link_create_tracing_multi(prog.fd, [i for i, _ in group],
                                                               [f.id for _, f in group], attach_type))
        except OSError as exc:
            raise lb.LibbpfError(f"attach fsession.multi to {what}", exc.errno or errno.EINVAL) from None

    items = list(targets.items())
    if not items:
        return refused
    try:
        links.append(link(items))
        return refused
    except lb.LibbpfError as exc:
        if exc.errno in _NOT_PER_FUNCTION:
            raise
    btf = load_btf()
    try:
        unfit = trampoline_fit.refusals(btf, ((i, f.name) for i, f in items))
    finally:
        btf.free()
    refused += [(f, lb.LibbpfError(f"fsession.multi cannot attach {f.name}: {unfit[i]}", errno.EINVAL))
                for i, f in items if i in unfit]
    fit = [(i, f) for i, f in items if i not in unfit]
    _, alone = link_halving(fit, link, links, lambda exc: exc.errno not in _NOT_PER_FUNCTION) if fit else (0, [])
    return refused + [(f, exc) for (_, f), exc in alone]


class FsessionMulti(AttachMode):
    name = "fsession_multi"
    flags = ("--fsession-multi",)
    help = "attach with fsession.multi: one program in one link for every function (Linux 7.2+)"
    shown = "--fsession-multi (fsession.multi)"
    feature = "fsession_multi"
    programs = ("fsession_multi",)
    position, offer_rank = 5, 2
    trampoline = True

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_fsession_multi(btf)

    def prepare(self, obj: lb.BpfObject, progs: Sequence[str], fentry: clones.FentryPrograms) -> None:
        for name in progs:  # loaded without a target function
            obj.program(name).set_type(lb.PROG_TYPE_TRACING)
            obj.program(name).set_expected_attach_type(bpfsys.ATTACH_TRACE_FSESSION_MULTI)

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        """The functions the kernel refuses are reported (or raised, if `strict`) like fentry's."""
        refused = attach_set(job.obj.program(self.programs[0]), job.funcs, job.btf_func_id, job.links)
        if refused and strict:
            raise refused[0][1]
        left_out = {f.id for f, _ in refused}
        report.attached.extend(f for f in job.funcs if f.id not in left_out)
        report.failed.extend((f, str(exc)) for f, exc in refused)
        for f, why in report.failed if on_error else ():
            on_error(f, why)


MODE = FsessionMulti()

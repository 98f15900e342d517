"""kprobe_session mode (--kprobe-session): kprobe.session links, one program at a function's entry and exit that
tells the kernel at entry whether to run it at exit. libbpf 1.1 cannot create these links: bpfsys does.
Linux 6.10+."""

from __future__ import annotations

import errno
from collections.abc import Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys, clones, multi_link
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup, probe_fprobe_link
from retsnoop_otel.kernel.modes.base import AttachMode, AttachReport, Job, OnError


def probe_kprobe_session(btf: Btf | FuncIdLookup | None) -> Feature:
    """Attach a kprobe.session program (BPF_TRACE_KPROBE_SESSION, Linux 6.10+) to one function."""
    return probe_fprobe_link("kprobe_session", "kprobe.session", bpfsys.ATTACH_TRACE_KPROBE_SESSION,
                              b"rs_probe_ksess", btf,
                              ("the kernel does not know kprobe.session links (Linux 6.10+ needed)",
                               "has no kprobe.session (Linux 6.10+ needed)"), "kprobe.session")


def link(prog: lb.BpfProgram, retprobe: bool, addrs: Sequence[int] = (), syms: Sequence[str] = ()) -> lb.Link:
    try:
        fd = bpfsys.link_create_kprobe_multi(prog.fd, syms=syms, addrs=addrs,
                                             attach_type=bpfsys.ATTACH_TRACE_KPROBE_SESSION)
    except OSError as exc:
        raise lb.LibbpfError(f"attach kprobe.session to {len(addrs) or len(syms)} functions",
                             exc.errno or errno.EINVAL) from None
    return lb.Link(fd=fd)


class KprobeSession(AttachMode):
    name = "kprobe_session"
    flags = ("--kprobe-session",)
    help = "attach with kprobe.session: one program at entry and exit (Linux 6.10+)"
    shown = "--kprobe-session (kprobe.session)"
    feature = "kprobe_session"
    programs = ("ksession", "ksession_inner")
    position, auto_rank, offer_rank = 3, 0, 0
    by_address = True
    takes_publish = True
    joins_entries = True

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_kprobe_session(btf)

    def autoload(self, funcs: Sequence[TracedFunc]) -> tuple[str, ...]:
        return self.programs[:1] if multi_link.one_link(funcs) else self.programs

    def prepare(self, obj: lb.BpfObject, progs: Sequence[str], fentry: clones.FentryPrograms) -> None:
        for name in progs:  # declared kprobe.multi: libbpf 1.1 knows no kprobe.session section
            obj.program(name).set_expected_attach_type(bpfsys.ATTACH_TRACE_KPROBE_SESSION)

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        """Every function in the entry program's link where the entry functions are few (multi_link.one_link);
        else the functions that only record inside a session (ksession_inner), then the entry functions. The
        publish hooks folded into the entry link."""
        entry = job.obj.program(self.programs[0])
        groups: list[multi_link.Group]
        if multi_link.one_link(job.funcs):
            groups = [(entry, [*job.funcs, *job.publish], False)]
        else:
            groups = [(job.obj.program(self.programs[1]), [f for f in job.funcs if not f.is_entry], False),
                      (entry, [*(f for f in job.funcs if f.is_entry), *job.publish], False)]
        report.split_links = multi_link.attach(groups, link, job.links, job.detach)
        report.attached.extend(job.funcs)


MODE = KprobeSession()

"""kprobe_multi mode (-M): kprobe.multi and kretprobe.multi links (libbpf), a whole function set in a few links
(kernel/multi_link.py). Linux 5.18+."""

from __future__ import annotations

from collections.abc import Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys, multi_link
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup, probe_fprobe_link
from retsnoop_otel.kernel.modes.base import AttachMode, AttachReport, Job, OnError


def probe_kprobe_multi(btf: Btf | FuncIdLookup | None) -> Feature:
    """Attach a kprobe.multi program (BPF_LINK_CREATE, BPF_TRACE_KPROBE_MULTI) to one function."""
    return probe_fprobe_link("kprobe_multi", "kprobe.multi", bpfsys.ATTACH_TRACE_KPROBE_MULTI, b"rs_probe_kmulti",
                              btf, ("the kernel does not know kprobe.multi programs (Linux 5.18+ needed)",
                                    "has no kprobe_multi (Linux 5.18+ needed)"), "kprobe_multi")


def link(prog: lb.BpfProgram, retprobe: bool, addrs: Sequence[int] = (), syms: Sequence[str] = ()) -> lb.Link:
    how = {"addrs": addrs} if addrs else {"syms": syms}
    return prog.attach_kprobe_multi(**how, retprobe=retprobe)


class KprobeMulti(AttachMode):
    name = "kprobe_multi"
    flags = ("-M", "--kprobes-multi")
    help = "attach with kprobe.multi/kretprobe.multi"
    shown = "-M (kprobe_multi)"
    feature = "kprobe_multi"
    programs = ("kmulti_entry", "kmulti_exit", "kmulti_inner")
    position, auto_rank, offer_rank = 2, 1, 1
    by_address = True
    takes_publish = True
    joins_entries = True

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_kprobe_multi(btf)

    def autoload(self, funcs: Sequence[TracedFunc]) -> tuple[str, ...]:
        return self.programs[:2] if multi_link.one_link(funcs) else self.programs

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        """Exits of every function, then the functions that only record inside a session (kmulti_inner: a call
        outside one costs one session lookup, without finding its function id), then the entry functions (with the
        publish hooks folded into their link: their exits are not needed). Where the entry functions are few
        (multi_link.one_link), the entry program's link takes the others too."""
        entry, exit_ = (job.obj.program(name) for name in self.programs[:2])
        groups: list[multi_link.Group] = [(exit_, job.funcs, True)]
        if multi_link.one_link(job.funcs):
            groups.append((entry, [*job.funcs, *job.publish], False))
        else:
            groups += [(job.obj.program(self.programs[2]), [f for f in job.funcs if not f.is_entry], False),
                       (entry, [*(f for f in job.funcs if f.is_entry), *job.publish], False)]
        report.split_links = multi_link.attach(groups, link, job.links, job.detach)
        report.attached.extend(job.funcs)


MODE = KprobeMulti()

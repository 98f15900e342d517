"""origin_exits mode (--origins-only): error origins counted from the returns alone (bpf/origins.bpf.h), by
kretprobe.multi links, the function id in each function's BPF cookie; the syscall entries the number table knows end
at the sys_exit tracepoint instead (kernel/syscall_hooks.py). No session, no entry program, nothing
recorded or reported but the origin counts (map origin_stats): what a preset that makes every syscall an entry can
afford (bench/RESULTS.md "Syscall preset"). Linux 5.18+ (kprobe.multi); on 7.2+ (x86-64) the inner returns go by
fexit.multi instead (modes/origin_fexits.py, the runtime's choice: attach_modes.cheapest)."""

from __future__ import annotations

from collections.abc import Sequence

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import multi_link
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup
from retsnoop_otel.kernel.modes.base import AttachMode, AttachReport, Job, OnError
from retsnoop_otel.kernel.modes.kprobe_multi import probe_kprobe_multi

# the program of an inner function's return, by its return kind (its failure test is a constant there)
BY_KIND = {RetKind.INT32: "origin_exit_int", RetKind.UNKNOWN: "origin_exit_int", RetKind.SIGNED: "origin_exit_long",
           RetKind.POINTER: "origin_exit_ptr", RetKind.VOID: "origin_exit_never", RetKind.BOOL: "origin_exit_never",
           RetKind.UNSIGNED: "origin_exit_never"}


class OriginExits(AttachMode):
    name = "origin_exits"
    flags = ("--origins-only",)
    help = ("with --syscalls: count error origins from the returns only, no sessions (kretprobe.multi, Linux 5.18+; "
            "fexit.multi where the kernel has it, 7.2+ on x86-64)")
    shown = "--origins-only (kretprobe.multi)"
    feature = "kprobe_multi"
    programs = ("origin_entry_exit", *dict.fromkeys(BY_KIND.values()))
    position, auto_rank, offer_rank = 9, None, None
    sessions = False
    cheaper = "origin_fexits"  # the inner returns by fexit.multi where the kernel has it (7.2+, x86-64)

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_kprobe_multi(btf)

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        """The inner functions' returns first, then the entry functions' (which count): no count without its
        chain's probes."""
        self.attach_returns(job, job.funcs, job.links, report)

    def attach_returns(self, job: Job, funcs: Sequence[TracedFunc], links: list[lb.Link],
                       report: AttachReport) -> None:
        """`funcs` by kretprobe.multi links, appended to `links` (on failure by address, those are destroyed and
        linked again by name)."""
        id_by_addr = {f.addr: f.id for f in funcs}
        id_by_name = {f.name: f.id for f in funcs}

        def link(prog: lb.BpfProgram, retprobe: bool, addrs: Sequence[int] = (), syms: Sequence[str] = ()) -> lb.Link:
            if addrs:
                return prog.attach_kprobe_multi(addrs=addrs, cookies=[id_by_addr[a] for a in addrs], retprobe=True)
            return prog.attach_kprobe_multi(syms=syms, cookies=[id_by_name[s] for s in syms], retprobe=True)

        inner: dict[str, list[TracedFunc]] = {}
        for f in funcs:
            if not f.is_entry:
                inner.setdefault(BY_KIND[f.ret], []).append(f)
        groups: list[multi_link.Group] = [(job.obj.program(name), group, True) for name, group in inner.items()]
        groups.append((job.obj.program(self.programs[0]), [f for f in funcs if f.is_entry], True))

        def detach() -> None:
            if links is job.links:
                job.detach()
                return
            while links:
                links.pop().destroy()
        report.split_links = multi_link.attach(groups, link, links, detach)
        report.attached.extend(funcs)


MODE = OriginExits()

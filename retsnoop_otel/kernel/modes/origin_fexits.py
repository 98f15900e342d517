"""origin_fexits: what --origins-only runs where the kernel has fexit.multi (Linux 7.2+, x86-64): the same rule
(bpf/origins.bpf.h) with the inner functions' returns in one tracing_multi link per return kind, whose return path
costs 0.6-0.7x of a kretprobe.multi's on the syscall preset (bench/RESULTS.md). Not asked for by name:
attach_modes.cheapest picks it for origin_exits. The functions the trampoline refuses, module functions and the entry
functions stay on kretprobe.multi, whose stack pointer at a return equals the one derived from the trampoline's
frame (FEXIT_RET_SLOT; tests/vm/scenarios/syscalls_preset.py checks it), so both kinds of link order one chain."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys, clones
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup, probe_fsession_kind
from retsnoop_otel.kernel.modes.base import AttachReport, Job, OnError
from retsnoop_otel.kernel.modes.fsession_multi import attach_set
from retsnoop_otel.kernel.modes.origin_exits import BY_KIND, OriginExits

FEXIT_BY_KIND = {kind: name.replace("origin_exit_", "origin_fexit_") for kind, name in BY_KIND.items()}


def probe_fexit_multi(btf: Btf | FuncIdLookup | None, machine: str) -> Feature:
    """BPF_TRACE_FEXIT_MULTI through a tracing_multi link (Linux 7.2+), on x86-64: the programs find the stack
    position of the return address in the x86-64 trampoline's frame (another architecture keeps kretprobe.multi)."""
    if machine != "x86_64":
        return Feature("fexit_multi", False, f"not used on {machine}: --origins-only finds the return address's stack "
                       "slot in the x86-64 trampoline's frame", errno.EOPNOTSUPP, f"is not x86-64 ({machine})")
    return probe_fsession_kind("fexit_multi", "fexit.multi", "Linux 7.2", btf, multi=True,
                               attach_type=bpfsys.ATTACH_TRACE_FEXIT_MULTI)


class OriginFexits(OriginExits):
    name = "origin_fexits"
    flags = ()  # asked for as origin_exits (--origins-only)
    help = "--origins-only with the inner functions' returns by fexit.multi (Linux 7.2+, x86-64)"
    shown = "--origins-only (fexit.multi)"
    feature = "fexit_multi"
    programs = (*OriginExits.programs, *dict.fromkeys(FEXIT_BY_KIND.values()))
    position = 10
    cheaper = None

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_fexit_multi(btf, os.uname().machine)

    def prepare(self, obj: lb.BpfObject, progs: Sequence[str], fentry: clones.FentryPrograms) -> None:
        for name in progs:
            if name in FEXIT_BY_KIND.values():  # loaded without a target function
                obj.program(name).set_type(lb.PROG_TYPE_TRACING)
                obj.program(name).set_expected_attach_type(bpfsys.ATTACH_TRACE_FEXIT_MULTI)

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        """The inner functions by fexit.multi, then what it refuses and the entry functions by kretprobe.multi (the
        entries last: no count without its chain's probes)."""
        inner: dict[str, list[TracedFunc]] = {}
        for f in job.funcs:
            if not f.is_entry:
                inner.setdefault(FEXIT_BY_KIND[f.ret], []).append(f)
        refused: list[TracedFunc] = []
        for name, funcs in inner.items():
            left = attach_set(job.obj.program(name), funcs, job.btf_func_id, job.links,
                              attach_type=bpfsys.ATTACH_TRACE_FEXIT_MULTI)
            refused += [f for f, _ in left]
        kret: list[lb.Link] = []
        self.attach_returns(job, [*refused, *(f for f in job.funcs if f.is_entry)], kret, report)
        job.links.extend(kret)
        taken = {f.id for f in report.attached}
        report.attached.extend(f for f in job.funcs if f.id not in taken)


MODE = OriginFexits()

"""kprobe mode (-K): a kprobe and a kretprobe per function, through the kprobe PMU. The function id is the BPF
cookie on kernels that have cookies (5.15+); before that the programs find it by address (map ip_ids)."""

from __future__ import annotations

import errno as _errno
import os
from collections import Counter

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.kconfig import config_off
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import (
    HELPER_GET_ATTACH_COOKIE,
    Feature,
    FuncIdLookup,
    close_fds,
    refused,
    target_func,
)
from retsnoop_otel.kernel.modes.base import AttachMode, AttachReport, Job, OnError, attach_each


def probe_kprobes(root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
    """Register a kprobe through the kprobe PMU and attach a program to it, then remove both."""
    name = "kprobes"
    try:
        pmu = bpfsys.kprobe_pmu_type(root)
    except (OSError, ValueError):
        if config_off(config, "CONFIG_KPROBES"):
            return Feature(name, False, "kprobes are not configured (CONFIG_KPROBES is off)", _errno.ENOENT,
                           "has no kprobes (CONFIG_KPROBES is off)")
        return Feature(name, False, "no kprobe PMU (/sys/bus/event_source/devices/kprobe is missing): kernel "
                       "without CONFIG_KPROBE_EVENTS or older than 4.17", _errno.ENOENT,
                       "has no kprobe PMU (CONFIG_KPROBES or CONFIG_KPROBE_EVENTS is off)")
    func, _ = target_func(btf)
    prog = event = -1
    try:
        prog = bpfsys.prog_load(bpfsys.PROG_KPROBE, bpfsys.RETURN_ZERO, name=b"rs_probe_kprobe")
        event = bpfsys.perf_kprobe_open(func, pmu)
        bpfsys.perf_set_bpf(event, prog)
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        stage = "loading a kprobe program" if prog < 0 else f"creating a kprobe on {func}" if event < 0 \
            else f"attaching a program to a kprobe on {func}"
        return refused(name, err, f"{stage} failed: {os.strerror(err)}", "refuses kprobes")
    finally:
        close_fds(event, prog)
    return Feature(name, True, f"kprobe PMU type {pmu}; kprobe created on {func} and a program attached")


class Kprobe(AttachMode):
    name = "kprobe"
    flags = ("-K", "--kprobes")
    help = "attach with kprobe/kretprobe"
    shown = "-K (kprobes)"
    feature = "kprobes"
    programs = ("kprobe_entry", "kretprobe_exit")
    position, auto_rank, offer_rank, basic = 1, 2, 5, True

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_kprobes(root, btf, config)

    def uses_addresses(self) -> bool:
        # flavours.bpf.h asks the kernel's BTF the same question
        return not lb.probe_helper(lb.PROG_TYPE_KPROBE, HELPER_GET_ATTACH_COOKIE)

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        entry, exit_ = (job.obj.program(name) for name in self.programs)
        instances = Counter(f.name for f in job.funcs)
        cookie_of = (lambda f: 0) if job.by_address else (lambda f: f.id)

        def one(f: TracedFunc) -> None:
            # a name with several instances (static functions, clones) is attached per instance address
            name, off = (None, f.addr) if instances[f.name] > 1 and f.addr else (f.name, 0)
            job.links.append(exit_.attach_kprobe(name, retprobe=True, cookie=cookie_of(f), offset=off))
            job.links.append(entry.attach_kprobe(name, cookie=cookie_of(f), offset=off))

        attach_each(job, report, on_error, strict, one)


MODE = Kprobe()

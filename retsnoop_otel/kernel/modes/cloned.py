"""What the cloning modes (fentry, fsession) share: programs bound to one function at load time, so each traced
function gets its own verified copy of the templates (kernel/clones.py), linked to its trampoline one at a time."""

from __future__ import annotations

import time
from collections.abc import Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import clones, libbpf_progs
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.modes.base import AttachMode, AttachReport, Job, OnError, attach_each


class ClonedMode(AttachMode):
    trampoline = True

    def autoload(self, funcs: Sequence[TracedFunc]) -> tuple[str, ...]:
        if all(f.is_entry for f in funcs):
            return self.clone_sets[True]  # no function runs the inner templates: not worth verifying them
        return self.programs

    def prepare(self, obj: lb.BpfObject, progs: Sequence[str], fentry: clones.FentryPrograms) -> None:
        for is_entry, names in self.clone_sets.items():  # verified against one function of their kind, then cloned
            for name in set(names) & set(progs):
                obj.program(name).set_attach_target(fentry.target(is_entry=is_entry))

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        t_verify = time.monotonic()
        loaded = job.clones.load(job.obj)
        report.verify_ms = (time.monotonic() - t_verify) * 1000 if loaded else 0.0

        def one(f: TracedFunc) -> None:
            clone = loaded.get(f.id)
            clone = clone if clone is not None else job.clones.load_one(job.obj, f)
            if isinstance(clone, BaseException):
                raise clone
            for fd, attach_type, tag in clone:
                job.links.append(libbpf_progs.link_create(fd, attach_type, cookie=f.id, what=f"{tag} to {f.name}"))

        attach_each(job, report, on_error, strict, one)

    def running(self, obj: lb.BpfObject, fentry: clones.FentryPrograms) -> list[tuple[str, int]]:
        return fentry.programs()  # per-function clones, and the templates for the functions they were verified on

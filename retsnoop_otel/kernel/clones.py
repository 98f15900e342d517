"""fentry/fexit and fsession programs retargeted at each traced function: verified in parallel, linked one at a time.

These programs are bound to one function at load time, so mass-attaching needs a verified program per
function and direction (fsession: one program for both): the bulk of these modes' attach time. The kernel
verifies parallel loads in parallel (ctypes drops the GIL during the call), so the clones are loaded on a
few threads before the tracer links them to their trampolines, which the kernel updates one at a time anyway.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TypeVar

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys, libbpf_progs
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.cgroups import usable_cpus

CLONE_THREADS = 4  # clones verified at once (bounded by the CPUs the affinity and quotas leave: more take turns)
# template -> the kernel's name for its clones (at most 15 characters), and their attach type
_TEMPLATES = {"fexit_exit": ("rs_fexit", libbpf_progs.ATTACH_TRACE_FEXIT),
              "fentry_entry": ("rs_fentry", libbpf_progs.ATTACH_TRACE_FENTRY),
              "fexit_inner": ("rs_fexit_in", libbpf_progs.ATTACH_TRACE_FEXIT),
              "fentry_inner": ("rs_fentry_in", libbpf_progs.ATTACH_TRACE_FENTRY),
              "fsession_entry": ("rs_fsession", bpfsys.ATTACH_TRACE_FSESSION),
              "fsession_inner": ("rs_fsession_in", bpfsys.ATTACH_TRACE_FSESSION)}
TAGS = {template: tag for template, (tag, _) in _TEMPLATES.items()}
TEMPLATES = {tag: template for template, tag in TAGS.items()}
Clone = list[tuple[int, int, str]]  # (program fd, attach type, program name), exit first
T = TypeVar("T")


def load_clone(templates: Sequence[lb.BpfProgram], btf_id: int) -> Clone:
    """The templates (exit first) retargeted at the function with BTF id `btf_id`."""
    out: Clone = []
    try:
        for prog in templates:
            tag, attach_type = _TEMPLATES[prog.name]
            out.append((libbpf_progs.clone_program(prog, attach_btf_id=btf_id, attach_type=attach_type, name=tag),
                        attach_type, tag))
    except BaseException:
        for fd, _, _ in out:
            os.close(fd)
        raise
    return out


def load_all(funcs: Sequence[T], load: Callable[[T], Clone], threads: int = CLONE_THREADS,
             cpus: int | None = None) -> dict[int, Clone | BaseException]:
    """func.id -> its clone, or the LibbpfError that refused it (the caller reports it as not attached)."""
    def one(f: T) -> Clone | BaseException:
        try:
            return load(f)
        except lb.LibbpfError as exc:
            return exc

    n = max(1, min(threads, math.ceil(usable_cpus()) if cpus is None else cpus, len(funcs)))
    if n == 1:
        results = [one(f) for f in funcs]
    else:
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(max_workers=n)
        try:
            results = list(pool.map(one, funcs))
        except BaseException:  # Ctrl-C: the loads not begun are dropped, not waited for (minutes at 10,000 functions)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    return {f.id: res for f, res in zip(funcs, results, strict=True)}  # type: ignore[attr-defined]


class FentryPrograms:
    """The programs a cloning mode runs (kernel/modes/cloned.py): per traced function, the templates of its set
    (`sets`: is_entry -> template names, exit first) cloned; fentry mode's set is a pair, fsession's one program.

    Each template set is verified at object load against a traced function of its kind, which then runs
    the templates themselves (a clone for it would be the same program verified again: 3-30 ms of an
    emulated start per pair). The clones' fds are ours to close, the templates' the object's.
    """

    def __init__(self, funcs: Sequence[TracedFunc], btf_func_id: Callable[[str], int | None] | None,
                 sets: Mapping[bool, Sequence[str]] = MappingProxyType({}), mode: str = "") -> None:
        self._funcs, self._btf_func_id = funcs, btf_func_id
        self.mode = mode  # the mode's name, in refusals
        self._sets = sets
        self.targets = self._first_of_each_kind()  # is_entry -> the function its templates are verified against
        self.template_fds: list[tuple[str, int]] = []  # (template name, fd), attached as they are
        self.clone_fds: list[tuple[str, int]] = []  # (template name, fd)

    def _first_of_each_kind(self) -> dict[bool, TracedFunc]:
        out: dict[bool, TracedFunc] = {}
        for f in self._funcs:
            if f.is_entry not in out and (self._btf_func_id is None or self._btf_func_id(f.name) is not None):
                out[f.is_entry] = f
                if len(out) == 2:
                    break
        return out

    def verify_against_harmless(self) -> None:
        """After the kernel refused a template pair for its traced function (fentry cannot take a
        variadic function, for one): the templates are verified against other functions, and that one's
        own clone then fails alone, reported as not attached."""
        self.targets = {}

    def target(self, is_entry: bool) -> str:
        """The function the template pair of this kind is verified against at object load."""
        f = self.targets.get(is_entry) or next(iter(self.targets.values()), None)
        if f is not None:
            return f.name
        from retsnoop_otel.kernel.mode_probes import PROBE_TARGETS  # functions fentry always takes
        known = (n for n in PROBE_TARGETS if self._btf_func_id is not None and self._btf_func_id(n) is not None)
        return next(known, self._funcs[0].name)

    def load(self, obj: lb.BpfObject) -> dict[int, Clone | BaseException]:
        """func.id -> its pair, verified on several threads before any is attached, or why it was refused."""
        as_is: dict[int, Clone | BaseException] = {}
        for is_entry, f in self.targets.items():  # the inner templates are loaded only if a function runs them
            fds = [(tpl, obj.program(tpl).fd) for tpl in self._sets[is_entry]]
            as_is[f.id] = [(fd, _TEMPLATES[tpl][1], TAGS[tpl]) for tpl, fd in fds]
            self.template_fds += fds
        out = load_all([f for f in self._funcs if f.id not in as_is], lambda f: self._pair(obj, f))
        for res in out.values():
            if not isinstance(res, BaseException):
                self.clone_fds.extend((TEMPLATES[tag], fd) for fd, _, tag in res)
        return {f.id: as_is[f.id] if f.id in as_is else out[f.id] for f in self._funcs}

    def load_one(self, obj: lb.BpfObject, f: TracedFunc) -> Clone:
        clone = self._pair(obj, f)
        self.clone_fds.extend((TEMPLATES[tag], fd) for fd, _, tag in clone)
        return clone

    def _pair(self, obj: lb.BpfObject, f: TracedFunc) -> Clone:
        btf_id = self._btf_func_id(f.name) if self._btf_func_id else None
        if btf_id is None:
            raise lb.LibbpfError(f"{self.mode} needs BTF for {f.name} (module functions and functions without BTF "
                                 f"are not supported in {self.mode} mode; use -K)", errno.EOPNOTSUPP)
        return load_clone([obj.program(tpl) for tpl in self._sets[f.is_entry]], btf_id)

    def programs(self) -> list[tuple[str, int]]:
        return [*self.template_fds, *self.clone_fds]

    def close(self) -> None:
        fds, self.clone_fds, self.template_fds = self.clone_fds, [], []
        for _name, fd in fds:
            os.close(fd)

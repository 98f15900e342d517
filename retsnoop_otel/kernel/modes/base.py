"""What every kernel attach mode is (AttachMode, subclassed by each module of this package) and what they share:
the attach job the tracer hands a mode, the report it fills, and the per-function attach loop of the modes that
link one function at a time."""

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import clones
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup

OnError = Callable[[TracedFunc, str], None]


class AttachReport:
    __slots__ = ("attached", "failed", "attach_ms", "verify_ms", "split_links", "hooks_missing", "syscall_entries")

    def __init__(self, attached: list[TracedFunc] | None = None, failed: list[tuple[TracedFunc, str]] | None = None,
                 attach_ms: float = 0.0, verify_ms: float = 0.0, split_links: int = 0) -> None:
        self.attached: list[TracedFunc] = [] if attached is None else attached
        self.failed: list[tuple[TracedFunc, str]] = [] if failed is None else failed
        self.attach_ms = attach_ms
        self.verify_ms = verify_ms  # cloning modes: the part of attach_ms spent loading (verifying) per function
        self.split_links = split_links  # kprobe.multi links split in two for want of kernel memory (6.7-6.11)
        self.hooks_missing: list[str] = []  # thread-context publish hooks not attached (kernel/app_hooks.py)
        self.syscall_entries = 0  # entries whose sessions the syscall tracepoints start (kernel/syscall_hooks.py)


class Job(NamedTuple):
    """What a mode attaches, and with what: built by the tracer after the object loaded."""

    obj: lb.BpfObject
    funcs: Sequence[TracedFunc]  # the kernel functions (the user functions attach apart)
    links: list[lb.Link]  # where each link goes, exits before entries (the tracer detaches entries first)
    clones: clones.FentryPrograms  # the per-function programs of the cloning modes (unused by the others)
    btf_func_id: FuncIdLookup | None
    by_address: bool  # the programs find the function id by address (map ip_ids), not by cookie
    detach: Callable[[], None]  # undo every link made so far
    publish: Sequence[TracedFunc] = ()  # the thread-context publish hooks, linked with the entry functions (app_hooks)


class AttachMode:
    """One kernel attach mode. Subclasses set the record (class attributes) and override what their mode does
    differently; the defaults are those of a mode whose programs load as the object declares them."""

    name: str  # the config's attach_mode and CaptureConfig.mode
    flags: tuple[str, ...]  # trace's flags choosing it
    help: str  # their help line
    shown: str  # how a refusal names it: the flag and the kernel's name for the attach type
    feature: str  # the Features field that says whether this kernel has it (modes attaching alike may share one)
    programs: tuple[str, ...]  # the BPF programs (bpf/flavours.bpf.h): (entry, exit, ...) or per group
    position: int  # where it is listed (flags, features, config reference)
    auto_rank: int | None = None  # its place in what "auto" tries, first usable wins; None: never chosen by auto
    offer_rank: int | None = 99  # its place among the modes a refusal offers instead; None: never offered
    basic: bool = False  # every kernel since 5.5 has this one or another basic one: their refusals say why none works
    by_address: bool = False  # the programs find the function id by address (map ip_ids): kprobe.multi links
    takes_publish: bool = False  # its entry link takes job.publish, the thread-context publish hooks (app_hooks)
    joins_entries: bool = False  # with few entry functions, its entry program takes every function (multi_link)
    cheaper: str | None = None  # a mode doing the same with cheaper probes: run instead where the kernel has it
    sessions: bool = True  # its programs keep sessions (else only counts): the syscall tracepoints start them
    trampoline: bool = False  # BPF trampolines: attached by BTF id (one instance per name), stacks run through them
    clone_sets: Mapping[bool, tuple[str, ...]] = MappingProxyType({})  # is_entry -> templates cloned per function
    verified = "a program"  # what a cloning mode verifies per function, as the attach phase says

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        """Whether this kernel runs the mode (root of /sys and /proc, the probe's target function lookup, the
        kernel's config): a fact of the kernel build, cached per build (build_facts.ProbeCache)."""
        raise NotImplementedError

    def uses_addresses(self) -> bool:
        """Whether the programs find the function id by address here (decided before the object loads)."""
        return self.by_address

    def autoload(self, funcs: Sequence[TracedFunc]) -> tuple[str, ...]:
        """The programs of the object that load for these (kernel) functions."""
        return self.programs

    def prepare(self, obj: lb.BpfObject, progs: Sequence[str], fentry: clones.FentryPrograms) -> None:
        """Before load: what the mode sets on its autoloaded programs beyond the object's declarations."""

    def attach(self, job: Job, report: AttachReport, on_error: OnError | None, strict: bool) -> None:
        """Link the programs to job.funcs, recording what attached and what failed in `report`."""
        raise NotImplementedError

    def running(self, obj: lb.BpfObject, fentry: clones.FentryPrograms) -> list[tuple[str, int]]:
        """(name, fd) of the programs that run when a traced function is hit (the loaded ones)."""
        return [(name, fd) for name in self.programs if (fd := obj.program(name).fd) >= 0]


def attach_each(job: Job, report: AttachReport, on_error: OnError | None, strict: bool,
                one: Callable[[TracedFunc], None]) -> None:
    """One function at a time: one the kernel refuses is reported (or raised, if `strict`) and the rest go on."""
    for f in job.funcs:
        try:
            one(f)
            report.attached.append(f)
        except lb.LibbpfError as exc:
            if strict:
                raise
            report.failed.append((f, str(exc)))
            if on_error:
                on_error(f, str(exc))

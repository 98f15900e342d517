"""The kernel attach modes: one record each, read by the flags, the config, discovery, the feature checks and the
tracer; a new mode is a record here, its probe (kernel/mode_probes.py) and its BPF flavour. Importing it loads no
libbpf (its probes run only when the feature checks call them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import (
    Feature,
    FuncIdLookup,
    probe_fentry,
    probe_fsession,
    probe_fsession_multi,
    probe_kprobe_multi,
    probe_kprobe_session,
    probe_kprobes,
)

# (root of /sys and /proc, the probe's target function lookup, the kernel's config) -> whether the kernel has it
Probe = Callable[[str, "Btf | FuncIdLookup | None", dict[str, str]], Feature]


class AttachMode(NamedTuple):
    name: str  # the config's attach_mode and CaptureConfig.mode
    flags: tuple[str, ...]  # trace's flags choosing it
    help: str  # their help line
    shown: str  # how a refusal names it: the flag and the kernel's name for the attach type
    feature: str  # the Features field that says whether this kernel has it
    programs: tuple[str, ...]  # the BPF programs: (entry, exit, ...) or per group of functions
    by_address: bool = False  # the programs find the function id by address (map ip_ids): kprobe.multi links
    trampoline: bool = False  # BPF trampolines: attached by BTF id (one instance per name), stacks run through them
    probe: Probe | None = None  # a fact of the kernel build: cached per boot (features.ProbeCache)


MODES: tuple[AttachMode, ...] = (
    AttachMode("fentry", ("-F", "--fentries"), "attach with fentry/fexit", "-F (fentry/fexit)", "fentry",
               ("fentry_entry", "fexit_exit", "fentry_inner", "fexit_inner"), trampoline=True,
               probe=lambda root, btf, config: probe_fentry(btf)),
    AttachMode("kprobe", ("-K", "--kprobes"), "attach with kprobe/kretprobe", "-K (kprobes)", "kprobes",
               ("kprobe_entry", "kretprobe_exit"), probe=probe_kprobes),
    AttachMode("kprobe_multi", ("-M", "--kprobes-multi"), "attach with kprobe.multi/kretprobe.multi",
               "-M (kprobe_multi)", "kprobe_multi", ("kmulti_entry", "kmulti_exit", "kmulti_inner"), by_address=True,
               probe=lambda root, btf, config: probe_kprobe_multi(btf)),
    AttachMode("kprobe_session", ("--kprobe-session",),
               "attach with kprobe.session: one program at entry and exit (Linux 6.10+)",
               "--kprobe-session (kprobe.session)", "kprobe_session", ("ksession", "ksession_inner"), by_address=True,
               probe=lambda root, btf, config: probe_kprobe_session(btf)),
    AttachMode("fsession", ("--fsession",),
               "attach with fsession: one trampoline program per function for entry and exit (Linux 7.0+)",
               "--fsession (fsession)", "fsession", ("fsession_entry", "fsession_inner"), trampoline=True,
               probe=lambda root, btf, config: probe_fsession(btf)),
    AttachMode("fsession_multi", ("--fsession-multi",),
               "attach with fsession.multi: one program in one link for every function (Linux 7.2+)",
               "--fsession-multi (fsession.multi)", "fsession_multi", ("fsession_multi",), trampoline=True,
               probe=lambda root, btf, config: probe_fsession_multi(btf)),
)
# Measured in the VM (bench/probe_cost.py, README "Attach modes"): kprobe.session and kprobe.multi attach
# and detach a set in one call; kprobe.session also costs least per traced call (one program, and no
# exit probe at all for calls outside a session). Single kprobes attach 3x faster than per-function
# fentry clones (each clone is verified) and never fire inside our own BPF programs.
AUTO_ORDER = ("kprobe_session", "kprobe_multi", "kprobe", "fentry")  # what "auto" tries, first usable wins
OFFER_ORDER = ("kprobe_session", "kprobe_multi", "fsession_multi", "fsession", "fentry", "kprobe")  # a refusal's
BASIC = ("fentry", "kprobe")  # every kernel since 5.5 has one of them: when none works, their refusals say why
BY_NAME: dict[str, AttachMode] = {m.name: m for m in MODES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
TRAMPOLINE: frozenset[str] = frozenset(m.name for m in MODES if m.trampoline)
BY_ADDRESS: frozenset[str] = frozenset(m.name for m in MODES if m.by_address)


class UserAttachMode(NamedTuple):
    """How user-space functions (u:BINARY:GLOB) attach; all need BPF cookies (the address differs per process)."""

    name: str  # --user-attach and the config's user_attach_mode
    shown: str  # the kernel's name for it
    programs: tuple[str, ...]  # bpf/flavours.bpf.h: (entry, exit) or one for both
    since: tuple[str, str] | None  # (its enum bpf_attach_type name, the first Linux with it); None: every kernel


USER_MODES: tuple[UserAttachMode, ...] = (  # cheapest first: auto takes the first the kernel has
    UserAttachMode("uprobe_session", "uprobe.session", ("usession",), ("BPF_TRACE_UPROBE_SESSION", "Linux 6.13")),
    UserAttachMode("uprobe_multi", "uprobe.multi", ("umulti_entry", "umulti_exit"),
                   ("BPF_TRACE_UPROBE_MULTI", "Linux 6.6")),
    UserAttachMode("uprobe", "single uprobes", ("kprobe_entry", "kretprobe_exit"), None),
)
USER_NAMES: tuple[str, ...] = tuple(m.name for m in USER_MODES)

"""User-space functions' attach modes: which one this kernel runs, its programs, and attaching them.

Chosen like the kernel modes, cheapest first: uprobe.session (Linux 6.13+: one program at entry and exit, and
no return probe for calls outside a session), uprobe.multi (6.6+: one link per binary, cookies read in O(1)),
single uprobes last. All of them need BPF cookies (5.15+), the only way their programs learn the function's id:
the address a uprobe sees differs in every process.
"""

import errno
from collections.abc import Callable, Container, Sequence
from typing import NamedTuple

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import libbpf as lb

# links one binary's functions: (the mode's programs, the binary, its functions, where the links go), exits first
Linker = Callable[[Sequence[lb.BpfProgram], str, Sequence[TracedFunc], list[lb.Link]], None]


def _link_session(progs: Sequence[lb.BpfProgram], binary: str, group: Sequence[TracedFunc],
                  links: list[lb.Link]) -> None:
    links.append(progs[0].attach_uprobe_multi(binary, [f.offset for f in group], [f.id for f in group], session=True))


def _link_multi(progs: Sequence[lb.BpfProgram], binary: str, group: Sequence[TracedFunc], links: list[lb.Link]) -> None:
    offsets, cookies = [f.offset for f in group], [f.id for f in group]
    links.append(progs[1].attach_uprobe_multi(binary, offsets, cookies, retprobe=True))
    links.append(progs[0].attach_uprobe_multi(binary, offsets, cookies))


def _link_single(progs: Sequence[lb.BpfProgram], binary: str, group: Sequence[TracedFunc],
                 links: list[lb.Link]) -> None:
    for f in group:
        links.append(progs[1].attach_uprobe_at(binary, f.offset, retprobe=True, cookie=f.id))
        links.append(progs[0].attach_uprobe_at(binary, f.offset, cookie=f.id))


class UserAttachMode(NamedTuple):
    """How user-space functions (u:BINARY:GLOB) attach; all need BPF cookies (the address differs per process)."""

    name: str  # --user-attach and the config's user_attach_mode
    shown: str  # the kernel's name for it
    programs: tuple[str, ...]  # bpf/flavours.bpf.h: (entry, exit) or one for both
    since: tuple[str, str] | None  # (its enum bpf_attach_type name, the first Linux with it); None: every kernel
    link: Linker  # how it links one binary's functions


RECORDS: tuple[UserAttachMode, ...] = (  # cheapest first: auto takes the first the kernel has
    UserAttachMode("uprobe_session", "uprobe.session", ("usession",), ("BPF_TRACE_UPROBE_SESSION", "Linux 6.13"),
                   _link_session),
    UserAttachMode("uprobe_multi", "uprobe.multi", ("umulti_entry", "umulti_exit"),
                   ("BPF_TRACE_UPROBE_MULTI", "Linux 6.6"), _link_multi),
    UserAttachMode("uprobe", "single uprobes", ("kprobe_entry", "kretprobe_exit"), None, _link_single),
)
BY_NAME = {m.name: m for m in RECORDS}
USER_MODES: tuple[str, ...] = tuple(BY_NAME)
PROGRAMS: dict[str, tuple[str, ...]] = {m.name: m.programs for m in RECORDS}
_SINCE = {m.name: m.since for m in RECORDS if m.since}
NAMES = {m.name: m.shown for m in RECORDS}


def user_modes(attach_types: Container[str]) -> list[str]:
    """The user modes this kernel knows, cheapest first (cookies aside): `attach_types` are the names of its enum
    bpf_attach_type (its BTF). Single uprobes are in every kernel."""
    return [m for m in USER_MODES if m not in _SINCE or _SINCE[m][0] in attach_types]


class UprobeModeError(Exception):
    """The kernel cannot attach user functions in the mode asked for (the message says why and what to do)."""


def choose_user_mode(attach_types: Container[str], cookies: bool, asked: str = "auto") -> str:
    """The user mode to use: `attach_types` are the names of the kernel's enum bpf_attach_type (its BTF)."""
    if not cookies:
        raise UprobeModeError("user-space functions (u:BINARY:GLOB) need BPF cookies, which this kernel lacks "
                              "(Linux 5.15+ has them): trace kernel functions only on this kernel")
    if asked == "auto":
        return user_modes(attach_types)[0]
    if asked not in USER_MODES:
        raise UprobeModeError(f"unknown user attach mode '{asked}' (expected auto or one of {', '.join(USER_MODES)})")
    if asked in _SINCE and _SINCE[asked][0] not in attach_types:
        raise UprobeModeError(f"this kernel has no {asked.replace('_', '.')} ({_SINCE[asked][1]}+ needed): "
                              "use --user-attach auto")
    return asked


def attach(program: Callable[[str], lb.BpfProgram], mode: str, funcs: Sequence[TracedFunc],
           links: list[lb.Link]) -> None:
    """Exit probes before entry probes, one link per binary in the multi modes; a refusal raises (the caller
    detaches what was attached)."""
    how = BY_NAME[mode]
    progs = [program(name) for name in how.programs]
    by_binary: dict[str, list[TracedFunc]] = {}
    for f in funcs:
        assert f.binary is not None
        by_binary.setdefault(f.binary, []).append(f)
    for binary, group in by_binary.items():
        try:
            how.link(progs, binary, group, links)
        except lb.LibbpfError as exc:
            names = ", ".join(f.name for f in group[:3]) + (", ..." if len(group) > 3 else "")
            raise lb.LibbpfError(f"{exc.what} (user functions {names})", exc.errno or errno.EINVAL, exc.log) from None

"""User-space functions' attach modes: which one this kernel runs, its programs, and attaching them.

Chosen like the kernel modes, cheapest first: uprobe.session (Linux 6.13+: one program at entry and exit, and
no return probe for calls outside a session), uprobe.multi (6.6+: one link per binary, cookies read in O(1)),
single uprobes last. All of them need BPF cookies (5.15+), the only way their programs learn the function's id:
the address a uprobe sees differs in every process.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Container, Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import attach_modes
from retsnoop_otel.kernel import libbpf as lb

USER_MODES = attach_modes.USER_NAMES
PROGRAMS: dict[str, tuple[str, ...]] = {m.name: m.programs for m in attach_modes.USER_MODES}
_SINCE = {m.name: m.since for m in attach_modes.USER_MODES if m.since}
NAMES = {m.name: m.shown for m in attach_modes.USER_MODES}


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
    progs = [program(name) for name in PROGRAMS[mode]]
    by_binary: dict[str, list[TracedFunc]] = {}
    for f in funcs:
        assert f.binary is not None
        by_binary.setdefault(f.binary, []).append(f)
    for binary, group in by_binary.items():
        offsets, cookies = [f.offset for f in group], [f.id for f in group]
        try:
            if mode == "uprobe_session":
                links.append(progs[0].attach_uprobe_multi(binary, offsets, cookies, session=True))
            elif mode == "uprobe_multi":
                links.append(progs[1].attach_uprobe_multi(binary, offsets, cookies, retprobe=True))
                links.append(progs[0].attach_uprobe_multi(binary, offsets, cookies))
            else:
                for f in group:
                    links.append(progs[1].attach_uprobe_at(binary, f.offset, retprobe=True, cookie=f.id))
                    links.append(progs[0].attach_uprobe_at(binary, f.offset, cookie=f.id))
        except lb.LibbpfError as exc:
            names = ", ".join(f.name for f in group[:3]) + (", ..." if len(group) > 3 else "")
            raise lb.LibbpfError(f"{exc.what} (user functions {names})", exc.errno or errno.EINVAL, exc.log) from None

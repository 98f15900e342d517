"""kprobe.multi, kprobe.session and fsession.multi: a whole function set in a few links, whatever its size.

The kprobe programs find a call's function id by its address in map ip_ids, not by BPF cookie: a
kprobe.multi cookie is found by a binary search over the link's sorted addresses on every run
(bench/probe_cost.py, 6.12 under emulation: about 400 ns per run against 200-280 for the address
lookup, at 1,000 functions). So those links carry no cookies. A tracing_multi link (fsession.multi) gives
each function's trampoline its own cookie, read directly like fentry's: there the id is the cookie.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys, trampoline_fit
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import Btf

T = TypeVar("T")
# errors of the whole request, not of one of its functions: halving a tracing_multi link would only repeat them
_NOT_PER_FUNCTION = (errno.EPERM, errno.EACCES, errno.EFAULT, errno.ENOMEM)


def fill_ip_ids(ip_ids: lb.BpfMap, funcs: Sequence[TracedFunc]) -> None:
    for f in funcs:
        ip_ids.update(struct.pack("<Q", f.addr), struct.pack("<I", f.id))


def attach(mode: str, progs: Sequence[lb.BpfProgram], funcs: Sequence[TracedFunc], links: list[lb.Link],
           detach: Callable[[], None]) -> int:
    """One link per group: exits of every function first (kprobe.multi), then the functions that only
    record inside a session, then the entry functions, so that no session starts half-instrumented.

    Entry functions and the others run different programs (`kmulti_entry`/`kmulti_inner`, `ksession`/
    `ksession_inner`): a call of the others outside a session then costs one session lookup, without
    finding its function id. On failure by address (strict about notrace functions), by name.
    Returns how many links were split for want of kernel memory (see _attach_group).
    """
    named = {p.name: p for p in progs}
    inner = [f for f in funcs if not f.is_entry]
    entries = [f for f in funcs if f.is_entry]
    if mode == "kprobe_session":
        groups = [(named["ksession_inner"], inner, False), (named["ksession"], entries, False)]
    else:
        groups = [(named["kmulti_exit"], funcs, True), (named["kmulti_inner"], inner, False),
                  (named["kmulti_entry"], entries, False)]
    groups = [g for g in groups if g[1]]
    try:
        return sum(_attach_group(mode, prog, retprobe, group, links, True) for prog, group, retprobe in groups)
    except lb.LibbpfError:
        detach()
        return sum(_attach_group(mode, prog, retprobe, group, links, False) for prog, group, retprobe in groups)


def _attach_group(mode: str, prog: lb.BpfProgram, retprobe: bool, group: Sequence[TracedFunc],
                  links: list[lb.Link], by_addr: bool) -> int:
    """One link for the group, or, where the kernel runs out of memory making it, one for each half, and so on:
    Linux 6.7-6.11 size a kretprobe.multi link's pool of return instances by its function count and refuse
    large links with ENOMEM (a kernel objpool bug; retsnoop halves its batches too). Returns the splits made."""
    def link(part: Sequence[TracedFunc]) -> lb.Link:
        where = {"addrs": [f.addr for f in part]} if by_addr else {"syms": [f.name for f in part]}
        return _link(mode, prog, retprobe, **where)

    splits, refused = link_halving(group, link, links, lambda exc: exc.errno == errno.ENOMEM)
    if refused:  # one function alone is too many
        raise refused[0][1]
    return splits


def _link(mode: str, prog: lb.BpfProgram, retprobe: bool, addrs: Sequence[int] = (),
          syms: Sequence[str] = ()) -> lb.Link:
    if mode == "kprobe_session":  # libbpf 1.1 cannot create these links
        try:
            fd = bpfsys.link_create_kprobe_multi(prog.fd, syms=syms, addrs=addrs,
                                                 attach_type=bpfsys.ATTACH_TRACE_KPROBE_SESSION)
        except OSError as exc:
            raise lb.LibbpfError(f"attach kprobe.session to {len(addrs) or len(syms)} functions",
                                 exc.errno or errno.EINVAL) from None
        return lb.Link(fd=fd)
    how = {"addrs": addrs} if addrs else {"syms": syms}
    return prog.attach_kprobe_multi(**how, retprobe=retprobe)


def attach_fsession(prog: lb.BpfProgram, funcs: Sequence[TracedFunc], btf_func_id: Callable[[str], int | None] | None,
                    links: list[lb.Link], load_btf: Callable[[], Btf] = Btf.load_vmlinux,
                    ) -> list[tuple[TracedFunc, lb.LibbpfError]]:
    """fsession.multi: the set in one tracing_multi link, each function by its vmlinux BTF id with its id as cookie;
    returns the functions left out and why. The kernel takes or refuses a link whole (kernel/bpf/trampoline.c: a
    function it cannot trace refuses them all). After a refusal the functions whose BTF prototype it refuses are
    left out (trampoline_fit.py) and the rest linked again; what it still refuses is halved until the refused
    functions stand alone (k of n cost about 2k*log2(n) more attempts and leave about k*log2(n) links)."""
    refused: list[tuple[TracedFunc, lb.LibbpfError]] = []
    targets: dict[int, TracedFunc] = {}
    for f in funcs:
        btf_id = btf_func_id(f.name) if btf_func_id else None
        if btf_id is None:  # the program was loaded against vmlinux's BTF: a module's functions are not in it
            refused.append((f, lb.LibbpfError(f"fsession.multi needs BTF for {f.name} (module functions and functions "
                                              "without BTF are not supported in fsession.multi mode; use -K)",
                                              errno.EOPNOTSUPP)))
        elif btf_id in targets:  # the kernel refuses a link naming a function twice
            refused.append((f, lb.LibbpfError(f"{f.name} is the same BTF function as {targets[btf_id].name}, attached "
                                              "once", errno.EEXIST)))
        else:
            targets[btf_id] = f

    def link(group: Sequence[tuple[int, TracedFunc]]) -> lb.Link:
        what = group[0][1].name if len(group) == 1 else f"{len(group)} functions"
        try:
            return lb.Link(fd=bpfsys.link_create_tracing_multi(prog.fd, [i for i, _ in group],
                                                               [f.id for _, f in group]))
        except OSError as exc:
            raise lb.LibbpfError(f"attach fsession.multi to {what}", exc.errno or errno.EINVAL) from None

    items = list(targets.items())
    if not items:
        return refused
    try:
        links.append(link(items))
        return refused
    except lb.LibbpfError as exc:
        if exc.errno in _NOT_PER_FUNCTION:
            raise
    btf = load_btf()
    try:
        unfit = trampoline_fit.refusals(btf, ((i, f.name) for i, f in items))
    finally:
        btf.free()
    refused += [(f, lb.LibbpfError(f"fsession.multi cannot attach {f.name}: {unfit[i]}", errno.EINVAL))
                for i, f in items if i in unfit]
    fit = [(i, f) for i, f in items if i not in unfit]
    _, alone = link_halving(fit, link, links, lambda exc: exc.errno not in _NOT_PER_FUNCTION) if fit else (0, [])
    return refused + [(f, exc) for (_, f), exc in alone]


def link_halving(group: Sequence[T], link: Callable[[Sequence[T]], lb.Link], links: list[lb.Link],
                 halve: Callable[[lb.LibbpfError], bool]) -> tuple[int, list[tuple[T, lb.LibbpfError]]]:
    """Link `group` at once; where the kernel refuses it with an error `halve` accepts, each half on its own, and so
    on: members refused alone are returned with the error, not raised; other errors raise. Returns the splits made
    and the refused members."""
    try:
        links.append(link(group))
        return 0, []
    except lb.LibbpfError as exc:
        if not halve(exc):
            raise
        if len(group) == 1:
            return 0, [(group[0], exc)]
    mid = len(group) // 2
    first, second = link_halving(group[:mid], link, links, halve), link_halving(group[mid:], link, links, halve)
    return 1 + first[0] + second[0], first[1] + second[1]

"""kprobe.multi and kprobe.session: a whole function set in a few links, whatever its size.

Their programs find a call's function id by its address in map ip_ids, not by BPF cookie: a
kprobe.multi cookie is found by a binary search over the link's sorted addresses on every run
(bench/probe_cost.py, 6.12 under emulation: about 400 ns per run against 200-280 for the address
lookup, at 1,000 functions). So the links carry no cookies.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable, Sequence

from retsnoop_otel.capture.model import TracedFunc
from retsnoop_otel.kernel import bpfsys
from retsnoop_otel.kernel import libbpf as lb


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
    where = {"addrs": [f.addr for f in group]} if by_addr else {"syms": [f.name for f in group]}
    try:
        links.append(_link(mode, prog, retprobe, **where))
        return 0
    except lb.LibbpfError as exc:
        if exc.errno != errno.ENOMEM or len(group) < 2:
            raise
    half = len(group) // 2
    return 1 + _attach_group(mode, prog, retprobe, group[:half], links, by_addr) + \
        _attach_group(mode, prog, retprobe, group[half:], links, by_addr)


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

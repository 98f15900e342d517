"""What the multi-link modes share (kprobe_multi, kprobe_session, fsession_multi in kernel/modes/): a whole
function set in a few links, whatever its size, each link halved where the kernel refuses it.

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
from retsnoop_otel.kernel import libbpf as lb

T = TypeVar("T")


# bpf/retsnoop.bpf.c FEW_ENTRIES: the entry addresses an entry link's program holds to take every function in one
# link; room is kept for the two publish hooks (kernel/app_hooks.py) that may join them
FEW_ENTRIES = 16
PUBLISH_ROOM = 2


def one_link(funcs: Sequence[TracedFunc]) -> bool:
    """Whether the entry link takes every function (its program tells the few entry functions by address): one
    link to detach instead of two, whose grace periods would run one after the other at a stop."""
    return sum(f.is_entry for f in funcs) <= FEW_ENTRIES - PUBLISH_ROOM


def one_link_rodata(funcs: Sequence[TracedFunc], publish: Sequence[TracedFunc]) -> dict[str, bytes]:
    """The entry program's settings for one_link(funcs): the entry functions' and the publish hooks' addresses."""
    if not one_link(funcs):
        return {}
    addrs = [f.addr for f in (*funcs, *publish) if f.is_entry]
    return {"one_link": struct.pack("<?", True), "few_entry_cnt": struct.pack("<I", len(addrs)),
            "few_entry_ips": struct.pack(f"<{FEW_ENTRIES}Q", *addrs, *[0] * (FEW_ENTRIES - len(addrs)))}


def fill_ip_ids(ip_ids: lb.BpfMap, funcs: Sequence[TracedFunc]) -> None:
    for f in funcs:
        ip_ids.update(struct.pack("<Q", f.addr), struct.pack("<I", f.id))


# one link's worth: (program, functions, whether it is a return probe)
Group = tuple[lb.BpfProgram, Sequence[TracedFunc], bool]
# makes one link of a program to functions by address or by name (a mode's call of libbpf or bpfsys)
LinkMaker = Callable[..., lb.Link]


def attach(groups: Sequence[Group], make: LinkMaker, links: list[lb.Link], detach: Callable[[], None]) -> int:
    """One link per group, in the order given (exits of every function first, then the functions that only record
    inside a session, then the entry functions, so that no session starts half-instrumented); `make(prog,
    retprobe, addrs=... or syms=...)` makes each. On failure by address (strict about notrace functions), by name.
    Returns how many links were split for want of kernel memory (see _attach_group).
    """
    groups = [g for g in groups if g[1]]
    try:
        return sum(_attach_group(make, prog, retprobe, group, links, True) for prog, group, retprobe in groups)
    except lb.LibbpfError:
        detach()
        return sum(_attach_group(make, prog, retprobe, group, links, False) for prog, group, retprobe in groups)


def _attach_group(make: LinkMaker, prog: lb.BpfProgram, retprobe: bool, group: Sequence[TracedFunc],
                  links: list[lb.Link], by_addr: bool) -> int:
    """One link for the group, or, where the kernel runs out of memory making it, one for each half, and so on:
    Linux 6.7-6.11 size a kretprobe.multi link's pool of return instances by its function count and refuse
    large links with ENOMEM (a kernel objpool bug; retsnoop halves its batches too). Returns the splits made."""
    def link(part: Sequence[TracedFunc]) -> lb.Link:
        where = {"addrs": [f.addr for f in part]} if by_addr else {"syms": [f.name for f in part]}
        return make(prog, retprobe, **where)

    splits, refused = link_halving(group, link, links, lambda exc: exc.errno == errno.ENOMEM)
    if refused:  # one function alone is too many
        raise refused[0][1]
    return splits


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

"""kprobe.multi and kprobe.session: a whole function set in one link (two for kprobe.multi's entry and exit).

Their programs find a call's function id by its address in map ip_ids, not by BPF cookie: a
kprobe.multi cookie is found by a binary search over the link's sorted addresses on every run, which
measured the costliest part of the program at 1,000 functions (bench/probe_cost.py, README "Attach
modes"). So the links carry no cookies.
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


def attach(progs: Sequence[lb.BpfProgram], funcs: Sequence[TracedFunc], links: list[lb.Link],
           detach: Callable[[], None]) -> None:
    """Exit link first (no session starts without its exit probe); on failure by address, by name."""
    try:
        _attach_by(progs, links, addrs=[f.addr for f in funcs])
    except lb.LibbpfError:
        # addresses are strict about notrace functions; names go through the kernel's own lookup
        detach()
        _attach_by(progs, links, syms=[f.name for f in funcs])


def _attach_by(progs: Sequence[lb.BpfProgram], links: list[lb.Link], addrs: Sequence[int] = (),
               syms: Sequence[str] = ()) -> None:
    if len(progs) == 1:  # kprobe.session: one program for entry and exit; libbpf 1.1 cannot create its link
        try:
            fd = bpfsys.link_create_kprobe_multi(progs[0].fd, syms=syms, addrs=addrs,
                                                 attach_type=bpfsys.ATTACH_TRACE_KPROBE_SESSION)
        except OSError as exc:
            raise lb.LibbpfError(f"attach kprobe.session to {len(addrs) or len(syms)} functions",
                                 exc.errno or errno.EINVAL) from None
        links.append(lb.Link(fd=fd))
        return
    entry, exit_ = progs
    how = {"addrs": addrs} if addrs else {"syms": syms}
    links.append(exit_.attach_kprobe_multi(**how, retprobe=True))
    links.append(entry.attach_kprobe_multi(**how))

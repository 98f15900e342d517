"""kprobe.multi links on kernels that refuse large ones with ENOMEM (Linux 6.7-6.11's objpool bug): the group is
split in halves until each link fits, every function is attached exactly once, and other errors stay errors."""

from __future__ import annotations

import errno

import pytest

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel import multi_link


class FakeProgram:
    """Refuses links of more than `fits` functions the way 6.7-6.11 refuse large kretprobe.multi links."""

    def __init__(self, name: str, fits: int, err: int = errno.ENOMEM) -> None:
        self.name, self.fits, self.err = name, fits, err
        self.linked: list[list[int]] = []

    def attach_kprobe_multi(self, *, addrs=None, syms=None, retprobe=False) -> lb.Link:
        where = list(addrs if addrs is not None else syms)
        if len(where) > self.fits:
            raise lb.LibbpfError(f"attach kprobe.multi to {len(where)} functions", self.err)
        self.linked.append(where)
        return lb.Link(fd=-1)


def _funcs(n: int) -> list[TracedFunc]:
    return [TracedFunc(i, f"f{i}", 0x1000 + i, RetKind.INT32, i == 0) for i in range(n)]


def test_a_link_the_kernel_has_no_memory_for_is_split_until_each_part_fits() -> None:
    funcs = _funcs(10)
    progs = [FakeProgram("kmulti_exit", fits=3), FakeProgram("kmulti_inner", fits=100),
             FakeProgram("kmulti_entry", fits=100)]
    links: list[lb.Link] = []
    splits = multi_link.attach("kprobe_multi", progs, funcs, links, detach=links.clear)
    exits = progs[0].linked
    assert [a for part in exits for a in part] == [f.addr for f in funcs]  # each exit once, in order
    assert max(len(part) for part in exits) <= 3 and splits == len(exits) - 1
    assert progs[1].linked == [[f.addr for f in funcs[1:]]] and progs[2].linked == [[funcs[0].addr]]
    assert len(links) == len(exits) + 2


def test_other_errors_are_not_split() -> None:
    progs = [FakeProgram("kmulti_exit", fits=3, err=errno.EINVAL), FakeProgram("kmulti_inner", fits=100),
             FakeProgram("kmulti_entry", fits=100)]
    links: list[lb.Link] = []
    with pytest.raises(lb.LibbpfError) as exc:
        multi_link.attach("kprobe_multi", progs, _funcs(10), links, detach=links.clear)
    assert exc.value.errno == errno.EINVAL
    assert progs[0].linked == []  # by address, then by name: both refused whole

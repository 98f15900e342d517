"""fentry clones are verified on as many threads as the CPUs this process may use."""

from __future__ import annotations

import os
import threading

from retsnoop_otel.kernel import clones
from retsnoop_otel.kernel import libbpf as lb


class F:
    def __init__(self, i: int) -> None:
        self.id = i


def _load(seen: set[int]):
    def load(f: F) -> clones.Clone:
        seen.add(threading.get_ident())
        if f.id == 3:
            raise lb.LibbpfError("refused", 22)
        return [(100 + f.id, 0, clones.EXIT_TAG)]
    return load


def test_one_usable_cpu_verifies_on_the_calling_thread() -> None:
    seen: set[int] = set()
    out = clones.load_all([F(i) for i in range(8)], _load(seen), threads=4, cpus=1)
    assert seen == {threading.get_ident()}
    assert out[0] == [(100, 0, clones.EXIT_TAG)] and isinstance(out[3], lb.LibbpfError)


def test_several_cpus_keep_each_functions_result() -> None:
    out = clones.load_all([F(i) for i in range(8)], _load(set()), threads=4, cpus=4)
    assert sorted(out) == list(range(8))
    assert all(out[i] == [(100 + i, 0, clones.EXIT_TAG)] for i in range(8) if i != 3)
    assert isinstance(out[3], lb.LibbpfError)


def test_usable_cpus_follow_the_affinity_mask() -> None:
    assert clones.usable_cpus() == len(os.sched_getaffinity(0)) <= (os.cpu_count() or 1)

"""fsession mode (--fsession): one trampoline program per function for its entry and exit, cloned per function
like fentry's (kernel/clones.py). Linux 7.0+."""

from __future__ import annotations

from types import MappingProxyType

from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import Feature, FuncIdLookup, probe_fsession_kind
from retsnoop_otel.kernel.modes.cloned import ClonedMode


def probe_fsession(btf: Btf | FuncIdLookup | None) -> Feature:
    """BPF_TRACE_FSESSION (Linux 7.0+): one trampoline program for a function's entry and exit."""
    return probe_fsession_kind("fsession", "fsession", "Linux 7.0", btf, multi=False)


class Fsession(ClonedMode):
    name = "fsession"
    flags = ("--fsession",)
    help = "attach with fsession: one trampoline program per function for entry and exit (Linux 7.0+)"
    shown = "--fsession (fsession)"
    feature = "fsession"
    programs = ("fsession_entry", "fsession_inner")
    position, offer_rank = 4, 3
    clone_sets = MappingProxyType({True: ("fsession_entry",), False: ("fsession_inner",)})

    def probe(self, root: str, btf: Btf | FuncIdLookup | None, config: dict[str, str]) -> Feature:
        return probe_fsession(btf)


MODE = Fsession()

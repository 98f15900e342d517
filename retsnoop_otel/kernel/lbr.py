"""Last branch records: which branch types perf records (retsnoop's --lbr specs), and whether this machine can.

LBR needs a CPU (and hypervisor) that exposes last-branch records to perf; where there is none
(this project's CI host and its VMs), a probe set asking for it is refused before anything loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# enum perf_branch_sample_type (uapi linux/perf_event.h)
BRANCH_KERNEL = 1 << 1
BRANCH_TYPES: Mapping[str, int] = {
    "any": 1 << 3,
    "any_call": 1 << 4,
    "any_return": 1 << 5,
    "ind_call": 1 << 6,
    "abort_tx": 1 << 7,
    "in_tx": 1 << 8,
    "no_tx": 1 << 9,
    "cond": 1 << 10,
    "call_stack": 1 << 11,
    "ind_jump": 1 << 12,
    "call": 1 << 13,
}
DEFAULT_SPEC = "any_return"


class LbrError(Exception):
    """A bad --lbr spec or a machine without LBR: one sentence for the user."""


def parse_specs(specs: Sequence[str]) -> int:
    """OR of the given specs (names or numbers); the default is any_return. Kernel-only sampling."""
    flags = 0
    for spec in specs or [DEFAULT_SPEC]:
        for part in (spec or DEFAULT_SPEC).split(","):
            part = part.strip().lower()
            if part in BRANCH_TYPES:
                flags |= BRANCH_TYPES[part]
                continue
            try:
                flags |= int(part, 0)
            except ValueError:
                raise LbrError(f"unknown --lbr value '{part}' (expected one of {', '.join(BRANCH_TYPES)}, "
                               "or a number)") from None
    return flags | BRANCH_KERNEL


def lbr_missing(lbr: object, branch_snapshot: object) -> str:
    """Why LBR capture cannot work here ("" when it can), from the `lbr` and `branch_snapshot`
    features (features.Feature): the CPU keeps no branch records, or BPF cannot snapshot them."""
    if not lbr.available:  # type: ignore[attr-defined]
        return f"opening a branch-stack perf event was {lbr.detail}"  # type: ignore[attr-defined]
    if not branch_snapshot.available:  # type: ignore[attr-defined]
        return f"this kernel {branch_snapshot.why}"  # type: ignore[attr-defined]
    return ""

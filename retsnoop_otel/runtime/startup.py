"""Where start-up time goes: named phases with their wall time, for `trace -v` and the agent's start log.

Under emulation (and on busy hosts) starting takes seconds; which part (the interpreter, kernel
symbol reads, BTF, the BPF object's verification, attaching) is what a user needs to see to act
on it, and what bench/peer_compare.py reads.
"""

import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from retsnoop_otel.kernel import attach_modes, syscall_hooks


class Phase(NamedTuple):
    name: str
    seconds: float
    detail: str = ""


def phase_since(name: str, t0: float, detail: str = "") -> Phase:
    """A phase that started at monotonic time `t0` and ends now."""
    return Phase(name, time.monotonic() - t0, detail)


class StartClock(NamedTuple):
    """When main() began: the monotonic time, and how old the process was then (Python's own start)."""

    main_t0: float
    python_s: float | None

    def before_main(self) -> list[Phase]:
        if self.python_s is None:
            return []
        return [Phase("python", self.python_s, "interpreter start and imports before main")]


def discovery_note(found: Any, syscalls: bool, set_name: str | None) -> str:
    """The discovery phase's detail: `found` a probe set's discovered functions (symbols/discovery.py), the syscall
    preset's entries counted apart (tests/vm/test_syscalls_preset.py reads them), the set named when there are more."""
    note = f"{len(found.funcs)} functions" + (f" ({found.entry_count} syscall entries)" if syscalls else "")
    return note + (f" of probe set {set_name}" if set_name else "")


def format_phases(phases: Iterable[Phase]) -> list[str]:
    """One line per phase, 'Phase NAME: N ms (detail)'."""
    return [f"Phase {p.name}: {p.seconds * 1000:.0f} ms" + (f" ({p.detail})" if p.detail else "") for p in phases]


def phase_fields(phases: Iterable[Phase]) -> dict[str, float]:
    """The phases as log fields: NAME_ms -> milliseconds (repeated names add up)."""
    out: dict[str, float] = {}
    for p in phases:
        key = f"{p.name.replace('-', '_')}_ms"
        out[key] = round(out.get(key, 0.0) + p.seconds * 1000, 1)
    return out


def attach_phases(sets: Sequence[Any]) -> list[Phase]:
    """Each probe set's (runtime.probe_set.ProbeSet) BPF object load and attach, as phases."""
    out = []
    for ps in sets:
        name = f" of probe set {ps.name}" if len(sets) > 1 else ""
        out.append(Phase("load", ps.load_s, f"BPF object{name}"))
        if ps.report is not None:
            verify = ps.report.verify_ms
            mode = attach_modes.BY_NAME.get(ps.mode)
            what = mode.verified if mode else "a program"  # what its clones are: a pair for fentry
            clones = f", {verify / 1000:.1f} s of it verifying {what} per function" if verify else ""
            hooked = ps.report.syscall_entries  # the syscall preset's entries: started at the tracepoints
            points = sorted(syscall_hooks.for_mode(mode).values())
            tps = f", {hooked} syscall entries at the {' and '.join(points)} tracepoint{'s' * (len(points) > 1)}" \
                if hooked else ""
            out.append(Phase("attach", ps.report.attach_ms / 1000,
                             f"{ps.attached} functions, {ps.mode}{clones}{tps}{name}"))
    return out

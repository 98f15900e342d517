"""Where the kernel spends a workload's time under a tracer: bpftrace's `profile` probe, folded by function.

BPF time per call (run_time_ns) says how much a tool's programs cost, not where inside them: a kernel
stack walk is one helper call to the statistics. A sampling profile of the traced workload says which
kernel functions the time went to (the unwinder, the ftrace trampoline lookup, our program's own code).

The sampler is a perf-event BPF program. The kernel skips it while a kprobe-type BPF program runs on the
CPU (bpf_prog_active), so under the kprobe modes the samples inside those programs are lost and their
share reads low; under fentry/fexit nothing is skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

USER = "[user]"  # a sample taken in user space: no kernel frames
_OFFSET = re.compile(r"\+\d+$")
_BPF_PROG = re.compile(r"^bpf_prog_[0-9a-f]{16}_")
_TRAMPOLINE = re.compile(r"^bpf_trampoline_\d+$")


@dataclass(frozen=True)
class Profile:
    samples: int
    self_share: list[tuple[str, float]]  # the sampled function itself, share of all samples, largest first
    total_share: list[tuple[str, float]]  # the function anywhere in the sampled stack (once per stack)

    def as_dict(self) -> dict:
        return {"samples": self.samples, "self": [[f, round(s, 4)] for f, s in self.self_share],
                "total": [[f, round(s, 4)] for f, s in self.total_share]}


def frame_name(symbol: str) -> str:
    """A stack line as one name per function: offsets dropped, BPF programs named without their tag."""
    name = _OFFSET.sub("", symbol.strip())
    if _TRAMPOLINE.match(name):
        return "bpf_trampoline"
    return _BPF_PROG.sub("bpf_prog_", name)


def parse_stacks(text: str) -> list[tuple[list[str], int]]:
    """bpftrace's printout of `@[kstack(N)] = count()`: (frames, leaf first; count) per stack."""
    out: list[tuple[list[str], int]] = []
    frames: list[str] | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("@["):
            frames = []
            rest = s[2:]
            if rest.startswith("]:"):  # an empty stack prints on one line: @[]: 12
                out.append(([], int(rest[2:])))
                frames = None
        elif frames is not None and s.startswith("]:"):
            out.append((frames, int(s[2:])))
            frames = None
        elif frames is not None and s:
            frames.append(frame_name(s))
    return out


def fold(stacks: Iterable[tuple[list[str], int]], top: int = 40) -> Profile:
    self_n: Counter[str] = Counter()
    total_n: Counter[str] = Counter()
    samples = 0
    for frames, n in stacks:
        samples += n
        self_n[frames[0] if frames else USER] += n
        for f in set(frames) or {USER}:
            total_n[f] += n

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, k / samples) for f, k in c.most_common(top)] if samples else []

    return Profile(samples, share(self_n), share(total_n))


def script(hz: int, cpu: int, comm: str, depth: int = 16) -> str:
    conds = [f"cpu == {cpu}"] if cpu >= 0 else []
    conds += [f'comm == "{comm}"'] if comm else []
    pred = f" /{' && '.join(conds)}/" if conds else ""
    return (f'BEGIN {{ printf("READY\\n"); }}\nprofile:hz:{hz}{pred} {{ @[kstack({depth})] = count(); }}\n')

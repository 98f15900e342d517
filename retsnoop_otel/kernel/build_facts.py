"""The answers of the feature probes that are facts of the kernel build (the attach types and helpers it knows): kept
in the kernel cache per build, so that a reboot into the same kernel probes nothing, and the attach modes' probed only
when asked for (features.detect runs the probes)."""

import errno as _errno
import os
import threading
from collections.abc import Callable, Iterator, Mapping

from retsnoop_otel.kernel import attach_modes
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.kcache import KernelCache, KernelIdentity
from retsnoop_otel.kernel.mode_probes import Feature

# The probes whose answer is a fact of the kernel build (attach types and helpers it knows), unlike the
# process's privileges, LBR, kallsyms visibility or tracefs, which are probed at every start.
BUILD_FACTS = (*attach_modes.FEATURES, "session_kfunc", "user_functions", "ringbuf", "func_ip",
               "bpf_cookie", "branch_snapshot")
OTHER_FACTS = tuple(f for f in BUILD_FACTS if f not in attach_modes.FEATURES)  # probed together at every probe
DENIED = (_errno.EPERM, _errno.EACCES)
FORMAT_FEATURES = 1


class ProbeCache:
    """Where the build facts are kept, across boots of one kernel build (the first start after a reboot
    skips ~1.4 s of probes under emulation). Answers that policy, not the build, could have given
    (EPERM/EACCES) are never stored, and the key holds what can change them between boots of one build or
    at run time: the lockdown level (root can raise it), the kernel's command line and whether BPF
    programs are JIT-compiled (no trampoline without the JIT)."""

    __slots__ = ("cache", "key", "hit")

    def __init__(self, cache: KernelCache, key: str | None, hit: bool = False) -> None:
        self.cache = cache
        self.key = key
        self.hit = hit  # the last load() found this build's facts

    @classmethod
    def for_build(cls, cache: KernelCache, ident: KernelIdentity, root: str = "/") -> "ProbeCache":
        build = ident.build_key()
        if build is None:
            return cls(cache, None)
        lockdown = _read_text(os.path.join(root, "sys/kernel/security/lockdown"))
        cmdline = _read_text(os.path.join(root, "proc/cmdline"))
        jit = _read_text(os.path.join(root, "proc/sys/net/core/bpf_jit_enable"))
        major, minor = lb.version()
        return cls(cache, f"{build}:{lockdown}:jit {jit}:{cmdline}:libbpf {major}.{minor}")

    def load(self) -> dict[str, Feature] | None:
        """Every build fact but the modes', and the modes' a start on this build asked for."""
        stored = self.cache.read(f"features-{FORMAT_FEATURES}", self.key)
        if not isinstance(stored, dict) or not set(OTHER_FACTS) <= set(stored) <= set(BUILD_FACTS):
            return None
        try:
            facts = {name: Feature(*row) for name, row in stored.items()}
        except TypeError:
            return None
        self.hit = True
        return facts

    def store(self, facts: Mapping[str, Feature], capabilities: Feature) -> None:
        if not capabilities.available or any(f.errno in DENIED for f in facts.values()):
            return
        self.cache.write(f"features-{FORMAT_FEATURES}", self.key,
                         {name: (f.name, f.available, f.detail, f.errno, f.why) for name, f in facts.items()})


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class ModeFacts(Mapping[str, Feature]):
    """The attach modes' answers by feature name (attach_modes.FEATURES, in that order), each probed the first time
    it is asked for when not given. A start needs only the mode it runs (the first usable of AUTO_ORDER, or the one
    asked for), while every other mode's probe attaches and detaches too: on 6.12 under emulation 100-600 ms each,
    which the kernel does one after another (ftrace's lock), so a first start waited for all of them
    (bench/RESULTS.md). Safe to ask from any thread: a probe runs once."""

    def __init__(self, known: Mapping[str, Feature], probe: Callable[[str], Feature] | None = None,
                 probed: Callable[[dict[str, Feature]], None] | None = None) -> None:
        self._known = dict(known)
        self._probe = probe  # None: every answer is given
        self._probed = probed  # told every answer known each time one more was probed (the kernel cache stores them)
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Feature:
        found = self._known.get(name)
        if found is not None:
            return found
        if name not in attach_modes.FEATURES or self._probe is None:
            raise KeyError(name)
        with self._lock:
            if name not in self._known:
                self._known[name] = self._probe(name)
                if self._probed is not None:
                    self._probed(dict(self._known))
            return self._known[name]

    def __iter__(self) -> Iterator[str]:
        return iter(attach_modes.FEATURES)

    def __len__(self) -> int:
        return len(attach_modes.FEATURES)

    def known(self) -> dict[str, Feature]:
        """The answers found so far, without probing."""
        return dict(self._known)

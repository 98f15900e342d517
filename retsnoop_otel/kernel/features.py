"""What the running kernel lets a tracer do, found by trying each thing (and undoing it).

Kernel version numbers and config files lie by omission (backports, lockdown, LSM policies,
missing PMUs), so every attach mode is probed by loading and attaching a two-instruction program
to a harmless function and closing it at once; the kernel config only explains a refusal. Each
result says why when something is missing.
"""

import errno as _errno
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import NamedTuple

from retsnoop_otel.command.streams import start_signals_held
from retsnoop_otel.kernel import attach_modes, bpfsys, uprobes
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.build_facts import DENIED, OTHER_FACTS, ModeFacts, ProbeCache
from retsnoop_otel.kernel.caps import TRACING_CAPS, CapsError, can_trace, effective_caps
from retsnoop_otel.kernel.kcache import KernelCache, KernelIdentity
from retsnoop_otel.kernel.kconfig import kernel_config
from retsnoop_otel.kernel.libbpf_btf import Btf
from retsnoop_otel.kernel.mode_probes import (  # noqa: F401 - PROBE_TARGETS is used as features.PROBE_TARGETS
    HELPER_GET_ATTACH_COOKIE,
    PROBE_TARGETS,
    Feature,
    FuncIdLookup,
    probe_session_kfunc,
)
from retsnoop_otel.kernel.mode_probes import refused as _refused

HELPER_GET_FUNC_IP = 173
HELPER_GET_BRANCH_SNAPSHOT = 176

VM_HINT = ("run retsnoop-otel on a kernel that allows them, for example in a VM "
           "(tests/vm/run -- retsnoop-otel trace ...)")
MODES = ("auto", *attach_modes.NAMES)


class FeatureError(RuntimeError):
    """The kernel lacks what the requested tracing mode needs (one sentence, with what to do)."""


class Features(NamedTuple):
    kernel_release: str
    libbpf_version: str
    btf: Feature
    modes: Mapping[str, Feature]  # by feature name (attach_modes.FEATURES, in the order of attach_modes.MODES)
    session_kfunc: Feature
    user_functions: Feature
    ringbuf: Feature
    func_ip: Feature
    bpf_cookie: Feature
    branch_snapshot: Feature
    lbr: Feature
    filter_functions: Feature
    kallsyms: Feature
    capabilities: Feature
    machine: str = ""  # uname -m: the BPF object and libbpf are built for one architecture (x86_64, aarch64)

    def mode(self, name: str) -> Feature:
        """Whether attach mode `name` (attach_modes.NAMES) works here."""
        return self.modes[attach_modes.BY_NAME[name].feature]

    def entries(self) -> Iterator[Feature]:
        for name in self._fields:
            value = getattr(self, name)
            if isinstance(value, Feature):
                yield value
            elif name == "modes":
                yield from value.values()

    def to_dict(self) -> dict:
        return {"kernel_release": self.kernel_release, "machine": self.machine, "libbpf_version": self.libbpf_version,
                "features": {f.name: {k: v for k, v in f._asdict().items() if k != "name"}
                             for f in self.entries()}}


# ---- probes -------------------------------------------------------------------------------------


def probe_user_functions(btf: Btf | None, cookies: Feature) -> Feature:
    """The attach modes of user-space functions (u:BINARY:GLOB), from the same facts the tracer chooses by
    (kernel/uprobes.py): the attach types the kernel's BTF names, and BPF cookies."""
    name = "user_functions"
    if cookies.errno in DENIED:
        return _refused(name, cookies.errno, f"user-space functions cannot be probed: the kernel {DENIED_WHY}",
                        DENIED_WHY)
    if not cookies.available:
        return Feature(name, False, "needs BPF cookies (Linux 5.15+) to tell user functions apart", cookies.errno
                       or _errno.ENOTSUP, "has no BPF cookies for user-space functions (Linux 5.15+ needed)")
    if btf is None:
        return Feature(name, False, "needs kernel BTF to read the attach types it knows", _errno.ENOENT,
                       "has no BTF to read its attach types from")
    names = [uprobes.NAMES[m] for m in uprobes.user_modes(btf.enumerators("bpf_attach_type"))]
    return Feature(name, True, ", ".join(names) + (f" (default {names[0]})" if len(names) > 1 else ""))


def probe_btf(root: str) -> Feature:
    path = os.path.join(root, "sys/kernel/btf/vmlinux")
    try:
        size = os.stat(path).st_size
    except OSError:
        return Feature("btf", False, f"{path} is missing: the kernel was built without CONFIG_DEBUG_INFO_BTF",
                       _errno.ENOENT, "has no BTF (CONFIG_DEBUG_INFO_BTF is off)")
    return Feature("btf", True, f"{path} ({size / 1e6:.1f} MB)")


DENIED_WHY = "denies BPF to this process (missing CAP_BPF, or CAP_SYS_ADMIN; or an LSM policy)"


def probe_ringbuf() -> Feature:
    """Create a ring buffer map: EINVAL means the kernel does not know the type, EPERM that this process may not."""
    try:
        os.close(bpfsys.map_create(lb.MAP_TYPE_RINGBUF, 0, 0, 4096))
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        if err in (_errno.EPERM, _errno.EACCES):
            return _refused("ringbuf", err, "the kernel " + DENIED_WHY, DENIED_WHY)
        return Feature("ringbuf", False, "BPF_MAP_TYPE_RINGBUF is unknown to this kernel (Linux 5.8+ needed)",
                       err, "has no BPF ring buffer (Linux 5.8+ needed)")
    return Feature("ringbuf", True, "BPF_MAP_TYPE_RINGBUF maps can be created")


def probe_helper(name: str, helper_id: int, helper: str, since: str) -> Feature:
    """Whether kprobe programs may call a helper (libbpf loads a tiny program that calls it). libbpf reads any
    refusal without "unknown func" in the verifier's log as yes, so a process that may not load programs at all
    is told apart first."""
    try:
        os.close(bpfsys.prog_load(bpfsys.PROG_KPROBE, bpfsys.RETURN_ZERO))
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        if err in (_errno.EPERM, _errno.EACCES):
            return _refused(name, err, f"{helper}() cannot be probed: the kernel {DENIED_WHY}", DENIED_WHY)
    if lb.probe_helper(lb.PROG_TYPE_KPROBE, helper_id):
        return Feature(name, True, f"{helper}() is allowed in kprobe programs")
    return Feature(name, False, f"{helper}() is not allowed in kprobe programs ({since}+ needed)",
                   _errno.EINVAL, f"has no {helper}() helper")


def probe_lbr(cpu: int = 0) -> Feature:
    """Open the perf event that LBR capture needs (branch stack of kernel returns) on one CPU."""
    name = "lbr"
    try:
        fd = bpfsys.perf_lbr_open(cpu)
    except OSError as exc:
        err = exc.errno or _errno.EINVAL
        if err in (_errno.ENOENT, _errno.EOPNOTSUPP, _errno.ENODEV):
            meaning = "no last branch records: the CPU or hypervisor exposes no LBR to this kernel"
        elif err in (_errno.EPERM, _errno.EACCES):
            meaning = "the kernel denies hardware perf events to this process (perf_event_paranoid or policy)"
        else:
            meaning = f"opening a branch-stack perf event failed: {os.strerror(err)}"
        return _refused(name, err, meaning, "cannot record branches (LBR)")
    os.close(fd)
    return Feature(name, True, f"branch-stack perf event opened on CPU {cpu}")


def probe_filter_functions(root: str, count: bool = True) -> Feature:
    """Whether available_filter_functions can be read; `count` reads it all to say how many it lists
    (the kernel generates the file on every read: the tracer's start reads it once, for discovery)."""
    from retsnoop_otel.kernel import tracefs
    name = "filter_functions"
    try:
        text = tracefs.read_available_filter_functions_text(root, None if count else 4096)
    except tracefs.TracefsError as exc:
        return Feature(name, False, str(exc), _errno.EPERM if "EPERM" in str(exc) else _errno.ENOENT,
                       "does not list traceable functions (available_filter_functions)")
    if not count:
        return Feature(name, True, "available_filter_functions is readable")
    listed = len(tracefs.parse_available_filter_functions(text))
    return Feature(name, True, f"available_filter_functions lists {listed} functions")


def probe_kallsyms(root: str) -> Feature:
    """Addresses in kallsyms are all zero unless kptr_restrict lets this process see them."""
    name = "kallsyms"
    path = os.path.join(root, "proc/kallsyms")
    try:
        with open(path) as f:
            head = [next(f, "") for _ in range(64)]
    except OSError as exc:
        err = exc.errno or _errno.EIO
        return Feature(name, False, f"cannot read {path}: {os.strerror(err)}", err, "hides kernel symbols")
    addrs = [int(line.split()[0], 16) for line in head if line.strip()]
    if not addrs:
        return Feature(name, False, f"{path} is empty", _errno.ENOENT, "hides kernel symbols")
    if not any(addrs):
        return Feature(name, False, f"{path} shows zero addresses (kernel.kptr_restrict hides them)",
                       _errno.EPERM, "hides kernel symbol addresses")
    return Feature(name, True, f"{path} shows real addresses")


def probe_capabilities(root: str) -> Feature:
    name = "capabilities"
    try:
        held = effective_caps(root)
    except CapsError as exc:
        return Feature(name, False, str(exc), _errno.ENOENT, "cannot tell this process's capabilities")
    shown = [c for c in TRACING_CAPS if c in held]
    missing = [c for c in TRACING_CAPS if c not in held]
    detail = "holds " + (", ".join(shown) or "none of the tracing capabilities")
    if missing:
        detail += "; lacks " + ", ".join(missing)
    if can_trace(held):
        return Feature(name, True, detail)
    return Feature(name, False, detail + " (tracing needs CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN)",
                   _errno.EPERM, "needs CAP_BPF and CAP_PERFMON (or root) to trace")


def _side_by_side(probes: dict[str, Callable[[], Feature]]) -> dict[str, Feature]:
    """Run probes on threads: each mostly waits on the kernel (verification, text patching, RCU grace
    periods on detach) with the GIL dropped, so their waits overlap instead of adding up.

    A Ctrl-C in the caller's thread (while it starts or joins them) leaves only once no probe runs: the caller then
    frees what they use (the kernel's BTF, in detect), and freed under a running probe it crashed the process
    (SIGSEGV). A probe that has not begun by then does not begin."""
    results: dict[str, Feature | BaseException] = {}
    state = threading.Condition()
    running: set[str] = set()
    stopped: list[bool] = []

    def run(name: str, probe: Callable[[], Feature]) -> None:
        with state:
            if stopped:
                return
            running.add(name)
        try:
            results[name] = probe()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            results[name] = exc
        finally:
            with state:
                running.discard(name)
                state.notify_all()

    threads = [threading.Thread(target=run, args=item, name=f"probe-{item[0]}") for item in probes.items()]
    try:
        with start_signals_held():  # a start's Ctrl-C: raised once they are done (the command's handler, cli.py)
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    except BaseException:  # Python's own handler (the package imported by a program): in the middle of them
        with state:
            stopped.append(True)
            state.wait_for(lambda: not running)
        raise
    out: dict[str, Feature] = {}
    for name in probes:
        res = results[name]
        if isinstance(res, BaseException):
            raise res
        out[name] = res
    return out


def _probe_build_facts(root: str, targets: Btf | FuncIdLookup | None, config: dict[str, str],
                       btf: Callable[[], Btf | None], modes: Iterable[str] = attach_modes.FEATURES,
                       others: bool = True) -> dict[str, Feature]:
    """The facts of `modes` (feature names), and with `others` those of OTHER_FACTS. `btf`: the kernel's BTF, for
    the facts a name -> id lookup cannot answer (a kfunc's prototype, the attach types); called from one thread only.
    Everything is probed side by side: libbpf's load of the BTF (40-70 ms under emulation) and the helpers' loads
    wait beside the modes' attaches and detaches."""
    facts: dict[str, Feature] = {}  # what btf_facts finds besides its own answer

    def btf_facts() -> Feature:  # one thread: the BTF is loaded once, then only read
        kernel_btf = targets if isinstance(targets, Btf) else btf()
        facts["bpf_cookie"] = probe_helper("bpf_cookie", HELPER_GET_ATTACH_COOKIE, "bpf_get_attach_cookie",
                                           "Linux 5.15")
        facts["session_kfunc"] = probe_session_kfunc(kernel_btf)
        return probe_user_functions(kernel_btf, facts["bpf_cookie"])

    # a feature several modes share (the same kernel capability, attached differently) is probed once
    probes: dict[str, Callable[[], Feature]] = {f: partial(attach_modes.FEATURES[f].probe, root, targets, config)
                                                for f in modes}
    if others:
        probes |= {"user_functions": btf_facts, "ringbuf": probe_ringbuf,
                   "func_ip": partial(probe_helper, "func_ip", HELPER_GET_FUNC_IP, "bpf_get_func_ip", "Linux 5.15"),
                   "branch_snapshot": partial(probe_helper, "branch_snapshot", HELPER_GET_BRANCH_SNAPSHOT,
                                              "bpf_get_branch_snapshot", "Linux 5.16")}
    return {**_side_by_side(probes), **facts}


def detect(root: str = "/", func_id: FuncIdLookup | None = None, thorough: bool = True,
           cache: ProbeCache | None = None) -> Features:
    """Probe the running kernel; files (sysfs, procfs, tracefs) are read under `root`.

    `func_id` finds the probes' target functions in BTF (else libbpf's BTF is loaded for that, and every mode is
    probed now); `thorough=False` (a tracer starting) checks that available_filter_functions is readable without
    counting its functions, and probes only the first mode of AUTO_ORDER now, any other when asked for (ModeFacts).
    `cache`: take the build facts from there when a start on this build stored them (each costs a program load and
    attach: 0.6 s together under emulation), else store them, and the modes probed later too."""
    release = os.uname().release
    btf_feature = probe_btf(root)
    capabilities = probe_capabilities(root)
    major, minor = lb.version()
    lazy = not thorough and func_id is not None and btf_feature.available
    now = {attach_modes.BY_NAME[attach_modes.AUTO_ORDER[0]].feature} if lazy else set(attach_modes.FEATURES)
    facts = cache.load() if cache is not None and capabilities.available else None
    config: dict[str, str] = {}
    if facts is None or not now <= set(facts):
        config = kernel_config(root, release)
        loaded: list[Btf] = []

        def kernel_btf() -> Btf | None:
            if not loaded and btf_feature.available:
                try:
                    loaded.append(Btf.load_vmlinux())
                except lb.LibbpfError:
                    return None
            return loaded[0] if loaded else None
        targets: Btf | FuncIdLookup | None = func_id if btf_feature.available and func_id is not None \
            else kernel_btf()
        try:
            facts = {**(facts or {}), **_probe_build_facts(root, targets, config, kernel_btf,
                                                           sorted(now - set(facts or {})), others=facts is None)}
        finally:
            for btf in loaded:
                btf.free()
        if cache is not None:
            cache.hit = False
            cache.store(facts, capabilities)
    others = {f: facts[f] for f in OTHER_FACTS}

    def probe_mode(feature: str) -> Feature:
        if not config:  # the build facts came from the cache: the kernel's config read for the first mode asked
            config.update(kernel_config(root, release))
        return _probe_build_facts(root, func_id, config, lambda: None, [feature], others=False)[feature]

    def probed(modes: dict[str, Feature]) -> None:
        if cache is not None:
            cache.store({**others, **modes}, capabilities)
    modes = ModeFacts({f: facts[f] for f in attach_modes.FEATURES if f in facts}, probe_mode if lazy else None,
                      probed)
    return Features(
        kernel_release=release,
        machine=os.uname().machine,
        libbpf_version=f"{major}.{minor}",
        btf=btf_feature,
        modes=modes,
        **others,
        lbr=probe_lbr(),
        filter_functions=probe_filter_functions(root, count=thorough),
        kallsyms=probe_kallsyms(root),
        capabilities=capabilities,
    )


def detect_at_start(cache: KernelCache, ident: KernelIdentity, root: str = "/",
                    func_id: FuncIdLookup | None = None) -> tuple[Features, bool]:
    """What a tracer's start probes (the build facts from the kernel cache when a start on this build stored them);
    (the features, whether the build facts were cached)."""
    probed = ProbeCache.for_build(cache, ident, root)
    return detect(root, func_id=func_id, thorough=False, cache=probed), probed.hit


# ---- using the result ---------------------------------------------------------------------------

def choose_mode(features: Features) -> str:
    """The first usable mode of attach_modes.AUTO_ORDER; 'auto' when none works (require_tracing explains)."""
    for mode in attach_modes.AUTO_ORDER:
        if features.mode(mode).available:
            return mode
    return "auto"


def require_tracing(features: Features, mode: str) -> None:
    """Raise FeatureError (one sentence: what is missing and what to do) unless `mode` can trace here."""
    if mode not in MODES:
        raise ValueError(f"unknown tracing mode '{mode}' (expected one of {', '.join(MODES)})")
    caps = features.capabilities
    if not caps.available and caps.errno == _errno.EPERM:  # every probe below was refused for that reason
        raise FeatureError(f"this process {caps.why}: run it as root, or in a container add those capabilities "
                           "(--cap-add BPF --cap-add PERFMON; see the Dockerfile)")
    for prereq, use in ((features.btf, "to read kernel function types"),
                        (features.ringbuf, "to stream captured calls")):
        if not prereq.available:
            raise FeatureError(f"this kernel {prereq.why}, which retsnoop-otel needs {use}: {VM_HINT}")
    if not any(features.mode(m).available for m in attach_modes.CHECK_ORDER):  # the first usable ends the probes
        raise FeatureError(f"this kernel {' and '.join(features.mode(m).why for m in attach_modes.BASIC)}, so kernel "
                           f"functions cannot be traced here: {VM_HINT}")
    if mode == "auto":
        return
    feat = features.mode(mode)
    if not feat.available:
        usable = [m for m in attach_modes.OFFER_ORDER if features.mode(m).available]
        m = attach_modes.BY_NAME[mode]  # a mode without sessions (--origins-only): none of the others does what it does
        instead = (f"use {' or '.join(attach_modes.BY_NAME[u].shown for u in usable)} instead, or leave the mode out "
                   "to pick one automatically") if m.sessions else ("leave it out, and the sessions of another mode "
                                                                   "count the origins too, at a higher cost per call")
        raise FeatureError(f"this kernel {feat.why}, so {m.shown} cannot be used here: {instead}")


def format_features(features: Features) -> str:
    machine = f" ({features.machine})" if features.machine else ""
    lines = [f"Kernel {features.kernel_release}{machine}, libbpf {features.libbpf_version} (built with the package)"]
    width = max(len(f.name) for f in features.entries())
    for f in features.entries():
        lines.append(f"  {f.name:<{width}}  {'yes' if f.available else 'NO ':<3}  {f.detail}")
    user = features.user_functions  # before the verdict, which stays last: it says what to do
    lines.append("User-space functions (u:BINARY:GLOB): " + (f"possible; {user.detail}" if user.available else
                                                            f"not possible: this kernel {user.why}"))
    mode = choose_mode(features)
    try:
        require_tracing(features, "auto")
        lines.append(f"Tracing: possible; default attach mode {mode}")
    except FeatureError as exc:
        lines.append(f"Tracing: not possible: {exc}")
    return "\n".join(lines)

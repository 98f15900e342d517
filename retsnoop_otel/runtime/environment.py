"""The running kernel as discovery and symbolization see it, resolved once per (re)load.

One place reads the kernel's facts (features, kallsyms, available_filter_functions, BTF return
kinds, an optional DWARF vmlinux) for both commands; the agent's unit tests hand the runtime a
fake KernelEnv instead. The checks of what the user named (vmlinux, cgroup, privileges) live here
too, so that they run before the slow kernel reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence, Sized
from functools import partial
from typing import TYPE_CHECKING

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.command.errors import InputError, SetupError
from retsnoop_otel.inputs.files import plain
from retsnoop_otel.runtime.config import ProbeSetConfig, SymbolsConfig
from retsnoop_otel.runtime.startup import Phase, phase_since
from retsnoop_otel.workload.cgroupfs import cgroup2_mount

if TYPE_CHECKING:
    from retsnoop_otel.capture.inject import TpFormat
    from retsnoop_otel.symbols.read_ahead import Ahead, TablesAhead


def _nothing() -> None:
    return None


def _no_uprobes(asked: str) -> str:
    raise SetupError("user-space functions cannot be traced with this kernel environment")


def name_it(name: str, message: str) -> str:
    """'-k /x: no such file' for flags, 'vmlinux: /x: no such file' for config keys."""
    return f"{name} {message}" if name.startswith("-") else f"{name}: {message}"


class KernelEnv:
    """Facts about the running kernel that discovery and symbolization need."""

    __slots__ = ("ksyms", "available", "ret_kind", "btf_func_id", "auto_mode", "kernel_mode", "symbolizer",
                 "resolve_source_glob", "close", "lbr_missing", "btf", "vmlinux", "phases", "load_btf",
                 "kernel_refusal", "user_mode", "tp_formats")

    def __init__(self, ksyms: object, available: object, ret_kind: Callable[[str], RetKind],
                 btf_func_id: Callable[[str], int | None] | None, auto_mode: str, kernel_mode: Callable[[str], str],
                 symbolizer: object, resolve_source_glob: Callable[[str], set[str]] | None = None,
                 close: Callable[[], None] = _nothing, lbr_missing: str = "", btf: object | None = None,
                 vmlinux: str | None = None, phases: list[Phase] | None = None,
                 load_btf: Callable[[], object] | None = None, kernel_refusal: str = "",
                 user_mode: Callable[[str], str] | None = None) -> None:
        self.ksyms = ksyms  # symbols.kallsyms.Kallsyms
        self.available = available  # symbols.traceable.Traceable
        self.ret_kind = ret_kind
        self.btf_func_id = btf_func_id
        self.auto_mode = auto_mode
        # the kernel attach mode asked -> the one to use (a cheaper flavour of it where this kernel has one); raises
        # SetupError when the mode cannot trace here
        self.kernel_mode = kernel_mode
        self.symbolizer = symbolizer  # symbols.symbolize.Symbolizer
        self.resolve_source_glob = resolve_source_glob
        self.close = close
        self.lbr_missing = lbr_missing  # why LBR capture cannot work here ("" = it can)
        self.btf = btf  # kernel.libbpf_btf.Btf, for argument capture (-A): see kernel_btf()
        self.vmlinux = vmlinux  # the DWARF vmlinux in use
        self.phases = [] if phases is None else phases  # how long each read took (trace -v, agent start log)
        self.load_btf = load_btf  # loads `btf` on first use (only argument capture needs it)
        # why kernel functions cannot be traced here ("" = they can): user-space functions still can
        self.kernel_refusal = kernel_refusal
        self.user_mode = user_mode or _no_uprobes  # the user attach mode asked -> the one to use; raises SetupError
        # tracepoint formats (capture.inject.TpFormat) by (category, name), read from tracefs once for this kernel
        # by the injected probes that name them (runtime/probe_set.py resolve_injected)
        self.tp_formats: dict[tuple[str, str], TpFormat] = {}

    def refuse_kernel_only(self, sets: Sequence[ProbeSetConfig]) -> None:
        """A kernel that refuses kernel tracing and no probe set of user functions: the host's one-line refusal."""
        from retsnoop_otel.symbols.discovery import is_user_spec  # globs as values: no '@file' is read here
        if self.kernel_refusal and not any(is_user_spec(g) for ps in sets for g in (*ps.entry, *ps.allow)):
            raise SetupError(self.kernel_refusal)

    def traceable_once(self, name: str) -> int | None:
        """A kernel function's address where the kernel has one instance of it, traceable; else None."""
        syms = [s for s in self.ksyms.by_name(name) if s.module is None]  # type: ignore[attr-defined]
        return syms[0].addr if len(syms) == 1 and self.available.count(name) == 1 else None  # type: ignore[attr-defined]

    def kernel_btf(self) -> object | None:
        if self.btf is None and self.load_btf is not None:
            self.btf, self.load_btf = self.load_btf(), None
        return self.btf


def find_vmlinux(symbols: SymbolsConfig, name: str, root: str = "/") -> str | None:
    """The DWARF vmlinux to use, checked against the running kernel's build-id (cheap: before kernel reads)."""
    if symbols.vmlinux is None:
        return None
    from retsnoop_otel.symbols.vmlinux import DwarfError
    from retsnoop_otel.symbols.vmlinux import find_vmlinux as find
    try:
        return find(None if symbols.vmlinux == "auto" else symbols.vmlinux, root)
    except DwarfError as exc:
        raise InputError(name_it(name, str(exc))) from None


def check_privileges(root: str = "/") -> None:
    """Root, or CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN): an EPERM from the kernel would say much less."""
    from retsnoop_otel.kernel.caps import CapsError, can_trace, effective_caps
    try:
        caps = effective_caps(root)
    except CapsError as exc:
        raise SetupError(f"cannot tell this process's capabilities ({exc}): run it as root") from None
    if os.geteuid() != 0 and not can_trace(caps):
        raise SetupError("tracing kernel functions needs root or the CAP_BPF and CAP_PERFMON capabilities: "
                         "run it with sudo")


def kernel_state(root: str = "/") -> str | None:
    """What a loaded KernelEnv stays true for: this kernel build, this boot, these modules (the kernel
    cache's key). None when the kernel does not say (then nothing is reused)."""
    from retsnoop_otel.kernel.kcache import kernel_identity
    return kernel_identity(root).boot_key()


def lbr_refusal(setting: str, why: str, probe_set: str | None = None) -> SetupError:
    return SetupError(f"{setting} needs last branch records, but {why}: run without {setting}, or on a machine "
                      "whose CPU exposes LBR to this kernel (bare metal or a VM with LBR passthrough)", probe_set)


def _beside(got: Ahead | None) -> str:
    return f", read beside the imports in {got.seconds * 1000:.0f} ms" if got is not None else ""


def kernel_env_loader(ahead: TablesAhead | None) -> Callable[..., KernelEnv]:
    """load_kernel_env, taking the kernel's tables `ahead` read (symbols/read_ahead.py) when it read them."""
    return load_kernel_env if ahead is None else partial(load_kernel_env, ahead=ahead)


def load_kernel_env(symbols: SymbolsConfig, vmlinux: str | None, lbr: tuple[str, str | None] | None = None,
                    root: str = "/", ahead: TablesAhead | None = None) -> KernelEnv:
    """Features, kallsyms, available_filter_functions, BTF and (optionally) a DWARF vmlinux.

    `lbr`: (how the user asked for LBR, the probe set that did) when one did: a machine without LBR
    is said first, before what else it lacks, since that is what the user asked for. Kernel symbols
    and function types come from the kernel cache when their key still holds (kernel/kcache.py).
    """
    from retsnoop_otel.kernel import attach_modes, features, tracefs
    from retsnoop_otel.kernel import libbpf as lb
    from retsnoop_otel.kernel.kcache import KernelCache, kernel_identity
    from retsnoop_otel.kernel.lbr import lbr_missing
    from retsnoop_otel.kernel.libbpf_btf import Btf
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms, KallsymsError
    from retsnoop_otel.symbols.kernel_facts import load_func_types, load_symbols
    from retsnoop_otel.symbols.symbolize import DwarfSymbolizer, KallsymsSymbolizer
    from retsnoop_otel.symbols.traceable import Traceable

    phases: list[Phase] = []
    assert symbols.cache_dir is not None, "resolved with the run's environment (runtime/settings.py)"
    cache = KernelCache.at(symbols.cache_dir)
    t = time.monotonic()
    ident = kernel_identity(root)
    try:  # the kernel's function types first: the feature probes look their targets up in them
        got = ahead.take("types", symbols.cache_dir, ident, root) if ahead is not None else None
        types, cached = got.value if got is not None else load_func_types(  # the thread stored what it read
            cache, ident, root, lambda: ReturnKinds(Btf.load_vmlinux()))
        count = f"{len(types)} functions" if isinstance(types, Sized) else "libbpf lookups"
        phases.append(phase_since("btf", t, count + _beside(got) + (", cached" if cached else "")))
    except (OSError, lb.LibbpfError, lb.LibbpfUnavailable):
        types = None  # no BTF: the feature checks below say so
    t = time.monotonic()
    got = ahead.take("features", symbols.cache_dir, ident, root) if ahead is not None and types is not None else None
    try:
        feats, hit = got.value if got is not None else features.detect_at_start(
            cache, ident, root, types.func_id if types is not None else None)  # type: ignore[attr-defined]
    except lb.LibbpfUnavailable as exc:
        raise SetupError(str(exc)) from None

    def kernel_mode(mode: str) -> str:
        try:
            features.require_tracing(feats, mode)
        except features.FeatureError as exc:
            raise SetupError(str(exc)) from None
        return attach_modes.cheapest(mode, lambda m: feats.mode(m).available)

    refusal = ""
    try:  # a mode not probed yet is probed here (features.ModeFacts): counted in this phase
        kernel_mode("auto")
    except SetupError as exc:  # said when a probe set names a kernel function: user functions may still run
        refusal = exc.message
    phases.append(phase_since("features", t, "kernel feature probes" + _beside(got) + (", cached" if hit else "")))
    missing = lbr_missing(feats.lbr, feats.branch_snapshot)
    if lbr is not None and missing:
        raise lbr_refusal(lbr[0], missing, lbr[1])
    if types is None:
        raise SetupError(f"cannot read {os.path.join(root, 'sys/kernel/btf/vmlinux')}: run as root")
    t = time.monotonic()
    got = None
    if refusal:
        ksyms, available, source = Kallsyms([]), Traceable(()), ""
    else:
        got = ahead.take("symbols", symbols.cache_dir, ident, root) if ahead is not None else None
        try:  # what the thread read, it stored in the cache
            ksyms, available, source = got.value if got is not None else load_symbols(cache, ident, root)
        except (KallsymsError, tracefs.TracefsError) as exc:
            raise SetupError(str(exc)) from None
    phases.append(phase_since("symbols", t, f"{len(ksyms)} kallsyms functions, {len(available)} traceable"
                              + _beside(got) + (f", {source}" if source else "")))
    symbolizer: object = KallsymsSymbolizer(ksyms)
    resolve = None
    close = _nothing
    if vmlinux is not None:
        t = time.monotonic()
        from retsnoop_otel.symbols.dwarf import LlvmSymbolizer, SourceIndex, kaslr_offset
        resolve = SourceIndex.load_or_build(vmlinux, symbols.cache_dir).match
        if symbols.source_lines:
            source = LlvmSymbolizer(vmlinux, kaslr_offset(vmlinux, ksyms.stext),  # type: ignore[arg-type]
                                    inlines=symbols.inlines)
            symbolizer = DwarfSymbolizer(ksyms, source)
            close = source.close
        phases.append(phase_since("dwarf", t, vmlinux))

    def load_btf() -> object:
        try:
            return Btf.load_vmlinux()
        except (lb.LibbpfError, lb.LibbpfUnavailable) as exc:
            raise SetupError(str(exc)) from None

    def user_mode(asked: str) -> str:
        from retsnoop_otel.kernel import uprobes
        from retsnoop_otel.kernel.mode_probes import HELPER_GET_ATTACH_COOKIE
        btf = load_btf()
        try:
            kinds = btf.enumerators("bpf_attach_type")  # type: ignore[attr-defined]
            return uprobes.choose_user_mode(kinds, lb.probe_helper(lb.PROG_TYPE_KPROBE, HELPER_GET_ATTACH_COOKIE),
                                            asked)
        except uprobes.UprobeModeError as exc:
            raise SetupError(str(exc)) from None
        finally:
            btf.free()  # type: ignore[attr-defined]

    return KernelEnv(ksyms=ksyms, available=available, ret_kind=types, btf_func_id=types.func_id,  # type: ignore
                     auto_mode="" if refusal else features.choose_mode(feats), kernel_mode=kernel_mode,
                     symbolizer=symbolizer, kernel_refusal=refusal, user_mode=user_mode,
                     resolve_source_glob=resolve, close=close, load_btf=load_btf, vmlinux=vmlinux,
                     lbr_missing=missing, phases=phases)


def cgroup_target(path: str, name: str = "cgroup", root: str = "/") -> tuple[int, int]:
    """(id, level) of a cgroup v2 directory: the id is its inode number, the level its depth below the
    root cgroup, so that the kernel side can match tasks in it and in every cgroup below it.

    `path` is absolute (under the cgroup2 mount) or relative to the root cgroup."""
    mount = cgroup2_mount(root)
    hint = f"give a cgroup v2 path such as {mount}/system.slice/foo.service"
    under = path.startswith(mount + "/") or path == mount
    shown_path = plain(path)  # cut and escaped: a message is one line of bounded length
    if path.startswith("/sys/fs/cgroup") and not under:
        raise InputError(name_it(name, f"{shown_path} is not in the cgroup v2 hierarchy (mounted at {mount}); "
                                       f"{hint}"))
    rel = (path.removeprefix(mount) if under else path).strip("/")
    full = os.path.join(root, mount.lstrip("/"), rel)
    try:
        st = os.stat(full)
    except (OSError, ValueError) as exc:  # ValueError: a NUL character in the path
        why = exc.strerror if isinstance(exc, OSError) else "not a path (it holds a NUL character)"
        where = "" if plain(full) == shown_path or len(full) > len(plain(full)) else f" ({plain(full)})"  # cut: once
        raise InputError(name_it(name, f"{shown_path}: {why}{where}; {hint}")) from None
    if not os.path.isdir(full):
        raise InputError(name_it(name, f"{shown_path}: not a directory ({plain(full, 80)}); {hint}"))
    return st.st_ino, len([p for p in rel.split("/") if p])

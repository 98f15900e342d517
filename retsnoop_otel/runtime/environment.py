"""The running kernel as discovery and symbolization see it, resolved once per (re)load.

One place reads the kernel's facts (features, kallsyms, available_filter_functions, BTF return
kinds, an optional DWARF vmlinux) for both commands; the agent's unit tests hand the runtime a
fake KernelEnv instead. The checks of what the user named (vmlinux, cgroup, privileges) live here
too, so that they run before the slow kernel reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retsnoop_otel.capture.model import RetKind
from retsnoop_otel.runtime.config import SymbolsConfig
from retsnoop_otel.runtime.errors import InputError, SetupError
from retsnoop_otel.workload.cgroupfs import cgroup2_mount


def _nothing() -> None:
    return None


def name_it(name: str, message: str) -> str:
    """'-k /x: no such file' for flags, 'vmlinux: /x: no such file' for config keys."""
    return f"{name} {message}" if name.startswith("-") else f"{name}: {message}"


@dataclass
class KernelEnv:
    """Facts about the running kernel that discovery and symbolization need."""

    ksyms: object  # symbols.kallsyms.Kallsyms
    available: Sequence[tuple[str, str | None]]
    ret_kind: Callable[[str], RetKind]
    btf_func_id: Callable[[str], int | None] | None
    auto_mode: str
    check_mode: Callable[[str], None]  # raises SetupError when the mode cannot trace here
    symbolizer: object  # symbols.symbolize.Symbolizer
    resolve_source_glob: Callable[[str], set[str]] | None = None
    close: Callable[[], None] = _nothing
    lbr_missing: str = ""  # why LBR capture cannot work here ("" = it can)
    btf: object | None = None  # kernel.libbpf_btf.Btf, for argument capture (-A)
    vmlinux: str | None = None  # the DWARF vmlinux in use


def find_vmlinux(symbols: SymbolsConfig, name: str, root: str = "/") -> str | None:
    """The DWARF vmlinux to use, checked against the running kernel's build-id (cheap: before kernel reads)."""
    if symbols.vmlinux is None:
        return None
    from retsnoop_otel.symbols.dwarf import DwarfError
    from retsnoop_otel.symbols.dwarf import find_vmlinux as find
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


def lbr_refusal(setting: str, why: str, probe_set: str | None = None) -> SetupError:
    return SetupError(f"{setting} needs last branch records, but {why}: run without {setting}, or on a machine "
                      "whose CPU exposes LBR to this kernel (bare metal or a VM with LBR passthrough)", probe_set)


def load_kernel_env(symbols: SymbolsConfig, vmlinux: str | None, lbr: tuple[str, str | None] | None = None,
                    root: str = "/") -> KernelEnv:
    """Features, kallsyms, available_filter_functions, BTF and (optionally) a DWARF vmlinux.

    `lbr`: (how the user asked for LBR, the probe set that did) when one did: a machine without LBR
    is said first, before what else it lacks, since that is what the user asked for.
    """
    from retsnoop_otel.kernel import features, tracefs
    from retsnoop_otel.kernel import libbpf as lb
    from retsnoop_otel.kernel.lbr import lbr_missing
    from retsnoop_otel.kernel.libbpf_btf import Btf
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms, KallsymsError
    from retsnoop_otel.symbols.symbolize import DwarfSymbolizer, KallsymsSymbolizer

    try:
        feats = features.detect(root)
    except lb.LibbpfUnavailable as exc:
        raise SetupError(str(exc)) from None

    def check_mode(mode: str) -> None:
        try:
            features.require_tracing(feats, mode)
        except features.FeatureError as exc:
            raise SetupError(str(exc)) from None

    missing = lbr_missing(feats.lbr, feats.branch_snapshot)
    if lbr is not None and missing:
        raise lbr_refusal(lbr[0], missing, lbr[1])
    check_mode("auto")
    try:
        ksyms = Kallsyms.load(root)
        available = tracefs.read_available_filter_functions(root)
        btf = Btf.load_vmlinux()
    except (KallsymsError, tracefs.TracefsError, lb.LibbpfError, lb.LibbpfUnavailable) as exc:
        raise SetupError(str(exc)) from None
    ret_kinds = ReturnKinds(btf)
    symbolizer: object = KallsymsSymbolizer(ksyms)
    resolve = None
    close = _nothing
    if vmlinux is not None:
        from retsnoop_otel.symbols.dwarf import LlvmSymbolizer, SourceIndex, kaslr_offset
        resolve = SourceIndex.load_or_build(vmlinux).match
        if symbols.source_lines:
            source = LlvmSymbolizer(vmlinux, kaslr_offset(vmlinux, ksyms.stext),  # type: ignore[arg-type]
                                    inlines=symbols.inlines)
            symbolizer = DwarfSymbolizer(ksyms, source)
            close = source.close
    return KernelEnv(ksyms=ksyms, available=available, ret_kind=ret_kinds, btf_func_id=ret_kinds.func_id,
                     auto_mode=features.choose_mode(feats), check_mode=check_mode, symbolizer=symbolizer,
                     resolve_source_glob=resolve, close=close, btf=btf, vmlinux=vmlinux, lbr_missing=missing)


def cgroup_target(path: str, name: str = "cgroup", root: str = "/") -> tuple[int, int]:
    """(id, level) of a cgroup v2 directory: the id is its inode number, the level its depth below the
    root cgroup, so that the kernel side can match tasks in it and in every cgroup below it.

    `path` is absolute (under the cgroup2 mount) or relative to the root cgroup."""
    mount = cgroup2_mount(root)
    hint = f"give a cgroup v2 path such as {mount}/system.slice/foo.service"
    under = path.startswith(mount + "/") or path == mount
    if path.startswith("/sys/fs/cgroup") and not under:
        raise InputError(name_it(name, f"{path} is not in the cgroup v2 hierarchy (mounted at {mount}); {hint}"))
    rel = (path.removeprefix(mount) if under else path).strip("/")
    full = os.path.join(root, mount.lstrip("/"), rel)
    try:
        st = os.stat(full)
    except OSError as exc:
        raise InputError(name_it(name, f"{path}: {exc.strerror} ({full}); {hint}")) from None
    if not os.path.isdir(full):
        raise InputError(name_it(name, f"{path}: not a directory ({full}); {hint}"))
    return st.st_ino, len([p for p in rel.split("/") if p])

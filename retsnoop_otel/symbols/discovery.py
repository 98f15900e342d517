"""Function discovery: user globs + kallsyms + available_filter_functions + deny lists -> TracedFuncs.

Glob forms follow retsnoop: `*` and `?` wildcards (globs.py), `'func_glob [mod_glob]'` for module
functions, `:path/glob.c` for every function defined in matching source files (resolved from DWARF
by an injected callable), and `@file` for one glob per line (expanded by the input layer with
expand_glob_args(); discover() takes the globs as values). Deny always wins; entry globs are also
allow globs; a plain entry glob that ends up attaching nothing is an error, as in retsnoop.
"""

import re
from collections.abc import Callable, Container, Iterable, Sequence
from typing import NamedTuple

from retsnoop_otel.capture.inject import ProbeInfo
from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.inputs.files import MAX_GLOB_FILE_BYTES, expand_at_files, shown
from retsnoop_otel.kernel.attach_modes import BY_NAME, NAMES, TRAMPOLINE, USER_MODES
from retsnoop_otel.symbols.globs import glob_to_regex, lines_matching, name_blob
from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.traceable import Traceable

NOT_AVAILABLE = "not in available_filter_functions"
AMBIGUOUS = "ambiguous instances"


class DiscoveryError(Exception):
    """A glob, glob file or function set the user has to change."""


class GlobSpec(NamedTuple):
    """One user glob: a function glob (optionally limited to modules) or a source-path glob."""

    text: str
    func: str | None = None
    module: str | None = None
    source: str | None = None


class DenyGroup(NamedTuple):
    """Built-in deny globs that share one reason; `modes` None means every attach mode."""

    reason: str
    globs: tuple[str, ...]
    modes: frozenset[str] | None = None


BUILTIN_DENY: tuple[DenyGroup, ...] = (
    # retsnoop's forced list: code that runs around every BPF program invocation, so a probe on it
    # re-enters the tracer (or, for the spin lock, can deadlock).
    DenyGroup("runs inside every BPF program invocation", (
        "bpf_get_smp_processor_id", "migrate_enable", "migrate_disable", "bpf_spin_lock", "bpf_spin_unlock",
        "__bpf_prog_enter*", "__bpf_prog_exit*", "__bpf_tramp_enter*", "__bpf_tramp_exit*",
        "update_prog_stats", "inc_misses_counter", "bpf_prog_start_time")),
    # retsnoop's forced list: called by the probe machinery itself and on every context switch.
    DenyGroup("RCU read side and preempt count, used by the probes themselves", (
        "rcu_read_lock*", "rcu_read_unlock*", "__rcu_read_lock*", "__rcu_read_unlock*",
        "preempt_count_add", "preempt_count_sub")),
    # retsnoop's forced list: idle threads would open a session on every idle entry of every CPU.
    DenyGroup("idle loop", ("arch_cpu_idle", "default_idle")),
    # The machinery that delivers kprobe/fentry/fprobe events and runs our programs: probing it recurses.
    DenyGroup("probe delivery machinery", (
        "kprobe_*", "kretprobe_*", "__kretprobe_*", "*ftrace*", "fprobe*", "rethook*", "trace_call_bpf",
        "__bpf_trace_run*", "bpf_trace_run*", "bpf_prog_run*")),
    # NMI, int3 and interrupt entry can interrupt a probe at any instruction.
    DenyGroup("NMI, int3 and interrupt entry", (
        "exc_nmi", "asm_exc_nmi", "default_do_nmi", "nmi_handle", "exc_int3", "asm_exc_int3", "do_int3*",
        "irqentry_*", "irq_enter*", "irq_exit*", "__irq_exit_rcu")),
    # Helpers (and what they call) used by bpf/retsnoop.bpf.c. A probe on one fires inside our own programs:
    # fentry re-enters them (9x the probe runs of the other modes, README "Attach modes"), and a kprobe or
    # fprobe hit the kernel then skips still costs its hook on every use (kprobe.multi measured 4x slower
    # per run with them in the set). Called from our programs, they could never be recorded anyway.
    DenyGroup("called by retsnoop-otel's own BPF programs (a probe there would fire inside them)", (
        "bpf_ktime_get_boot_ns", "ktime_get_boot_fast_ns", "bpf_get_current_pid_tgid", "bpf_get_current_comm",
        "bpf_get_current_task*", "bpf_get_current_cgroup_id", "bpf_get_current_ancestor_cgroup_id",
        "bpf_get_stack*", "bpf_get_stackid*", "__bpf_get_stack*", "get_perf_callchain*", "perf_callchain_kernel",
        "bpf_ringbuf_*", "ringbuf_*", "__bpf_ringbuf_*", "bpf_map_lookup_elem", "bpf_map_update_elem",
        "bpf_map_delete_elem", "*htab_*elem*",  # hash map lookup/update/delete and their element helpers
        "htab_lock_bucket", "htab_unlock_bucket", "pcpu_freelist_*", "__pcpu_freelist_*",
        "array_map_lookup_elem", "percpu_array_map_lookup_elem", "bpf_get_func_ip*", "bpf_get_attach_cookie*",
        "bpf_get_func_ret", "bpf_get_func_arg*", "bpf_probe_read_kernel*", "bpf_probe_read_user*",
        "copy_from_kernel_nofault*", "copy_from_user_nofault*", "bpf_get_prandom_u32", "bpf_user_rnd_u32",
        "bpf_session_is_return", "bpf_get_branch_snapshot",
        # the session map (an LRU hash): its free-list and eviction code
        "htab_lru_*", "bpf_lru_*", "__bpf_lru_*",
        # the kernel stack taken at the error: the unwinder, and its lookups of the BPF programs and
        # trampolines on the stack (bpf_ksym_find ran 4 times per failing call under fentry,
        # python -m bench.probe_cost --fentry-nested)
        "unwind_next_frame", "__unwind_start", "unwind_get_return_address*", "orc_find", "__orc_find",
        "get_stack_info", "in_task_stack", "in_irq_stack", "kernel_text_address", "__kernel_text_address",
        "core_kernel_text", "is_bpf_text_address", "bpf_ksym_find", "bpf_prog_ksym_find", "search_bpf_extables",
        "is_module_text_address", "__module_address", "__module_text_address",
        "__is_insn_slot_addr", "is_kprobe_*_slot")))

# Symbols that are not functions of their own: call padding and CFI preambles (kernel 6.2+).
_NOT_FUNCTIONS = ("__pfx_", "__cfi_")
_COLD = re.compile(r"\.cold(?:\.\d+)?$")
_MOD_GLOB = re.compile(r"^(\S+)\s+\[(\S+)\]$")


class Discovery:
    """What would be attached (ids 0..n-1, entry functions first) and what was left out, and why."""

    __slots__ = ("funcs", "skipped", "mode", "available_count", "user_mode", "probes")

    def __init__(self, funcs: list[TracedFunc], skipped: list[tuple[str, str]], mode: str,
                 available_count: int = 0, user_mode: str = "", probes: Sequence[ProbeInfo] = ()) -> None:
        self.funcs = funcs
        self.skipped = skipped
        self.mode = mode  # "" when no kernel function is traced
        self.available_count = available_count
        self.user_mode = user_mode  # how user-space functions attach (kernel/uprobes.py), "" without them
        # the injected probes (-J) resolved against this kernel (runtime/probe_set.py resolve), once per start
        self.probes = probes

    @property
    def entry_count(self) -> int:
        return sum(1 for f in self.funcs if f.is_entry)


# ---- glob parsing -------------------------------------------------------------------------------


MAX_GLOB_CHARS = 4096  # a source path's limit (PATH_MAX); a kernel symbol has at most 512 (KSYM_NAME_LEN)


def parse_glob(text: str) -> GlobSpec:
    glob = text.strip()
    if len(glob) > MAX_GLOB_CHARS:
        raise DiscoveryError(f"glob {shown(text)} is longer than any kernel symbol or source path could match "
                             f"({MAX_GLOB_CHARS} characters at most)")
    if glob.startswith(":"):
        path = glob[1:].lstrip("/")
        if not path:
            raise DiscoveryError(f"{shown(text)}: a source glob needs a path after ':' (for example ':kernel/bpf/*.c')")
        return GlobSpec(glob, source=path)
    if m := _MOD_GLOB.match(glob):
        return GlobSpec(glob, func=m.group(1), module=m.group(2))
    if not glob or any(c.isspace() for c in glob) or "[" in glob or "]" in glob:
        raise DiscoveryError(f"bad glob {shown(text)}: expected 'func_glob', 'func_glob [module_glob]', "
                             "':path/glob.c' or '@file'")
    return GlobSpec(glob, func=glob)


def expand_glob_args(values: Iterable[str], read: dict[str, list[str]] | None = None) -> list[str]:
    """Flags in order, with each '@file' replaced by its lines (blank lines and '#' comments skipped). The input
    layer calls this (trace/flags.py, agent/config_file.py): from there on globs are values, and nothing reads a
    glob file again. `read`: as for inputs.files.expand_at_files."""
    return expand_at_files(values, "@FILE glob file", MAX_GLOB_FILE_BYTES, DiscoveryError, read)


class _GlobSet:
    """Globs of one kind: plain ones matched by C-level scans over a blob of names (globs.lines_matching),
    module and source-path ones checked per function instance (they depend on where it lives)."""

    def __init__(self, specs: Sequence[GlobSpec], sources: dict[str, set[str]]) -> None:
        self.specs = list(specs)
        plain = [s.func for s in self.specs if s.func is not None and s.module is None]
        self._exact = {g for g in plain if "*" not in g and "?" not in g}.union(
            *(sources[s.source] for s in self.specs if s.source is not None))
        # module specs pre-filter on their function part; the module is checked per instance
        self._wild = [g for g in plain if "*" in g or "?" in g] + [s.func for s in self.specs if s.module and s.func]
        self._sources = sources
        self._per_instance = [i for i, s in enumerate(self.specs) if s.source is not None or s.module is not None]
        self._hits: dict[str, tuple[int, ...]] = {}

    def names_matching(self, names: Container[str], blob: str) -> set[str]:
        """Names that may match, found by scans of `blob` (globs.name_blob() of the same names)."""
        out = {n for n in self._exact if n in names}
        for glob in self._wild:
            out.update(lines_matching(glob, blob))
        return out

    @property
    def per_instance(self) -> bool:
        """Whether some spec depends on the module or source file of an instance, not only on its name."""
        return bool(self._per_instance)

    def plain(self, name: str) -> list[GlobSpec]:
        """The name-only specs matching `name` (after index_names() over a blob holding it)."""
        return [self.specs[i] for i in self._hits.get(name, ())]

    def index_names(self, names: Sequence[str], blob: str) -> None:
        """Which plain specs match each of `names` (one regex scan per spec), for matching() to look up."""
        hits: dict[str, list[int]] = {}
        present = set(names)
        for i, s in enumerate(self.specs):
            if s.func is None or s.module is not None:
                continue
            found = lines_matching(s.func, blob) if "*" in s.func or "?" in s.func else \
                [s.func] if s.func in present else []
            for name in found:
                hits.setdefault(name, []).append(i)
        self._hits = {name: tuple(idx) for name, idx in hits.items()}

    def matching(self, name: str, module: str | None) -> list[GlobSpec]:
        """The specs matching one function instance (module None: vmlinux), in spec order.

        Plain specs come from index_names() when it has run for `name`'s blob, else are matched here."""
        idx = set(self._hits.get(name, ()))
        if not self._hits:
            idx.update(i for i, s in enumerate(self.specs) if s.func is not None and s.module is None
                       and glob_to_regex(s.func).fullmatch(name) is not None)
        for i in self._per_instance:
            s = self.specs[i]
            if s.source is not None:
                hit = module is None and name in self._sources[s.source]
            else:
                hit = module is not None and glob_to_regex(s.module or "").fullmatch(module) is not None \
                    and glob_to_regex(s.func or "").fullmatch(name) is not None
            if hit:
                idx.add(i)
        return [self.specs[i] for i in sorted(idx)]


def _builtin_deny(mode: str, blob: str) -> dict[str, str]:
    """name -> reason of the first built-in deny group matching it (blob: globs.name_blob() of the names)."""
    out: dict[str, str] = {}
    for group in BUILTIN_DENY:
        if group.modes is None or mode in group.modes:
            for glob in group.globs:
                for name in lines_matching(glob, blob):
                    out.setdefault(name, group.reason)
    return out


# ---- discovery ----------------------------------------------------------------------------------


def discover(entry_globs: Sequence[str], allow_globs: Sequence[str], deny_globs: Sequence[str],
             kallsyms: Kallsyms, available: Traceable, ret_kind: Callable[[str], RetKind],
             mode: str, resolve_source_glob: Callable[[str], set[str]] | None = None,
             user_mode: str = "", pids: Sequence[int] = (), root: str = "/", user_lines: bool = True) -> Discovery:
    """Resolve the user's globs into the function table the BPF side is loaded with: kernel functions first,
    then user-space ones (`u:BINARY:GLOB`, attached in `user_mode`)."""
    if mode not in BY_NAME:
        raise DiscoveryError(f"unknown attach mode '{mode}' (expected one of {', '.join(NAMES)})")
    (user_e, entry), (user_a, allow), (user_d, deny) = (_split_user(g) for g in (entry_globs, allow_globs, deny_globs))
    if not entry and not user_e:
        raise DiscoveryError("at least one entry glob is needed (-e GLOB)")
    funcs: list[TracedFunc] = []
    skipped: list[tuple[str, str]] = []
    if entry or allow:
        funcs, skipped = _discover_kernel(entry, allow, deny, kallsyms, available, ret_kind, mode,
                                          resolve_source_glob, user_entries=bool(user_e))
    if user_e or user_a:
        from retsnoop_otel.symbols.user_funcs import UserFuncError, discover_user  # ELF reading: only when asked
        try:
            ufuncs, uskipped = discover_user(user_e, user_a, user_d, len(funcs), pids, root, user_lines)
        except UserFuncError as exc:
            raise DiscoveryError(str(exc)) from None
        funcs += ufuncs
        skipped = sorted(skipped + uskipped)
    kernel = bool(entry or allow)
    return Discovery(funcs=funcs, skipped=skipped, mode=mode if kernel else "",
                     available_count=len(available) if kernel else 0, user_mode=user_mode if user_e or user_a else "")


def user_and_kernel_globs(globs: Sequence[str]) -> tuple[list[str], list[str]]:
    """The user-function specs (u:BINARY:GLOB) and the kernel globs among these (globs as the input layer expanded
    them: no '@file' is read here)."""
    return _split_user(globs)


def is_user_spec(text: str) -> bool:
    """A user-space function spec (symbols/user_funcs.py), not a kernel glob."""
    return text.strip().startswith("u:")


def _split_user(globs: Sequence[str]) -> tuple[list[str], list[str]]:
    return [g for g in globs if is_user_spec(g)], [g for g in globs if not is_user_spec(g)]


def _discover_kernel(entry_globs: Sequence[str], allow_globs: Sequence[str], deny_globs: Sequence[str],
                     kallsyms: Kallsyms, available: Traceable, ret_kind: Callable[[str], RetKind], mode: str,
                     resolve_source_glob: Callable[[str], set[str]] | None,
                     user_entries: bool) -> tuple[list[TracedFunc], list[tuple[str, str]]]:
    entry_specs = [parse_glob(g) for g in entry_globs]
    allow_specs = [parse_glob(g) for g in allow_globs]
    deny_specs = [parse_glob(g) for g in deny_globs]
    sources: dict[str, set[str]] = {}
    for spec in (*entry_specs, *allow_specs, *deny_specs):
        if spec.source is not None and spec.source not in sources:
            if resolve_source_glob is None:
                raise DiscoveryError(f"'{spec.text}' is a source-path glob: it needs a vmlinux with DWARF debug "
                                     "info (give it with -k PATH, or install the kernel's -dbg package)")
            sources[spec.source] = set(resolve_source_glob(spec.source))

    entries = _GlobSet(entry_specs, sources)
    allows = _GlobSet(entry_specs + allow_specs, sources)
    denies = _GlobSet(deny_specs, sources)
    matched = allows.names_matching(kallsyms, kallsyms.names_blob())
    candidates = sorted(n for n in matched if not n.startswith(_NOT_FUNCTIONS))
    unnamed = available.not_in(kallsyms)  # traceable, yet not in kallsyms: a few at most
    missing = sorted(allows.names_matching(set(unnamed), name_blob(unnamed)))
    blob = name_blob(candidates)
    for globs in (entries, allows, denies):
        globs.index_names(candidates, blob)
    builtin = _builtin_deny(mode, blob)

    chosen: list[tuple[int, bool]] = []  # (kallsyms position, is entry)
    skipped: dict[str, str] = {}
    entry_hits: dict[GlobSpec, int] = {s: 0 for s in entry_specs if s.source is None}
    entry_skips: dict[GlobSpec, list[str]] = {s: [] for s in entry_hits}

    def skip(label: str, reason: str, entry_of: list[GlobSpec]) -> None:
        skipped.setdefault(label, reason)
        for spec in entry_of:
            if spec in entry_skips:
                entry_skips[spec].append(label)

    for name in missing:
        skip(name, "not in kallsyms", [s for s in entry_specs if s.source is None and _plain_match(s, name)])

    by_instance = entries.per_instance or allows.per_instance or denies.per_instance
    found = zip(candidates, kallsyms.positions_many(candidates), available.count_many(candidates), strict=True)
    for name, every, listed in found:
        if by_instance:
            matches = [(i, mod, entries.matching(name, mod)) for i, mod in ((i, kallsyms.module_at(i)) for i in every)]
            matches = [(i, mod, ent) for i, mod, ent in matches if ent or allows.matching(name, mod)]
            if not matches:
                continue
            denied = [denies.matching(name, mod) for _, mod, _ in matches]
        else:  # the same specs match every instance: decide once per name
            ent = entries.plain(name)
            matches = [(i, kallsyms.module_at(i), ent) for i in every]
            by = denies.plain(name)
            denied = [by] * len(matches)
        entry_of = sorted({s for _, _, ent in matches for s in ent}, key=lambda s: s.text)
        label = name if matches[0][1] is None else f"{name} [{matches[0][1]}]"
        kept = [m for m, by in zip(matches, denied, strict=True) if not by]
        reason = (f"denied by '{next(by for by in denied if by)[0].text}'" if not kept else
                  _reject_reason(name, [mod for _, mod, _ in kept], builtin.get(name), listed, len(every), mode))
        if reason:
            skip(label, reason, entry_of)
            continue
        chosen.extend((i, bool(ent)) for i, _, ent in kept)
        for spec in entry_of:
            if spec in entry_hits:
                entry_hits[spec] += 1

    for spec, hits in entry_hits.items():
        if not hits:
            raise DiscoveryError(_entry_miss_message(spec, entry_skips[spec], skipped))
    if not user_entries and not any(is_entry for _, is_entry in chosen):
        raise DiscoveryError("no entry function left to attach: the source-path entry globs "
                             f"({', '.join(s.text for s in entry_specs if s.source)}) matched no traceable function")

    syms = [(kallsyms.ksym_at(i), is_entry) for i, is_entry in chosen]
    syms.sort(key=lambda item: (not item[1], item[0].name, item[0].addr))
    funcs = [TracedFunc(id=i, name=sym.name, addr=sym.addr, ret=ret_kind(sym.name), is_entry=is_entry,
                        module=sym.module, size=sym.size) for i, (sym, is_entry) in enumerate(syms)]
    return funcs, sorted(skipped.items())


def _plain_match(spec: GlobSpec, name: str) -> bool:
    return spec.func is not None and spec.module is None and glob_to_regex(spec.func).fullmatch(name) is not None


def _reject_reason(name: str, modules: list[str | None], builtin: str | None, listed: int,
                   ksym_count: int, mode: str) -> str | None:
    """Why a matched (and not user-denied) function must not be attached, or None; `listed`: how often
    available_filter_functions lists it."""
    if builtin is not None:
        return f"built-in deny list: {builtin}"
    if _COLD.search(name):
        return "cold part of a split function (not a function entry)"
    if not listed:
        return NOT_AVAILABLE
    if ksym_count > 1 or listed != ksym_count:
        if mode in TRAMPOLINE:  # attached by name (BTF id): the kernel picks one instance
            return (f"{AMBIGUOUS} ({ksym_count} in kallsyms, {listed} in available_filter_functions;"
                    " use -K to attach each by address)")
    if mode in TRAMPOLINE and any(modules):
        return f"module function: {mode} mode attaches vmlinux functions only (use -K)"
    return None


def _entry_miss_message(spec: GlobSpec, labels: list[str], skipped: dict[str, str]) -> str:
    msg = f"Entry glob '{spec.text}' doesn't match any kernel function!"
    if labels:
        shown = "; ".join(f"{label}: {skipped[label]}" for label in labels[:3])
        more = f" (and {len(labels) - 3} more)" if len(labels) > 3 else ""
        return f"{msg} It matched only functions that cannot be attached: {shown}{more}."
    return f"{msg} Check the name against /proc/kallsyms (only '*' and '?' are wildcards)."


# ---- dry run ------------------------------------------------------------------------------------


USER_MODE_NAMES = {m.name: m.shown for m in USER_MODES}


def format_dry_run(discovery: Discovery, verbose: int = 0) -> str:
    """The --dry-run report: what would be attached, and why the rest was left out."""
    d = discovery
    kernel = [f for f in d.funcs if f.binary is None]
    user = [f for f in d.funcs if f.binary is not None]
    lines = []
    if d.mode:
        lines.append(f"{d.available_count} functions are available for tracing; would attach {len(kernel)} "
                     f"({sum(f.is_entry for f in kernel)} entry) in {d.mode} mode, skipped {len(d.skipped)}.")
    if user:
        lines.append(f"Would attach {len(user)} user-space functions ({sum(f.is_entry for f in user)} entry) with "
                     f"{USER_MODE_NAMES.get(d.user_mode, d.user_mode)}"
                     + ("." if d.mode else f", skipped {len(d.skipped)}."))
    for title, group in (("Entry functions:", [f for f in d.funcs if f.is_entry]),
                         ("Other functions:", [f for f in d.funcs if not f.is_entry])):
        if group:
            lines.append(title)
            width = max(len(_label(f)) for f in group)
            lines.extend(f"    {_label(f):<{width}}  {_returns(f)}" for f in group)
    if d.skipped:
        lines.append("Skipped functions:")
        if verbose:
            width = max(len(name) for name, _ in d.skipped)
            lines.extend(f"    {name:<{width}}  {reason}" for name, reason in d.skipped)
        else:
            by_reason: dict[str, list[str]] = {}
            for name, reason in d.skipped:
                by_reason.setdefault(reason, []).append(name)
            for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                more = f", ... ({len(names) - 5} more)" if len(names) > 5 else ""
                lines.append(f"    {len(names):5d}  {reason}: {', '.join(names[:5])}{more}")
            lines.append("    (-v lists every skipped function)")
    return "\n".join(lines)


def _label(f: TracedFunc) -> str:
    if f.binary is not None:
        return f"{f.name} [u:{f.binary}]"
    return f.name if f.module is None else f"{f.name} [{f.module}]"


def _returns(f: TracedFunc) -> str:
    if f.binary is None:
        return f"returns {f.ret.value}"
    from retsnoop_otel.symbols.user_funcs import RULES
    rule = next(name for name, kind in RULES.items() if kind is f.ret)
    return f"errors: {rule}" + (f"  ({f.source})" if f.source else "")

"""User-space functions in -e/-a/-d: `u:BINARY:GLOB[=RULE]` -> TracedFuncs that uprobes attach to.

BINARY is a path (it has a '/'), or a name found the way the process would find it: in the mappings of the
processes given with -p (a library already loaded there, opened through /proc/PID/root so containers work),
else as a command on PATH, else in ld.so's search path (/etc/ld.so.conf and the default directories).
GLOB uses retsnoop's wildcards over the ELF's function symbols (.symtab, else .dynsym). RULE says which return
values are errors, as nothing like BTF says a user function's type: errno (-4095..-1, the default, as the
kernel's), neg, zero, null, ptr (NULL or an ERR_PTR), none.
"""

from __future__ import annotations

import glob as _glob
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.symbols.globs import glob_to_regex
from retsnoop_otel.symbols.user_symbols import elf_functions

PREFIX = "u:"
RULES: dict[str, RetKind] = {"errno": RetKind.INT32, "neg": RetKind.NEG, "zero": RetKind.ZERO,
                             "null": RetKind.NULL, "ptr": RetKind.POINTER, "none": RetKind.UNSIGNED}
DEFAULT_RULE = "errno"
MAX_USER_FUNCS = 4096  # uprobes are per function and per binary: a glob that matches more is a mistake
_LIB_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib")


class UserFuncError(Exception):
    """A user-function spec, or a binary, the user has to change."""


class UserSpec(NamedTuple):
    text: str
    binary: str
    glob: str
    rule: str | None


def parse_user_spec(text: str) -> UserSpec:
    body = text.strip()[len(PREFIX):]
    binary, sep, glob = body.rpartition(":")
    rule = None
    if "=" in glob:
        glob, rule = glob.split("=", 1)
        if rule not in RULES:
            raise UserFuncError(f"'{text}': unknown error rule '{rule}' (expected one of {', '.join(RULES)})")
    if not sep or not binary or not glob or any(c.isspace() for c in glob):
        raise UserFuncError(f"bad user-function glob '{text}': expected 'u:BINARY:GLOB[=RULE]', "
                            "for example 'u:/usr/bin/app:handle_*' or 'u:libc.so.6:open*=neg'")
    return UserSpec(text.strip(), binary, glob, rule)


def _ld_so_dirs(root: str) -> list[str]:
    """ld.so's search directories: /etc/ld.so.conf with its includes, then the default ones."""
    out: list[str] = []

    def read(path: str, depth: int = 0) -> None:
        try:
            with open(os.path.join(root, path.lstrip("/"))) as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if line.startswith("include ") and depth < 4:
                pattern = line.split(None, 1)[1]
                if not pattern.startswith("/"):
                    pattern = os.path.join(os.path.dirname(path), pattern)
                for inc in sorted(_glob.glob(os.path.join(root, pattern.lstrip("/")))):
                    read("/" + os.path.relpath(inc, root), depth + 1)
            elif line.startswith("/"):
                out.append(line)

    read("/etc/ld.so.conf")
    return out + [d for d in _LIB_DIRS if d not in out]


def _is_name_of(name: str, base: str) -> bool:
    """`libc.so.6`, `libc.so` and `libc` all name libc.so.6."""
    return base == name or base.startswith(name + ".so") or base.startswith(name + "-") and ".so" in base


def resolve_binary(name: str, pids: Sequence[int] = (), root: str = "/") -> str:
    """The ELF file a spec's BINARY means, as a path this process can open."""
    if "/" in name:
        path = os.path.abspath(name) if not name.startswith("/") else os.path.join(root, name.lstrip("/"))
        if not os.path.isfile(path):
            raise UserFuncError(f"'{name}': no such file (give the path of an executable or shared library)")
        return os.path.realpath(path)
    for pid in pids:
        try:
            with open(os.path.join(root, f"proc/{pid}/maps")) as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/") and "x" in parts[1] \
                            and _is_name_of(name, os.path.basename(parts[5].strip())):
                        return os.path.join(root, f"proc/{pid}/root", parts[5].strip().lstrip("/"))
        except OSError:
            continue
    if not name.startswith("lib") and ".so" not in name:
        found = shutil.which(name)
        if found:
            return os.path.realpath(found)
    for d in _ld_so_dirs(root):
        try:
            entries = sorted(os.listdir(os.path.join(root, d.lstrip("/"))))
        except OSError:
            continue
        for base in entries:
            if _is_name_of(name, base):
                path = os.path.join(root, d.lstrip("/"), base)
                if os.path.isfile(path):
                    return os.path.realpath(path)
    where = f"the maps of process {', '.join(map(str, pids))}, " if pids else ""
    raise UserFuncError(f"'{name}': not found in {where}PATH or ld.so's search path: give the binary's path "
                        "(for example u:/usr/lib/x86_64-linux-gnu/libc.so.6:GLOB)")


class ElfFuncs(NamedTuple):
    """One binary's functions: (vaddr, size, name), and its loadable segments to turn vaddrs into file offsets."""

    funcs: list[tuple[int, int, str]]
    segments: list[tuple[int, int, int]]  # (vaddr, memsz, file offset)

    def file_offset(self, vaddr: int) -> int | None:
        for start, size, off in self.segments:
            if start <= vaddr < start + size:
                return vaddr - start + off
        return None


def read_elf_funcs(path: str) -> ElfFuncs:
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            sec = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
            funcs = elf_functions(elf, sec, aliases=True) if sec is not None else []
            if sec is not None and sec.name == ".symtab" and (dyn := elf.get_section_by_name(".dynsym")):
                known = {(v, n) for v, _s, n in funcs}
                funcs += [row for row in elf_functions(elf, dyn, aliases=True) if (row[0], row[2]) not in known]
            segs = [(s["p_vaddr"], s["p_memsz"], s["p_offset"]) for s in elf.iter_segments()
                    if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1]
    except (OSError, ELFError) as exc:
        raise UserFuncError(f"'{path}': cannot read it as an ELF file ({exc})") from None
    return ElfFuncs(sorted(funcs), segs)


def in_binary(funcs: Sequence[TracedFunc], binary: str) -> list[TracedFunc]:
    """Functions named in a table built by hand (tests, benches) as the functions of `binary` uprobes attach to."""
    elf = read_elf_funcs(binary)
    by_name = {name: v for v, _size, name in elf.funcs}
    out = []
    for f in funcs:
        if f.name not in by_name:
            raise UserFuncError(f"{binary} has no function {f.name}")
        out.append(f._replace(binary=binary, addr=by_name[f.name], offset=elf.file_offset(by_name[f.name]) or 0))
    return out


def source_lines(path: str, vaddrs: Sequence[int]) -> dict[int, str]:
    """file:line where each function is declared (DWARF's decl line, else its first line), from the binary's DWARF
    or its debug link: one llvm-symbolizer run for all of a binary's functions."""
    tool = shutil.which("llvm-symbolizer") or next(iter(sorted(_glob.glob("/usr/bin/llvm-symbolizer-*"))), None)
    if not vaddrs or tool is None:
        return {}
    try:
        out = subprocess.run([tool, f"--obj={path}", "--output-style=JSON", "--no-inlines",
                              *(f"0x{v:x}" for v in vaddrs)], capture_output=True, text=True, timeout=120).stdout
        answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    found = {}
    rows = [a for batch in answers for a in (batch if isinstance(batch, list) else [batch])]
    for vaddr, answer in zip(vaddrs, rows, strict=False):
        sym = (answer.get("Symbol") or [{}])[0]
        file = sym.get("StartFileName") or sym.get("FileName") or ""
        line = sym.get("StartLine") or sym.get("Line") or 0
        if file and line:
            found[vaddr] = f"{file}:{line}"
    return found


def discover_user(entry: Iterable[str], allow: Iterable[str], deny: Iterable[str], first_id: int,
                  pids: Sequence[int] = (), root: str = "/",
                  lines: bool = True) -> tuple[list[TracedFunc], list[tuple[str, str]]]:
    """The user functions the specs name, with ids from `first_id` on, and those left out with why."""
    specs = [(parse_user_spec(t), True) for t in entry] + [(parse_user_spec(t), False) for t in allow]
    denies = [parse_user_spec(t) for t in deny]
    paths: dict[str, str] = {}
    elfs: dict[str, ElfFuncs] = {}

    def elf_of(spec: UserSpec) -> tuple[str, ElfFuncs]:
        path = paths.get(spec.binary) or paths.setdefault(spec.binary, resolve_binary(spec.binary, pids, root))
        if path not in elfs:
            elfs[path] = read_elf_funcs(path)
        return path, elfs[path]

    chosen: dict[tuple[str, int], list] = {}  # (path, vaddr) -> [name, size, is_entry, rule]
    skipped: list[tuple[str, str]] = []
    for spec, is_entry in specs:
        path, elf = elf_of(spec)
        pattern = glob_to_regex(spec.glob)
        hits = [(v, size, name) for v, size, name in elf.funcs if pattern.fullmatch(name)]
        if not hits and is_entry:
            raise UserFuncError(f"Entry glob '{spec.text}' doesn't match any function of {path} "
                                "(check the name with `nm -D` or `nm`; only '*' and '?' are wildcards)")
        for v, size, name in hits:
            row = chosen.setdefault((path, v), [name, size, False, None])
            row[2] = row[2] or is_entry
            row[3] = row[3] or spec.rule
    for spec in denies:
        path, _elf = elf_of(spec)
        pattern = glob_to_regex(spec.glob)
        for key in [k for k, row in chosen.items() if k[0] == path and pattern.fullmatch(row[0])]:
            skipped.append((f"{chosen.pop(key)[0]} [{os.path.basename(path)}]", f"denied by '{spec.text}'"))
    if specs and not any(row[2] for row in chosen.values()) and any(e for _s, e in specs):
        raise UserFuncError("every user entry function was denied: " + ", ".join(s.text for s, e in specs if e))
    if len(chosen) > MAX_USER_FUNCS:
        raise UserFuncError(f"the user-function globs match {len(chosen)} functions, more than {MAX_USER_FUNCS}: "
                            "narrow them")
    funcs: list[TracedFunc] = []
    by_path: dict[str, list[int]] = {}
    for (path, v) in chosen:
        by_path.setdefault(path, []).append(v)
    where = {path: source_lines(path, sorted(vs)) if lines else {} for path, vs in by_path.items()}
    order = sorted(chosen.items(), key=lambda kv: (not kv[1][2], kv[1][0], kv[0]))
    for (path, v), (name, size, is_entry, rule) in order:
        offset = elfs[path].file_offset(v)
        if offset is None:
            skipped.append((f"{name} [{os.path.basename(path)}]", "not in an executable segment"))
            continue
        funcs.append(TracedFunc(id=first_id + len(funcs), name=name, addr=v, ret=RULES[rule or DEFAULT_RULE],
                                is_entry=is_entry, size=size, binary=path, offset=offset,
                                source=where[path].get(v)))
    return funcs, skipped

"""User-space functions in -e/-a/-d: `u:BINARY:GLOB[=RULE]` -> TracedFuncs that uprobes attach to.

BINARY is a path (it has a '/'), or a name found the way the process would find it: in the mappings of the
processes given with -p (a library already loaded there, opened through /proc/PID/root so containers work),
else as a command on PATH, else as ld.so finds a library (its cache, /etc/ld.so.cache, then its search path:
/etc/ld.so.conf and the default directories), `libc` and `libc.so` meaning the SONAME'd libc.so.6, never the
linker script libc.so. GLOB uses retsnoop's wildcards over every name of the ELF's functions (.symtab and
.dynsym: weak aliases such as glibc's getpid of __getpid, versioned names such as realpath@@GLIBC_2.3); a
function is its address, attached once whichever names match. RULE says which return values are errors, as
nothing like BTF says a user function's type: errno (-4095..-1, the default, as the kernel's), neg, zero,
null, ptr (NULL or an ERR_PTR), none.
"""

import errno
import functools
import glob as _glob
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from retsnoop_otel.capture.model import RetKind, TracedFunc
from retsnoop_otel.symbols.globs import glob_to_regex
from retsnoop_otel.symbols.user_symbols import function_symbols

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


_CACHE_MAGIC = b"glibc-ld.so.cache1.1"  # the format glibc 2.32+ writes (older ones put it after the libc5 table)
_SOLIB = re.compile(r"(?P<stem>.+?)(?:\.so(?P<ver>(?:\.\d+)*)|-[\d.]+\.so)")  # libc.so.6, libc-2.31.so


def _ld_cache(root: str) -> list[tuple[str, str, int]]:
    """(library name, path, hwcap) of each entry of ld.so's cache, /etc/ld.so.cache, in its order; [] when
    there is none or it is unreadable (a container that never ran ldconfig)."""
    try:
        with open(os.path.join(root, "etc/ld.so.cache"), "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return []
    base = data.find(_CACHE_MAGIC)
    if base < 0 or len(data) < base + 48:
        return []
    order = {2: "<", 3: ">"}.get(data[base + 28], "=")
    nlibs, = struct.unpack_from(order + "I", data, base + 20)

    def string(off: int) -> str:
        at = base + off
        return data[at:data.find(b"\0", at)].decode(errors="replace") if 0 <= at < len(data) else ""

    out = []
    for i in range(min(nlibs, (len(data) - base - 48) // 24)):
        _flags, key, value, _os, hwcap = struct.unpack_from(order + "iIIIQ", data, base + 48 + 24 * i)
        out.append((string(key), string(value), hwcap))
    return out


def _elf_arch(path: str) -> tuple[int, int, int] | None:
    """(class, byte order, machine) of an ELF file; None for anything else (a linker script, a directory)."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return head[4], head[5], int.from_bytes(head[18:20], "big" if head[5] == 2 else "little")


@functools.lru_cache(maxsize=1)
def host_arch() -> tuple[int, int, int] | None:
    """This machine's ELF architecture: the one of the interpreter running us, as ld.so matches libraries."""
    return _elf_arch("/proc/self/exe") or _elf_arch(os.path.realpath(sys.executable))


def _library_version(name: str, base: str) -> tuple[int, ...] | None:
    """How `base` (a file's or a cache entry's name) fits the library `name`: its version (libc.so.6 -> (6,),
    libfoo.so -> ()) when `name` is a bare name (`libc`) or a linker name (`libc.so`), else () when the names are
    equal, else None."""
    if base == name:
        return ()
    if ".so." in name or not (m := _SOLIB.fullmatch(base)):
        return None
    stem = name[:-3] if name.endswith(".so") else name
    if m.group("stem") != stem or m.group("ver") is None:
        return None
    return tuple(int(x) for x in m.group("ver").split(".")[1:])


def _is_name_of(name: str, base: str) -> bool:
    """`libc.so.6`, `libc.so` and `libc` all name the mapped libc.so.6 (or an older glibc's libc-2.31.so)."""
    if _library_version(name, base) is not None:
        return True
    m = _SOLIB.fullmatch(base)
    return ".so." not in name and m is not None and m.group("ver") is None \
        and m.group("stem") == (name[:-3] if name.endswith(".so") else name)


def find_library(name: str, root: str = "/", arch: tuple[int, int, int] | None = None) -> tuple[str | None, str]:
    """The shared library a bare name means, as ld.so would load it: (path, "") or (None, what was passed over).

    `libc.so.6` (a SONAME) is that file. `libc` and `libc.so` mean the SONAME'd `libc.so.N`, the highest N,
    as `-lc` links against it: `libc.so` itself is what the linker reads, on Debian a text file (a GNU ld
    script), and is taken only when no versioned file exists and it is an ELF file. Looked up in ld.so's cache
    (/etc/ld.so.cache), then in its search directories (/etc/ld.so.conf and its includes, then the default
    ones), all under `root`; a file that is not an ELF file of `arch` (the machine's, by default: the i386
    libc.so.6 in /lib32 is not this x86-64 machine's) is passed over."""
    arch = arch if arch is not None else host_arch()
    skipped: list[str] = []

    def usable(path: str) -> bool:
        got = _elf_arch(path)
        if got is None and os.path.isfile(path):
            skipped.append(path)
        return got is not None and (arch is None or got == arch)

    def best(found: Iterable[tuple[str, str, int]]) -> str | None:
        """The highest version among (name, path, hwcap): versioned before unversioned, baseline before hwcaps."""
        ranked = []
        for base, path, hwcap in found:
            ver = _library_version(name, base)
            if ver is not None:
                ranked.append((not ver, tuple(-v for v in ver), hwcap != 0, path))
        for *_key, path in sorted(ranked):
            if usable(path):
                return path
        return None

    cached = best((key, os.path.join(root, value.lstrip("/")), hwcap) for key, value, hwcap in _ld_cache(root)
                  if value.startswith("/"))
    if cached:
        return os.path.realpath(cached), ""
    for d in _ld_so_dirs(root):
        where = os.path.join(root, d.lstrip("/"))
        try:
            entries = os.listdir(where)
        except OSError:
            continue
        if found := best((base, os.path.join(where, base), 0) for base in entries):
            return os.path.realpath(found), ""
    seen = list(dict.fromkeys(os.path.realpath(p) for p in skipped))
    return None, (f" (passed over {', '.join(seen)}: not an ELF file)" if seen else "")


def _not_a_binary(path: str) -> str | None:
    """Why `path` is no file to read an ELF from ('is a directory', ...), or None when it is a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        reasons = {errno.ENOENT: "no such file", errno.ELOOP: "too many levels of symbolic links",
                   errno.ENOTDIR: "a part of the path is not a directory", errno.EACCES: "permission denied",
                   errno.ENAMETOOLONG: "file name too long"}
        return reasons.get(exc.errno or 0, (exc.strerror or str(exc)).lower())
    except ValueError:
        return "not a file name (it holds a NUL character)"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if not stat.S_ISREG(mode):
        kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                 (stat.S_ISSOCK, "a socket"))
        return "not a regular file (" + next((what for test, what in kinds if test(mode)), "of another kind") + ")"
    return None


def resolve_binary(name: str, pids: Sequence[int] = (), root: str = "/",
                   arch: tuple[int, int, int] | None = None) -> str:
    """The ELF file a spec's BINARY means, as a path this process can open."""
    if "/" in name:
        path = os.path.abspath(name) if not name.startswith("/") else os.path.join(root, name.lstrip("/"))
        why = _not_a_binary(path)
        if why:
            raise UserFuncError(f"'{name}': {why} (give the path of an executable or shared library)")
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
    path, passed = find_library(name, root, arch)
    if path:
        return path
    where = f"the maps of process {', '.join(map(str, pids))}, " if pids else ""
    raise UserFuncError(f"'{name}': not found in {where}PATH or ld.so's search path{passed}: give the binary's path "
                        "(for example u:/usr/lib/x86_64-linux-gnu/libc.so.6:GLOB)")


class ElfFuncs(NamedTuple):
    """One binary's functions and its loadable segments, to turn vaddrs into file offsets.

    `funcs` has a row (vaddr, size, name) for every name of every function, by address, and an address's names
    in the order a name is chosen to report it by (_name_rank); `names` maps each address to its names in that
    order."""

    funcs: list[tuple[int, int, str]]
    segments: list[tuple[int, int, int]]  # (vaddr, memsz, file offset)
    names: dict[int, list[str]]

    def file_offset(self, vaddr: int) -> int | None:
        for start, size, off in self.segments:
            if start <= vaddr < start + size:
                return vaddr - start + off
        return None


def _dynsym_versions(elf: ELFFile) -> tuple[bytes, str, dict[int, str]]:
    """.gnu.version (one 16-bit index per .dynsym symbol, bit 15 set for a hidden, non-default version), its
    byte order, and the names of the versions the file defines (.gnu.version_d) by index."""
    # by name: iter_sections() would build every section again, hash tables included (a second for libLLVM)
    versym = elf.get_section_by_name(".gnu.version")
    verdef = elf.get_section_by_name(".gnu.version_d")
    versym = versym if versym is not None and versym["sh_type"] == "SHT_GNU_versym" else None
    verdef = verdef if verdef is not None and verdef["sh_type"] == "SHT_GNU_verdef" else None
    names: dict[int, str] = {}
    if verdef is not None:
        for vd, aux in verdef.iter_versions():
            first = next(iter(aux), None)
            if first is not None and not vd["vd_flags"] & 1:  # VER_FLG_BASE: the file's own name, no version
                names[vd["vd_ndx"]] = first.name
    return (versym.data() if versym is not None else b""), ("<" if elf.little_endian else ">"), names


def _symbol_names(raw: str, version: str | None, hidden: bool) -> list[str]:
    """The names a function symbol answers to: `realpath@@GLIBC_2.3` (the default version, the one a program
    linked now binds to) is also `realpath`; `realpath@GLIBC_2.2.5` (a hidden version, kept for programs linked
    against older glibc) only by its versioned name, so that `realpath` means what ld.so would bind."""
    if version is None and "@" in raw:  # .symtab spells the version in the name
        base, _at, version = raw.partition("@")
        hidden = not version.startswith("@")
        version = version.lstrip("@")
    else:
        base = raw
    if not version:
        return [base]
    return [f"{base}@{version}"] if hidden else [base, f"{base}@@{version}"]


_BINDING_RANK = {1: 0, 2: 1}  # STB_GLOBAL, STB_WEAK; STB_LOCAL and the rest: 2


def _name_rank(name: str, bind: int) -> tuple[int, int, int, str]:
    """Which of an address's names reports it, when a glob matches several: the one with the fewest leading
    underscores (getpid before __getpid), then global before weak before local (`bind`, _BINDING_RANK's), then
    the shortest (realpath before realpath@@GLIBC_2.3), then the alphabetically first."""
    return len(name) - len(name.lstrip("_")), bind, len(name), name


def read_elf_funcs(path: str) -> ElfFuncs:
    """Every name of every function of the ELF file: .symtab (local functions too) and .dynsym with the
    versions of its symbols, so that `getpid` (a weak alias of glibc's __getpid, at the same address),
    `__getpid` and `getpid@@GLIBC_2.2.5` are all names of one function."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                f.seek(0)
                head = f.read(256)
                script = b"GNU ld script" in head or b"GROUP" in head or b"INPUT" in head
                raise UserFuncError(f"'{path}': not an ELF file" + (" (a linker script: give the library it names, "
                                    "for example libc.so.6 for libc.so)" if script else ""))
            f.seek(0)
            elf = ELFFile(f)
            best: dict[tuple[int, str], tuple[int, int]] = {}  # (vaddr, name) -> (binding rank, size)
            for sec in (elf.get_section_by_name(".symtab"), elf.get_section_by_name(".dynsym")):
                if sec is None:
                    continue
                versym, order, versions = _dynsym_versions(elf) if sec.name == ".dynsym" else (b"", "<", {})
                for i, vaddr, size, binding, raw in function_symbols(elf, sec):
                    version, hidden = None, False  # None: a .symtab name spells its own version, if any
                    if 2 * i + 2 <= len(versym):
                        ndx = struct.unpack_from(order + "H", versym, 2 * i)[0]
                        version, hidden = versions.get(ndx & 0x7FFF, ""), bool(ndx & 0x8000)  # 0, 1: unversioned
                    bind = _BINDING_RANK.get(binding, 2)
                    for name in _symbol_names(raw, version, hidden):
                        if (got := best.get((vaddr, name))) is None or bind < got[0]:
                            best[vaddr, name] = (bind, size)
            segs = [(s["p_vaddr"], s["p_memsz"], s["p_offset"]) for s in elf.iter_segments()
                    if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1]
    except (OSError, ELFError) as exc:
        raise UserFuncError(f"'{path}': cannot read it as an ELF file ({exc})") from None
    rows = sorted((vaddr, _name_rank(name, bind), size, name) for (vaddr, name), (bind, size) in best.items())
    names: dict[int, list[str]] = {}
    for vaddr, _rank, _size, name in rows:
        names.setdefault(vaddr, []).append(name)
    return ElfFuncs([(vaddr, size, name) for vaddr, _rank, size, name in rows], segs, names)


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
        hits = [(v, size, name) for v, size, name in elf.funcs if pattern.fullmatch(name)]  # an address's best first
        if not hits and is_entry:
            raise UserFuncError(f"Entry glob '{spec.text}' doesn't match any function of {path} "
                                "(check the name with `nm -D` or `nm`; only '*' and '?' are wildcards)")
        for v, size, name in hits:
            row = chosen.setdefault((path, v), [name, size, False, None])
            row[2] = row[2] or is_entry
            row[3] = row[3] or spec.rule
    for spec in denies:
        path, elf = elf_of(spec)
        pattern = glob_to_regex(spec.glob)
        for key in [k for k in chosen if k[0] == path and any(pattern.fullmatch(n) for n in elf.names[k[1]])]:
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

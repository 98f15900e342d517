"""Injected probes (-J, retsnoop's --inject-probe): the spec language, tracepoint format files and the decoding
of what a probe recorded, as plain data and pure functions (kernel/inject_attach.py attaches them).

Specs, as retsnoop writes them: `kprobe:FUNC[+OFF]`, `kretprobe:FUNC`, `rawtp:NAME`, `tp:CATEGORY:NAME`, and
`@FILE` for one spec per line (`#` comments). A tracepoint's fields are named by its tracefs format file
(events/CATEGORY/NAME/format), which says each field's offset, size and sign in the raw entry the probe copies.
"""

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from retsnoop_otel.inputs.files import read_text, shown

KINDS = ("kprobe", "kretprobe", "rawtp", "tp")
MAX_PROBES = 64  # probe ids are u16 in the record; a handful is what anyone injects
MAX_INJECT_DATA = 256  # bytes of payload a record carries (bpf/retsnoop.h)
MAX_SPEC_FILE_BYTES = 1 << 20
# kprobe:FUNC+OFF: the kernel takes an unsigned long and refuses an offset past the function; no kernel function
# is near 1 MiB long, and a larger number (20 digits did) is a typo that would wrap in the attach call's size_t
MAX_KPROBE_OFFSET = (1 << 20) - 1
SPEC_FORMS = "kprobe:FUNC[+OFF], kretprobe:FUNC, rawtp:NAME or tp:CATEGORY:NAME (or @FILE, one spec per line)"
_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_SPEC = {
    "kprobe": re.compile(rf"({_NAME})(?:\+(0x[0-9a-fA-F]+|[0-9]+))?"),
    "kretprobe": re.compile(rf"({_NAME})"),
    "rawtp": re.compile(rf"({_NAME})"),
    "tp": re.compile(rf"({_NAME}):({_NAME})"),
}


class InjectError(ValueError):
    """A spec that cannot work: one sentence naming the problem and the fix."""


class InjectSpec(NamedTuple):
    kind: str  # one of KINDS
    name: str  # the function (kprobe, kretprobe) or tracepoint
    category: str = ""  # tp only
    offset: int = 0  # kprobe only: bytes into the function

    @property
    def text(self) -> str:
        """As retsnoop writes it (what outputs name the probe by)."""
        if self.kind == "tp":
            return f"tp:{self.category}:{self.name}"
        if self.kind == "kprobe" and self.offset:
            return f"kprobe:{self.name}+0x{self.offset:x}"
        return f"{self.kind}:{self.name}"


def parse_spec(text: str) -> InjectSpec:
    """One spec; InjectError naming what is wrong with it."""
    kind, sep, rest = text.strip().partition(":")
    if not sep or kind not in KINDS:
        raise InjectError(f"-J {shown(text)}: unknown probe kind {shown(kind, 40)}; write {SPEC_FORMS}")
    m = _SPEC[kind].fullmatch(rest)
    if m is None:
        form = {"kprobe": "kprobe:FUNC[+OFF] (OFF in decimal or 0x hex)", "kretprobe": "kretprobe:FUNC",
                "rawtp": "rawtp:NAME", "tp": "tp:CATEGORY:NAME"}[kind]
        raise InjectError(f"-J {shown(text)}: not a {kind} probe; write {form}")
    if kind == "tp":
        return InjectSpec(kind, m.group(2), category=m.group(1))
    digits = m.group(2) if kind == "kprobe" and m.group(2) else "0"
    offset = int(digits, 0) if len(digits) <= 10 else MAX_KPROBE_OFFSET + 1  # not int(): 5000 digits raise
    if offset > MAX_KPROBE_OFFSET:
        raise InjectError(f"-J {shown(text)}: offset {shown(digits, 24)} is past any kernel function; give bytes "
                          f"into the function, at most 0x{MAX_KPROBE_OFFSET:x}")
    return InjectSpec(kind, m.group(1), offset=offset)


def read_spec_file(path: str) -> str:
    """The text of a -J @FILE (at most MAX_SPEC_FILE_BYTES, UTF-8): a regular file, refused by kind otherwise
    before anything could block (a FIFO) or read without end (/dev/zero), by inputs/files.py."""
    return read_text(path, "spec file", MAX_SPEC_FILE_BYTES, lambda msg: InjectError(f"-J @{msg}"))


def parse_specs(values: Iterable[str], read: Callable[[str], str] = read_spec_file) -> tuple[InjectSpec, ...]:
    """The -J values in order, each @FILE replaced by its specs (blank lines and # comments skipped), each file read
    once; the same probe given twice is attached once."""
    out: list[InjectSpec] = []
    texts: dict[str, str] = {}
    for value in values:
        lines = [value]
        if value.startswith("@"):
            if value not in texts:
                texts[value] = read(value[1:])
            lines = [s for s in (ln.split("#", 1)[0].strip() for ln in texts[value].splitlines()) if s]
        for line in lines:
            spec = parse_spec(line)
            if spec not in out:
                out.append(spec)
    if len(out) > MAX_PROBES:
        raise InjectError(f"-J: {len(out)} injected probes, at most {MAX_PROBES}; inject fewer")
    return tuple(out)


# ---- tracepoint format files -------------------------------------------------------------

class TpField(NamedTuple):
    name: str
    ctype: str  # the C declaration's type, array suffix dropped ("unsigned long", "char", "__data_loc char")
    offset: int
    size: int
    signed: bool
    array: bool = False  # a fixed array (char comm[16]) or a __data_loc dynamic one

    @property
    def is_address(self) -> bool:
        return "*" in self.ctype


class TpFormat(NamedTuple):
    category: str
    name: str
    fields: tuple[TpField, ...]  # the event's own fields, common_* left out

    @property
    def size(self) -> int:
        """Bytes of the raw entry the probe copies (capped at MAX_INJECT_DATA): up to the end of its last fixed
        field, or all it may copy when a dynamic (__data_loc) field lies after the fixed ones."""
        if any(f.ctype.startswith("__data_loc") for f in self.fields):
            return MAX_INJECT_DATA
        return max((f.offset + f.size for f in self.fields), default=8)


_FIELD = re.compile(r"^\s*field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);"
                    r"(?:\s*signed:(?P<signed>-?\d+);)?", re.M)
_DECL = re.compile(r"^(?P<type>.*?)(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<arr>\[[^\]]*\])?$")


def parse_format(text: str, category: str = "", name: str = "") -> TpFormat:
    """The fields of a tracefs format file; InjectError when it holds none (not a format file)."""
    fields = []
    for m in _FIELD.finditer(text):
        d = _DECL.match(m.group("decl").strip())
        if d is None:
            continue
        fname = d.group("name")
        if fname.startswith("common_"):
            continue
        ctype = d.group("type").strip()
        fields.append(TpField(fname, ctype, int(m.group("off")), int(m.group("size")),
                              m.group("signed") == "1", bool(d.group("arr")) or ctype.startswith("__data_loc")))
    if "field:" not in text:
        raise InjectError(f"tp:{category}:{name}: its tracefs format file lists no fields")
    return TpFormat(category, name, tuple(fields))


def read_format(tracefs: str | Path, category: str, name: str) -> TpFormat:
    """events/CATEGORY/NAME/format under the tracefs root `tracefs`; InjectError naming the fix if missing."""
    path = Path(tracefs, "events", category, name, "format")
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        hint = "no such category" if not path.parent.parent.is_dir() else "no such event in that category"
        raise InjectError(f"-J tp:{category}:{name}: no tracepoint {category}:{name} ({hint}: {path} is missing); "
                          f"pick one from {Path(tracefs, 'available_events')}") from None
    except OSError as exc:
        raise InjectError(f"-J tp:{category}:{name}: cannot read {path} ({exc.strerror or exc}); run as root "
                          "with tracefs mounted") from None
    return parse_format(text, category, name)


# ---- decoding --------------------------------------------------------------------------------

class ProbeField(NamedTuple):
    name: str
    value: int | str
    address: bool = False  # a kernel address: kept out of exported data unless addresses are exported


class ProbeInfo(NamedTuple):
    """One attached probe as the decoder needs it: its id is the record's probe_id."""

    id: int
    spec: InjectSpec
    fmt: TpFormat | None = None  # tp: its fields
    nargs: int = 0  # rawtp: its arguments (each a u64)
    arg_addresses: tuple[bool, ...] = ()  # rawtp: which arguments are pointers
    ret_int32: bool = True  # kretprobe: the function returns a 32-bit int (or its type is unknown, read as one):
    # the upper half of the register is not part of the value

    @property
    def payload_size(self) -> int:
        if self.fmt is not None:
            return min(self.fmt.size, MAX_INJECT_DATA)
        return min(8 * self.nargs, MAX_INJECT_DATA)


class ProbeHit:
    """One injected probe's firing inside a session, decoded; `depth` is the level a call made there would have."""

    __slots__ = ("probe_id", "spec", "kind", "depth", "ts", "seq", "fields", "missing_before", "in_call")

    def __init__(self, probe_id: int, spec: str, kind: str, depth: int, ts: int, seq: int,
                 fields: tuple[ProbeField, ...] = (), missing_before: int = 0) -> None:
        self.probe_id = probe_id
        self.spec = spec
        self.kind = kind
        self.depth = depth
        self.ts = ts  # boot clock
        self.seq = seq
        self.fields = fields
        self.missing_before = missing_before
        self.in_call = False  # fired inside a recorded call (it is in that Call's probes), not at the top level

    def text(self, addresses: bool = True) -> str:
        """`name=value` pairs, as the -T table shows them after the spec."""
        return "  ".join(f"{f.name}={_show(f)}" for f in self.fields if addresses or not f.address)


def _show(f: ProbeField) -> str:
    if isinstance(f.value, str):
        return repr(f.value) if (not f.value or " " in f.value) else f.value
    return f"0x{f.value:x}" if f.address else str(f.value)


def _int(data: bytes, off: int, size: int, signed: bool) -> int | None:
    if size not in (1, 2, 4, 8) or off + size > len(data):
        return None
    return int.from_bytes(data[off:off + size], "little", signed=signed)


def decode_field(f: TpField, data: bytes) -> ProbeField | None:
    """One field of a raw tracepoint entry; None when the copied bytes do not reach it."""
    if f.ctype.startswith("__data_loc"):
        loc = _int(data, f.offset, 4, False)
        if loc is None:
            return None
        off, ln = loc & 0xFFFF, loc >> 16
        if off + ln > len(data):
            return None
        raw = data[off:off + ln]
        return ProbeField(f.name, raw.split(b"\0", 1)[0].decode(errors="replace") if "char" in f.ctype else raw.hex())
    if f.offset + f.size > len(data):
        return None
    raw = data[f.offset:f.offset + f.size]
    if f.array:
        if "char" in f.ctype:
            return ProbeField(f.name, raw.split(b"\0", 1)[0].decode(errors="replace"))
        return ProbeField(f.name, raw.hex())
    value = _int(data, f.offset, f.size, f.signed)
    return ProbeField(f.name, raw.hex() if value is None else value, f.is_address)


def decode_payload(info: ProbeInfo, value: int, data: bytes) -> tuple[ProbeField, ...]:
    """The fields one record of probe `info` carries: a tracepoint's by name, a raw tracepoint's args, a kprobe's
    instruction pointer, a kretprobe's return value."""
    kind = info.spec.kind
    if kind == "tp" and info.fmt is not None:
        return tuple(p for f in info.fmt.fields if (p := decode_field(f, data)) is not None)
    if kind == "rawtp":
        n = min(info.nargs, len(data) // 8)
        addrs = info.arg_addresses
        return tuple(ProbeField(f"arg{i}", int.from_bytes(data[8 * i:8 * i + 8], "little"),
                                i < len(addrs) and addrs[i]) for i in range(n))
    if kind == "kretprobe":
        bits = 32 if info.ret_int32 else 64
        value &= (1 << bits) - 1
        return (ProbeField("ret", value - (1 << bits) if value >= 1 << (bits - 1) else value),)
    if kind == "kprobe":
        return (ProbeField("ip", value, True),)
    return ()


def probe_table(infos: Sequence[ProbeInfo]) -> dict[int, ProbeInfo]:
    return {p.id: p for p in infos}

"""Which Debian kernel packages the VM tests boot: the pure logic behind tests/vm/fetch-kernel.

A *track* is a meta package in one or more suites (`linux-image-amd64` in bullseye-security is 5.10, in unstable
the newest 7.x). Resolving a track against the suites' Packages indexes gives the concrete packages to unpack;
kernels.pins records them (name, version, sha256, pool path) so that every run boots the same bytes. Unstable and
the security suites drop superseded kernels within weeks, so a pinned package can vanish from the pool: then the
track is resolved again and the run goes on with the suite's newest kernel (fall_forward). No I/O here, so the
unit tests can drive all of it with recorded data.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

PINS_FILE = Path(__file__).resolve().parent / "kernels.pins"
SUITES: dict[str, str] = {  # suite -> archive root; each suite's index is dists/SUITE/main/binary-ARCH
    "bullseye-security": "http://deb.debian.org/debian-security",
    "bookworm": "http://deb.debian.org/debian",
    "bookworm-security": "http://deb.debian.org/debian-security",
    "unstable": "http://deb.debian.org/debian",
}
# the packages that are unpacked into a kernel's directory; `dbg` only with --dbg
BOOT_ROLES = ("kernel", "base", "binary", "modules")
SPLIT_ROLES = ("base", "binary", "modules")  # 7.x: linux-image-RELEASE only depends on these


@dataclass(frozen=True)
class Track:
    meta: str
    suites: tuple[str, ...]
    arch: str = "amd64"  # Debian's architecture name; other than amd64, the series is named `7.2-arm64`


TRACKS = (
    Track("linux-image-amd64", ("bullseye-security",)),  # 5.10: the oldest LTS Debian still ships
    Track("linux-image-amd64", ("bookworm", "bookworm-security")),  # 6.1
    Track("linux-image-6.12-amd64", ("bookworm", "bookworm-security")),  # 6.12 (bookworm's backport)
    Track("linux-image-amd64", ("unstable",)),  # the newest Debian kernel (7.x)
    Track("linux-image-arm64", ("unstable",), "arm64"),  # the newest, for arm64 (booted under emulation)
)
HOST_ARCH = "amd64"  # the architecture the VM tests boot natively (TCG or KVM); others are emulated


@dataclass(frozen=True)
class Pin:
    """One line of kernels.pins. The `meta` line names the track (suite holds its suites, comma-separated)."""

    series: str
    role: str  # meta | kernel (one package, pre-7.x) | base, binary, modules (7.x split) | dbg
    suite: str
    package: str
    version: str
    sha256: str = "-"
    filename: str = "-"

    @property
    def url(self) -> str:
        return f"{SUITES[self.suite]}/{self.filename}"


@dataclass(frozen=True)
class Entry:
    """One stanza of a Packages index, with the suite it came from."""

    suite: str
    fields: dict[str, str]

    @property
    def package(self) -> str:
        return self.fields["Package"]

    @property
    def version(self) -> str:
        return self.fields["Version"]


Index = dict[str, list[Entry]]


class ResolveError(Exception):
    pass


def arch_of(series: str) -> str:
    """`7.2-arm64` -> `arm64`; a bare `6.12` is the host's architecture."""
    return series.partition("-")[2] or HOST_ARCH


def index_url(suite: str, name: str = "Packages.xz", arch: str = HOST_ARCH) -> str:
    path = name if name == "InRelease" else f"main/binary-{arch}/{name}"
    return f"{SUITES[suite]}/dists/{suite}/{path}"


def parse_index(text: str, suite: str, index: Index | None = None, prefix: str = "linux-") -> Index:
    """Add the stanzas of a Packages file whose name starts with prefix (an unstable index holds ~70,000)."""
    index = {} if index is None else index
    for stanza in text.split("\n\n"):
        if not stanza.startswith(f"Package: {prefix}"):
            continue
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        entry = Entry(suite, fields)
        index.setdefault(entry.package, []).append(entry)
    return index


def _order(c: str) -> int:
    return -1 if c == "~" else ord(c) if c.isalpha() else ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or a revision: non-digit runs char by char, digit runs as numbers."""
    while a or b:
        na, nb = re.match(r"\D*", a).group(), re.match(r"\D*", b).group()  # type: ignore[union-attr]
        for i in range(max(len(na), len(nb))):
            ca = _order(na[i]) if i < len(na) else 0
            cb = _order(nb[i]) if i < len(nb) else 0
            if ca != cb:
                return -1 if ca < cb else 1
        a, b = a[len(na):], b[len(nb):]
        da, db = re.match(r"\d*", a).group(), re.match(r"\d*", b).group()  # type: ignore[union-attr]
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
        a, b = a[len(da):], b[len(db):]
    return 0


def compare_versions(a: str, b: str) -> int:
    """Debian version order (epoch:upstream-revision), so that 6.1.192-2 in bookworm-security beats 6.1.176-1."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
        return int(epoch or 0), upstream, revision

    (ea, ua, ra), (eb, ub, rb) = split(a), split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def newest(index: Index, package: str, version: str | None = None) -> Entry:
    """The highest version of package over all suites in index (or exactly `version`)."""
    entries = [e for e in index.get(package, []) if version is None or e.version == version]
    if not entries:
        raise ResolveError(f"{package}{f' (= {version})' if version else ''} is not in the index")
    return max(entries, key=functools.cmp_to_key(lambda x, y: compare_versions(x.version, y.version)))


def depends(entry: Entry) -> list[tuple[str, str | None]]:
    """(name, exact version or None) of each Depends group's first alternative."""
    deps = []
    for group in filter(None, (g.strip() for g in entry.fields.get("Depends", "").split(","))):
        m = re.match(r"([^\s(|]+)\s*(?:\(\s*=\s*([^)\s]+)\s*\))?", group.split("|")[0].strip())
        if m:
            deps.append((m.group(1), m.group(2)))
    return deps


def series_of(version: str) -> str:
    """`6.12.117-1~deb12u1` -> `6.12`: the kernel's major.minor, the name the tests use for it."""
    m = re.match(r"(\d+\.\d+)", version)
    if not m:
        raise ResolveError(f"no kernel series in version {version}")
    return m.group(1)


def _pin(series: str, role: str, entry: Entry) -> Pin:
    fields = entry.fields
    return Pin(series, role, entry.suite, entry.package, entry.version, fields["SHA256"], fields["Filename"])


def resolve(track: Track, index: Index) -> list[Pin]:
    """The packages the track's meta package stands for today: its linux-image-RELEASE, which before 7.x is the
    kernel itself and since 7.x only depends on linux-base/-binary/-modules-RELEASE; plus the -dbg if there is one."""
    meta = newest(index, track.meta)
    images = [(n, v) for n, v in depends(meta) if n.startswith("linux-image-")]
    if len(images) != 1:
        raise ResolveError(f"{track.meta} {meta.version} does not depend on exactly one linux-image-* package")
    image = newest(index, *images[0])
    series = series_of(image.version) + ("" if track.arch == HOST_ARCH else f"-{track.arch}")
    pins = [Pin(series, "meta", ",".join(track.suites), meta.package, meta.version)]
    parts = [(role, n, v) for n, v in depends(image) for role in SPLIT_ROLES if n.startswith(f"linux-{role}-")]
    if any(role == "binary" for role, _, _ in parts):
        pins += [_pin(series, role, newest(index, n, v)) for role, n, v in parts]
    else:
        pins.append(_pin(series, "kernel", image))
    dbg = [e for e in index.get(f"{image.package}-dbg", []) if e.version == image.version]
    if dbg:
        pins.append(_pin(series, "dbg", dbg[0]))
    return pins


def track_of(pins: list[Pin]) -> Track:
    meta = next(p for p in pins if p.role == "meta")
    return Track(meta.package, tuple(meta.suite.split(",")), arch_of(meta.series))


def kernel_pin(pins: list[Pin]) -> Pin:
    """The package holding vmlinuz: `kernel` before 7.x, `binary` since."""
    for p in pins:
        if p.role in ("kernel", "binary"):
            return p
    raise ResolveError(f"no kernel package pinned for {pins[0].series if pins else '?'}")


def release_of(pins: list[Pin]) -> str:
    """The kernel release (`uname -r`) of a pinned set: `linux-binary-7.2.13+deb14-amd64` -> `7.2.13+deb14-amd64`."""
    return kernel_pin(pins).package.split("-", 2)[2]


def kernel_dirname(pins: list[Pin]) -> str:
    """The cache folder's name: linux-image-RELEASE, as tests/vm/fetch-kernel has always named it."""
    return f"linux-image-{release_of(pins)}"


def fall_forward(pinned: list[Pin], gone: str, index: Index) -> tuple[list[Pin], str]:
    """A pinned pool file `gone` returned 404: resolve the track again on a fresh index. Returns the new pins and
    the one line to print. Raises when the index still offers the gone file (a mirror out of step: retry later)."""
    track = track_of(pinned)
    fresh = resolve(track, index)
    if any(p.filename == gone for p in fresh):
        raise ResolveError(f"{gone} is missing from the pool but still listed in the {track.suites} index")
    old, new = kernel_pin(pinned), kernel_pin(fresh)
    message = (f"fetch-kernel: pinned {old.package} {old.version} is gone from {old.suite}; using the suite's newest, "
               f"{new.package} {new.version}; run `tests/vm/fetch-kernel --update-pins` and commit kernels.pins")
    return fresh, message


HEADER = """\
# Debian kernel packages of the VM tests, one line per package (sha256 and pool path as the suite's index had them).
# Written by `tests/vm/fetch-kernel --update-pins`; the `meta` line of each series is the track it follows
# (meta package, suites searched) when a pinned file is gone from the pool.
"""


def format_pins(pins: list[Pin]) -> str:
    cols = ["series", "role", "suite", "package", "version", "sha256", "filename"]
    rows = [cols] + [[getattr(p, c) for c in cols] for p in pins]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) - 1)]
    lines = [" ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + " " + r[-1] for r in rows]
    return HEADER + "# " + lines[0] + "\n" + "".join(f"  {line}\n" for line in lines[1:])


def parse_pins(text: str) -> list[Pin]:
    pins = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cols = line.split()
        if len(cols) != 7:
            raise ResolveError(f"kernels.pins line {n}: expected 7 columns, got {len(cols)}")
        pins.append(Pin(*cols))
    return pins


def by_series(pins: list[Pin]) -> dict[str, list[Pin]]:
    out: dict[str, list[Pin]] = {}
    for p in pins:
        out.setdefault(p.series, []).append(p)
    return out


def load_series(path: Path | None = None, arch: str | None = HOST_ARCH) -> dict[str, list[Pin]]:
    """The pinned series of one architecture (None: all of them)."""
    return {s: pins for s, pins in by_series(parse_pins((path or PINS_FILE).read_text())).items()
            if arch is None or arch_of(s) == arch}

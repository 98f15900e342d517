"""tests/vm/fetch-kernel: which Debian packages a kernel series is, pinned, and what happens when one is gone.

Recorded Packages stanzas (shortened) stand in for the suites' indexes: bookworm and bookworm-security both offer
linux-image-amd64 (6.1, one package per kernel), unstable offers 7.x split into linux-base/-binary/-modules.
No network, no root: the script's downloads and dpkg are replaced.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import types
from pathlib import Path

import pytest

from tests.vm import kernel_pins as kp

FETCH = Path(__file__).resolve().parents[1] / "vm" / "fetch-kernel"


OLD_DEPS = "kmod, linux-base (>= 4.3~), initramfs-tools | linux-initramfs-tool"


def stanza(package: str, version: str, depends: str = "", pool: str = "pool/main/l/linux") -> str:
    lines = [f"Package: {package}", f"Version: {version}", "Architecture: amd64"]
    if depends:
        lines.append(f"Depends: {depends}")
    lines += [f"Filename: {pool}/{package}_{version}_amd64.deb",
              f"SHA256: {hashlib.sha256(package.encode()).hexdigest()}",
              "Description: Linux for 64-bit PCs", " continued on a second line"]
    return "\n".join(lines) + "\n"


BOOKWORM = "\n".join([
    stanza("bash", "5.2.15-2+b2"),
    stanza("linux-image-amd64", "6.1.176-1", "linux-image-6.1.0-50-amd64 (= 6.1.176-1)"),
    stanza("linux-image-6.1.0-50-amd64", "6.1.176-1", OLD_DEPS),
])
SECURITY = "\n".join([
    stanza("linux-image-amd64", "6.1.192-2", "linux-image-6.1.0-56-amd64 (= 6.1.192-2)"),
    stanza("linux-image-6.1.0-56-amd64", "6.1.192-2", OLD_DEPS),
    stanza("linux-image-6.1.0-56-amd64-dbg", "6.1.192-2"),
])


def unstable(v: str = "7.2.13") -> str:
    r = f"{v}+deb14-amd64"
    return "\n".join([
        stanza("linux-image-amd64", f"{v}-1", f"linux-base-amd64 (= {v}-1), linux-image-{r} (= {v}-1)"),
        stanza("linux-image-cloud-amd64", f"{v}-1", f"linux-image-{v}+deb14-cloud-amd64 (= {v}-1)"),
        stanza(f"linux-image-{r}", f"{v}-1", f"dracut | initramfs-tools (>= 0.120+deb8u2), linux-base-{r} (= {v}-1), "
               f"linux-binary-{r} (= {v}-1), linux-modules-{r} (= {v}-1)"),
        stanza(f"linux-base-{r}", f"{v}-1"),
        stanza(f"linux-binary-{r}", f"{v}-1", f"linux-base-{r} (= {v}-1)", pool="pool/main/l/linux-signed-amd64"),
        stanza(f"linux-modules-{r}", f"{v}-1", f"kmod, linux-base-{r} (= {v}-1)"),
    ])


BOOKWORM_TRACK = kp.Track("linux-image-amd64", ("bookworm", "bookworm-security"))
UNSTABLE_TRACK = kp.Track("linux-image-amd64", ("unstable",))


def bookworm_index() -> kp.Index:
    return kp.parse_index(SECURITY, "bookworm-security", kp.parse_index(BOOKWORM, "bookworm"))


def test_parse_index_keeps_linux_packages_with_their_suite_and_folded_fields() -> None:
    index = bookworm_index()
    assert "bash" not in index
    assert [e.suite for e in index["linux-image-amd64"]] == ["bookworm", "bookworm-security"]
    entry = index["linux-image-6.1.0-56-amd64"][0]
    assert entry.fields["Filename"].endswith("linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb")
    assert entry.fields["Description"] == "Linux for 64-bit PCs\ncontinued on a second line"


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("6.1.192-2", "6.1.176-1", 1),
    ("7.2.9-1", "7.2.13-1", -1),
    ("6.12.117-1~deb12u1", "6.12.117-1", -1),  # ~ sorts before everything, even the end
    ("6.12.117-1", "6.12.117-1+b1", -1),
    ("1:5.10-1", "7.2.13-1", 1),  # the epoch wins
    ("5.10.262-1", "5.10.262-1", 0),
])
def test_debian_version_order(a: str, b: str, expected: int) -> None:
    assert kp.compare_versions(a, b) == expected
    assert kp.compare_versions(b, a) == -expected


def test_one_package_kernel_resolves_to_the_newest_suite_and_its_dbg() -> None:
    pins = kp.resolve(BOOKWORM_TRACK, bookworm_index())
    assert [(p.series, p.role, p.suite, p.package, p.version) for p in pins] == [
        ("6.1", "meta", "bookworm,bookworm-security", "linux-image-amd64", "6.1.192-2"),
        ("6.1", "kernel", "bookworm-security", "linux-image-6.1.0-56-amd64", "6.1.192-2"),
        ("6.1", "dbg", "bookworm-security", "linux-image-6.1.0-56-amd64-dbg", "6.1.192-2"),
    ]
    assert kp.release_of(pins) == "6.1.0-56-amd64"
    assert kp.kernel_dirname(pins) == "linux-image-6.1.0-56-amd64"
    assert pins[1].url.startswith("http://deb.debian.org/debian-security/pool/main/l/linux/linux-image-6.1.0-56")
    assert pins[1].sha256 == bookworm_index()["linux-image-6.1.0-56-amd64"][0].fields["SHA256"]


def test_split_kernel_resolves_to_base_binary_and_modules() -> None:
    pins = kp.resolve(UNSTABLE_TRACK, kp.parse_index(unstable(), "unstable"))
    assert [(p.series, p.role, p.package) for p in pins] == [
        ("7.2", "meta", "linux-image-amd64"),
        ("7.2", "base", "linux-base-7.2.13+deb14-amd64"),
        ("7.2", "binary", "linux-binary-7.2.13+deb14-amd64"),
        ("7.2", "modules", "linux-modules-7.2.13+deb14-amd64"),
    ]
    assert kp.release_of(pins) == "7.2.13+deb14-amd64"
    assert pins[2].filename.startswith("pool/main/l/linux-signed-amd64/")


def test_another_architecture_is_its_own_series_and_index() -> None:
    """The arm64 track reads main/binary-arm64 and names its series `7.2-arm64`; the host's VM tests list only
    the host's series unless asked for all."""
    arm64 = kp.Track("linux-image-arm64", ("unstable",), "arm64")
    text = unstable().replace("amd64", "arm64")
    pins = kp.resolve(arm64, kp.parse_index(text, "unstable"))
    assert {p.series for p in pins} == {"7.2-arm64"}
    assert kp.release_of(pins) == "7.2.13+deb14-arm64" and kp.track_of(pins) == arm64
    assert kp.index_url("unstable", arch="arm64").endswith("/dists/unstable/main/binary-arm64/Packages.xz")
    assert kp.arch_of("7.2-arm64") == "arm64" and kp.arch_of("6.12") == "amd64"
    assert all(kp.arch_of(s) == "amd64" for s in kp.load_series())
    assert "7.2-arm64" in kp.load_series(arch=None)


def test_pins_file_round_trip() -> None:
    pins = kp.resolve(BOOKWORM_TRACK, bookworm_index()) + kp.resolve(UNSTABLE_TRACK, kp.parse_index(unstable(),
                                                                                                     "unstable"))
    text = kp.format_pins(pins)
    assert text.startswith("#")
    assert kp.parse_pins(text) == pins
    assert list(kp.by_series(pins)) == ["6.1", "7.2"]
    assert kp.track_of(kp.by_series(pins)["6.1"]) == BOOKWORM_TRACK
    with pytest.raises(kp.ResolveError, match="line 1"):
        kp.parse_pins("7.2 binary unstable linux-binary-7.2.13+deb14-amd64 7.2.13-1\n")


def test_a_gone_pin_falls_forward_to_the_suites_newest_kernel() -> None:
    pinned = kp.resolve(UNSTABLE_TRACK, kp.parse_index(unstable("7.2.9"), "unstable"))
    gone = pinned[2].filename
    fresh, message = kp.fall_forward(pinned, gone, kp.parse_index(unstable("7.3.1"), "unstable"))
    assert kp.release_of(fresh) == "7.3.1+deb14-amd64"
    assert fresh[0].series == "7.3"
    assert "linux-binary-7.2.9+deb14-amd64 7.2.9-1 is gone" in message
    assert "linux-binary-7.3.1+deb14-amd64 7.3.1-1" in message and "--update-pins" in message
    # a mirror whose index still lists the gone file: no fall-forward to the same thing
    with pytest.raises(kp.ResolveError, match="still listed"):
        kp.fall_forward(pinned, gone, kp.parse_index(unstable("7.2.9"), "unstable"))


@pytest.fixture()
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """tests/vm/fetch-kernel loaded as a module: pins of 7.2.9, a cache in tmp_path, no network, no dpkg."""
    loader = importlib.machinery.SourceFileLoader("fetch_kernel", str(FETCH))
    spec = importlib.util.spec_from_loader("fetch_kernel", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    pins_file = tmp_path / "kernels.pins"
    pins_file.write_text(kp.format_pins(kp.resolve(UNSTABLE_TRACK, kp.parse_index(unstable("7.2.9"), "unstable"))))
    monkeypatch.setattr(module.kp, "PINS_FILE", pins_file)
    monkeypatch.setenv("RETSNOOP_OTEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(module, "subprocess", types.SimpleNamespace(run=lambda *a, **k: None))
    monkeypatch.setattr(module, "load_index", lambda suites, arch: kp.parse_index(unstable("7.3.1"), "unstable"))
    module.fetched = []

    def download(url: str, dest: Path, sha256: str | None = None) -> None:
        if "7.2.9" in url:
            raise module.Gone(url)
        module.fetched.append(url)
        dest.write_bytes(b"deb")

    monkeypatch.setattr(module, "download", download)
    return module


def test_the_script_falls_forward_once_then_works_offline(script: types.ModuleType,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    kdir = script.fetch("7.2", dbg=False)
    assert kdir.name == "linux-image-7.3.1+deb14-amd64"
    assert len(script.fetched) == 3
    assert "pinned linux-binary-7.2.9+deb14-amd64 7.2.9-1 is gone" in capsys.readouterr().err
    # the next run reuses the fall-forward from the cache: nothing downloaded, the same one line said
    script.fetched.clear()
    assert script.fetch("7.2", dbg=False) == kdir
    assert script.fetched == []
    assert capsys.readouterr().err.count("is gone") == 1


@pytest.mark.parametrize(("files", "release"), [
    (["boot/vmlinuz-6.1.0-56-amd64", "lib/modules/6.1.0-56-amd64/kernel/x.ko"], "6.1.0-56-amd64"),
    (["usr/lib/modules/7.2.13+deb14-amd64/vmlinuz", "usr/lib/modules/7.2.13+deb14-amd64/kernel/x.ko.xz"],
     "7.2.13+deb14-amd64"),
])
def test_vm_run_finds_vmlinuz_in_both_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str],
                                              release: str) -> None:
    loader = importlib.machinery.SourceFileLoader("vm_run", str(FETCH.with_name("run")))
    spec = importlib.util.spec_from_loader("vm_run", loader)
    assert spec is not None
    run = importlib.util.module_from_spec(spec)
    loader.exec_module(run)
    kdir = tmp_path / f"linux-image-{release}"
    for f in files:
        (kdir / f).parent.mkdir(parents=True, exist_ok=True)
        (kdir / f).write_bytes(b"")
    done = types.SimpleNamespace(returncode=0, stdout=f"fetch-kernel: progress\n{kdir}\n")
    monkeypatch.setattr(run, "subprocess", types.SimpleNamespace(run=lambda *a, **k: done, PIPE=-1))
    vmlinuz, found = run.fetch_kernel("x", False)
    assert found == release
    assert run.kernel_dir(vmlinuz) == kdir

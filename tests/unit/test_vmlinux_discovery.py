"""Finding the DWARF vmlinux of the running kernel in the standard places, by build-id (a fixture root)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from retsnoop_otel.symbols.dwarf import DwarfError, elf_build_id, find_vmlinux

RELEASE = "6.1.0-56-amd64"


@pytest.fixture(scope="module")
def elves(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two small ELF files with different GNU build-ids (stand-ins for vmlinux images)."""
    d = tmp_path_factory.mktemp("elves")
    out = []
    for i in (1, 2):
        src = d / f"k{i}.c"
        src.write_text(f"int kernel_{i}(void) {{ return {i}; }}\n")
        obj = d / f"vmlinux{i}"
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id=sha1", "-o", str(obj), str(src)], check=True)
        out.append(obj)
    return out[0], out[1]


def _root(tmp_path: Path, running: Path) -> Path:
    """A root whose /sys/kernel/notes carries the build-id of `running`."""
    bid = bytes.fromhex(elf_build_id(str(running)))
    notes = struct.pack("<III", 4, len(bid), 3) + b"GNU\0" + bid
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/notes").write_bytes(notes)
    return tmp_path


def _put(root: Path, rel: str, elf: Path) -> Path:
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(elf, dest)
    return dest


def test_first_standard_path_with_the_running_build_id_wins(tmp_path, elves):
    mine, other = elves
    root = _root(tmp_path, mine)
    _put(root, f"boot/vmlinux-{RELEASE}", other)  # earlier in the list, but another build
    want = _put(root, f"usr/lib/debug/boot/vmlinux-{RELEASE}", mine)
    assert find_vmlinux(None, str(root), RELEASE) == str(want)


def test_nothing_matching_means_kallsyms_only(tmp_path, elves):
    mine, other = elves
    root = _root(tmp_path, mine)
    _put(root, f"usr/lib/debug/boot/vmlinux-{RELEASE}", other)
    assert find_vmlinux(None, str(root), RELEASE) is None
    assert find_vmlinux(None, str(root), "9.9.9") is None


def test_explicit_k_is_checked_against_the_running_kernel(tmp_path, elves):
    mine, other = elves
    root = _root(tmp_path, mine)
    assert find_vmlinux(str(mine), str(root), RELEASE) == str(mine)
    with pytest.raises(DwarfError, match="belongs to another kernel build"):
        find_vmlinux(str(other), str(root), RELEASE)
    with pytest.raises(DwarfError, match="no such file"):
        find_vmlinux(str(tmp_path / "missing"), str(root), RELEASE)
    text = tmp_path / "notelf"
    text.write_text("hello")
    with pytest.raises(DwarfError, match="not an ELF vmlinux"):
        find_vmlinux(str(text), str(root), RELEASE)


def test_unreadable_candidates_are_skipped_and_an_unreadable_explicit_file_says_so(tmp_path) -> None:
    """An unprivileged run meets root-only vmlinux files: the standard places are skipped, a -k is an error."""
    import os
    import subprocess
    import sys
    release = "9.9.9-test"
    secret = tmp_path / "lib" / "modules" / release
    secret.mkdir(parents=True)
    (secret / f"vmlinux-{release}").write_bytes(b"\x7fELF")
    secret.chmod(0o700)
    tmp_path.chmod(0o755)
    (tmp_path / "lib").chmod(0o755)
    (tmp_path / "lib" / "modules").chmod(0o755)
    code = (f"from retsnoop_otel.symbols.dwarf import find_vmlinux, DwarfError\n"
            f"print(find_vmlinux(None, {str(tmp_path)!r}, {release!r}))\n"
            f"try:\n    find_vmlinux({str(secret / ('vmlinux-' + release))!r}, {str(tmp_path)!r}, {release!r})\n"
            f"except DwarfError as e:\n    print(e)\n")
    repo = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": repo})
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0] == "None", out.stderr
    assert "cannot read it" in lines[1] and "Permission denied" in lines[1], lines

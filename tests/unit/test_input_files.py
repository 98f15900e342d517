"""inputs/files: only regular files, never a blocking open, a bounded read, UTF-8 with the offset."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from retsnoop_otel.command.errors import InputError
from retsnoop_otel.inputs import files
from retsnoop_otel.inputs.files import MAX_CONFIG_BYTES, MAX_GLOB_FILE_BYTES, MAX_PEM_BYTES, shown


def read_bytes(path, name: str, cap: int, error=InputError) -> bytes:  # noqa: ANN001 - a str or a Path
    """The reader as the commands call it, with their InputError (exit 2) unless a test gives another type."""
    return files.read_bytes(path, name, cap, error)


def read_text(path, name: str, cap: int, error=InputError) -> str:  # noqa: ANN001
    return files.read_text(path, name, cap, error)


def _within(seconds: float, fn, *args):
    """fn(*args) in a thread; fails if it has not returned within `seconds` (a blocking open would hang)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} blocked for more than {seconds} s"
    if "exc" in out:
        raise out["exc"]
    return out["value"]


def test_caps():
    assert MAX_CONFIG_BYTES == MAX_GLOB_FILE_BYTES == 4 << 20
    assert MAX_PEM_BYTES == 1 << 20


def test_regular_file_and_symlink_to_one(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("probe_sets: []\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(f)
    assert read_text(f, "config file", MAX_CONFIG_BYTES) == "probe_sets: []\n"
    assert read_text(link, "config file", MAX_CONFIG_BYTES) == "probe_sets: []\n"


def test_fifo_refused_at_once_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"fifo: the --config file is a FIFO \(named pipe\), not a regular file"):
        _within(5, read_bytes, fifo, "--config file", MAX_CONFIG_BYTES)


def test_dev_zero_refused():
    with pytest.raises(InputError, match=r"^/dev/zero: the glob file is a character device, not a regular file"):
        _within(5, read_bytes, "/dev/zero", "glob file", MAX_GLOB_FILE_BYTES)


def test_directory_refused(tmp_path):
    with pytest.raises(InputError, match="is a directory, not a regular file"):
        read_text(tmp_path, "config file", MAX_CONFIG_BYTES)


def test_socket_refused(tmp_path):
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(InputError, match="is a socket, not a regular file"):
            _within(5, read_bytes, path, "certificate", MAX_PEM_BYTES)


def test_missing_file_says_why(tmp_path):
    with pytest.raises(InputError, match=r"nope: cannot read the config file: No such file or directory$"):
        read_text(tmp_path / "nope", "config file", MAX_CONFIG_BYTES)


def test_a_nul_in_the_path_is_refused_not_raised():
    """os.stat() raises ValueError for it; a YAML string can hold one ("@\\0" as a glob file)."""
    with pytest.raises(InputError, match=r"^'a\\x00b': not a file name \(it holds a NUL character\)$"):
        read_text("a\x00b", "glob file", MAX_GLOB_FILE_BYTES)


def test_over_the_cap_refused_with_the_cap(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"x" * (MAX_PEM_BYTES + 1))
    with pytest.raises(InputError, match=r"the certificate is larger than 1 MiB, the limit for it"):
        read_bytes(f, "certificate", MAX_PEM_BYTES)
    f.write_bytes(b"x" * MAX_PEM_BYTES)  # exactly the cap is fine
    assert len(read_bytes(f, "certificate", MAX_PEM_BYTES)) == MAX_PEM_BYTES


def test_not_utf8_refused_with_the_offset(tmp_path):
    f = tmp_path / "globs"
    f.write_bytes(b"*sys_bpf\n\xff\xfe")
    with pytest.raises(InputError, match=r"globs: not a text file \(invalid start byte at byte 9\); the glob file "
                       "must be UTF-8"):
        read_text(f, "glob file", MAX_GLOB_FILE_BYTES)


def test_the_callers_error_type(tmp_path):
    class MyError(ValueError):
        pass

    with pytest.raises(MyError, match="a directory"):
        read_text(tmp_path, "config file", MAX_CONFIG_BYTES, MyError)


def test_long_path_cut_in_the_message(tmp_path):
    with pytest.raises(InputError) as info:
        read_text("/" + "d" * 300, "config file", MAX_CONFIG_BYTES)
    assert "(301 characters)" in str(info.value) and len(str(info.value)) < 200


def test_shown_bounds_the_echo():
    assert shown("abc") == "'abc'"
    assert shown("x" * 100000) == "'" + "x" * 80 + "…' (100000 characters)"
    assert shown("y" * 81, quote=False) == "y" * 80 + "… (81 characters)"
    assert shown("\x00" * 100).endswith("…' (100 characters)") and "\x00" not in shown("\x00" * 100)
    assert shown("a\nb\x1b[2J", quote=False) == "a\\nb\\x1b[2J"  # unquoted is still one line (issue 47.4)


def test_an_explicit_vmlinux_is_echoed_bounded_and_on_one_line(tmp_path):
    """-k PATH / vmlinux: a path of 100,000 characters or with a newline was echoed whole (black-box run)."""
    from retsnoop_otel.symbols.vmlinux import DwarfError, find_vmlinux
    for path, cut in (("a\nb", "a\\nb: no such file"), ("x" * 100000, "… (100000 characters): cannot read it")):
        with pytest.raises(DwarfError) as info:
            find_vmlinux(path)
        assert cut in str(info.value) and "\n" not in str(info.value) and len(str(info.value)) < 300


def test_no_name_when_the_caller_names_the_file(tmp_path):
    with pytest.raises(InputError, match=r"nope: No such file or directory$"):
        read_bytes(tmp_path / "nope", "", MAX_PEM_BYTES)
    with pytest.raises(InputError, match=r": a directory, not a regular file"):
        read_bytes(tmp_path, "", MAX_PEM_BYTES)


@pytest.mark.parametrize(("text", "out"), [("errs", "errs"), ("a\rb", "a\\rb"), ("x\n", "x\\n"),
                                           ("\x1b[31m", "\\x1b[31m"), ("é", "é")])
def test_plain_names_stay_on_one_line(text: str, out: str) -> None:
    assert files.plain(text) == out


def test_plain_cuts_long_names() -> None:
    assert files.plain("k" * 1000) == "k" * 160 + "… (1000 characters)"

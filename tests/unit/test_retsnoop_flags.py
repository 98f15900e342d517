"""retsnoop's command line beyond -e/-a/-d: -c/--case presets, @file for -n/-N, -C keys with retsnoop's
meaning and --config-help (issue 35 point 4), checked against what retsnoop v0.11 documents."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from retsnoop_otel.trace.cases import CASES
from retsnoop_otel.trace.flags import C_HELP, C_NOT_YET, parse


def probe_set(*argv: str):
    return parse(list(argv), environ={}).config.probe_sets[0]


def refused(*argv: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        parse(list(argv), environ={})
    assert exc.value.code == 2 and len(err.getvalue().strip().splitlines()) == 1
    return err.getvalue()


def test_a_case_adds_its_globs_to_the_users_own() -> None:
    ps = probe_set("-c", "bpf")
    assert ps.entry == ("*_sys_bpf",) and "*btf*" in ps.allow and "bpf_lsm_*" in ps.deny
    both = probe_set("-c", "perf", "-e", "my_entry", "-a", "x_*", "-d", "y", "-c", "bpf", "-c", "perf")
    assert both.entry == ("*_sys_perf_event_open", "perf_ioctl", "*_sys_bpf", "my_entry")  # each case once
    assert both.allow[:2] == ("*perf_*", "*bpf*") and both.allow[-1] == "x_*"
    assert both.deny[-1] == "y" and set(CASES["bpf"].deny) <= set(both.deny)
    assert "invalid choice: 'net'" in refused("-c", "net")
    assert "or -c CASE" in refused("-a", "x")


def test_comm_filters_read_files_as_retsnoop_does(tmp_path: Path) -> None:
    names = tmp_path / "comms"
    names.write_text("bash\n# a comment\n\n  sshd  \n")
    ps = probe_set("-e", "x", "-n", f"@{names}", "-n", "top", "-N", f"@{names}")
    assert (ps.comms, ps.no_comms) == (("bash", "sshd", "top"), ("bash", "sshd"))
    assert "-n " in refused("-e", "x", "-n", f"@{tmp_path}/missing") and "No such file" in refused(
        "-e", "x", "-n", f"@{tmp_path}/missing")
    assert "not a regular file" in refused("-e", "x", "-N", f"@{tmp_path}")


@pytest.mark.parametrize(("value", "source_lines", "inlines"), [
    ("none", False, False), ("n", False, False), ("linenum", True, False), ("l", True, False),
    ("inlines", True, True), ("i", True, True)])
def test_symbolization_mode_key_means_what_s_means(value: str, source_lines: bool, inlines: bool) -> None:
    symbols = parse(["-e", "x", "-C", f"stacks.symb-mode={value}"], environ={}).config.symbols
    assert (symbols.source_lines, symbols.inlines, symbols.vmlinux is not None) == (source_lines, inlines,
                                                                                     source_lines)
    flag = {False: ["-sn"], True: ["-ss"] if inlines else ["-s"]}[source_lines]
    assert parse(["-e", "x", *flag], environ={}).config.symbols == symbols


def test_other_keys_and_what_is_not_there_yet() -> None:
    console = parse(["-e", "x", "-B", "-C", "fmt.lbr-max-count=5"], environ={}).config.exporter.console
    assert console.lbr_max_count == 5
    assert "needs --lbr" in refused("-e", "x", "-C", "fmt.lbr-max-count=5")
    assert "not a mode; write none, linenum or inlines" in refused("-e", "x", "-C", "stacks.symb-mode=all")
    for key in C_NOT_YET:
        assert f"-C {key} is retsnoop's, and retsnoop-otel does not have it yet" in refused("-e", "x", "-C",
                                                                                            f"{key}=1")
    assert "unknown -C key 'zz'" in refused("-e", "x", "-C", "zz=1")


def test_config_help_lists_every_key_and_exits_zero() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        parse(["--config-help"], environ={})
    assert exc.value.code == 0
    listed = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("  -C ")]
    assert listed == [*C_HELP, *C_NOT_YET]


def test_web_listen_address_is_the_exporter_toolkits_flag_and_the_old_ones_stay() -> None:
    def metrics(*argv: str):
        return parse(["-e", "x", *argv], environ={}).config.metrics

    assert (metrics("--web.listen-address", ":9500").host, metrics("--web.listen-address", ":9500").port) == (
        "0.0.0.0", 9500)
    assert (metrics("--web.listen-address", "[::1]:0").host, metrics("--web.listen-address", "[::1]:0").port) == (
        "::1", 0)
    old = metrics("--metrics-addr", "127.0.0.1", "--metrics-port", "9464")
    assert (old.host, old.port) == ("127.0.0.1", 9464) and metrics().port is None
    assert "not both" in refused("-e", "x", "--web.listen-address", ":1", "--metrics-port", "2")
    assert "is not HOST:PORT" in refused("-e", "x", "--web.listen-address", "9464")
    assert "--metrics-addr needs --metrics-port" in refused("-e", "x", "--metrics-addr", "::1")
    assert "give --web.listen-address" in refused("-e", "x", "--web.config.file", "/dev/null")

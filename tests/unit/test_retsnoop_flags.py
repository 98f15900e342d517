"""retsnoop's command line beyond -e/-a/-d: -c/--case presets, -s levels, @file for -n/-N, -C keys with
retsnoop's meaning and --config-help (issue 35 point 4), checked against what retsnoop v0.11 documents:
its flag table (-c bpf|perf, -s/-ss/-sn and -s inlines/-s none, -n/-N NAME or @file) and its -C keys,
each with its default and range (ints 1..max unless said, bools true/y/1 and false/n/0, enums by name or
first letter)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from retsnoop_otel.capture.records import MAX_ARG_DATA, ArgSizes
from retsnoop_otel.render.formats import ArgsFormat, StackFormat
from retsnoop_otel.trace.cases import CASES
from retsnoop_otel.trace.flags import C_HELP, C_KEYS, capped_arg_sizes, parse


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
    assert "-c CASE or --syscalls" in refused("-a", "x")


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


def console(*argv: str):
    return parse(["-e", "x", *argv], environ={}).config.exporter.console


@pytest.mark.parametrize(("argv", "source_lines", "inlines"), [
    (["-s"], True, False), (["--symbolize"], True, False),
    (["-ss"], True, True), (["-s", "inlines"], True, True), (["-sinlines"], True, True),
    (["--symbolize=inlines"], True, True),
    (["-sn"], False, False), (["-s", "none"], False, False), (["--symbolize", "none"], False, False),
    ([], True, True),  # retsnoop's default: inlines when a vmlinux with DWARF is found
    (["-ss", "-sn"], False, False), (["-sn", "-s"], True, False),  # the last one wins
    (["-s", "-e", "y"], True, False)])  # a flag after -s is not its level
def test_s_levels_are_retsnoops(argv: list[str], source_lines: bool, inlines: bool) -> None:
    symbols = parse(["-e", "x", *argv], environ={}).config.symbols
    assert (symbols.source_lines, symbols.inlines, symbols.vmlinux is not None) == (source_lines, inlines,
                                                                                     source_lines)


def test_s_refuses_other_levels() -> None:
    for argv in (["-s", "all"], ["-sss"], ["--symbolize=linenum"]):
        assert "is not a symbolization level; write -s, -ss (-s inlines) or -sn (-s none)" in refused(
            "-e", "x", *argv)


def test_lbr_count_key_and_the_enums() -> None:
    assert console("-B", "-C", "fmt.lbr-max-count=5").lbr_max_count == 5
    assert "needs --lbr" in refused("-e", "x", "-C", "fmt.lbr-max-count=5")
    assert "-C stacks.symb-mode: 'all' is not a mode; write none, linenum or inlines" in refused(
        "-e", "x", "-C", "stacks.symb-mode=all")
    assert "unknown -C key 'zz'" in refused("-e", "x", "-C", "zz=1")
    assert "-C expects KEY=VALUE" in refused("-e", "x", "-C", "stacks.unfiltered")


@pytest.mark.parametrize("key", ["stacks.unfiltered", "stacks.emit-addrs", "stacks.dec-offs"])
def test_stack_bools(key: str) -> None:
    field = key.split(".")[1].replace("-", "_")
    assert console().stacks == StackFormat()
    for word, value in (("true", True), ("Y", True), ("1", True), ("false", False), ("n", False), ("0", False)):
        assert getattr(console("-C", f"{key}={word}").stacks, field) is value
    assert console("-C", f"{key}=1", "-C", f"{key}=0").stacks == StackFormat()  # the last one wins
    for bad in ("yes", "2", ""):
        assert f"-C {key}: {bad!r} is not true/y/1 or false/n/0" in refused("-e", "x", "-C", f"{key}={bad}")


def test_args_format_keys() -> None:
    assert console().args == ArgsFormat("compact", 120, False)  # retsnoop's defaults
    for word, mode in (("compact", "compact"), ("c", "compact"), ("multiline", "multiline"), ("M", "multiline"),
                       ("verbose", "verbose"), ("v", "verbose")):
        assert console("-C", f"args.fmt-mode={word}").args.mode == mode
    assert "-C args.fmt-mode: 'wide' is not a mode; write compact, multiline or verbose" in refused(
        "-e", "x", "-C", "args.fmt-mode=wide")
    assert console("-C", "args.capture-raw-ptrs=y").args.raw_ptrs is True
    assert "-C args.capture-raw-ptrs: 'on' is not" in refused("-e", "x", "-C", "args.capture-raw-ptrs=on")
    for width in (0, 1, 250):
        assert console("-C", f"args.fmt-max-arg-width={width}").args.max_width == width
    for bad in ("-1", "251", "wide"):
        err = refused("-e", "x", "-C", f"args.fmt-max-arg-width={bad}")
        assert err.count("-C args.fmt-max-arg-width: ") == 1 and "between 0 and 250" in err, err


@pytest.mark.parametrize(("key", "field", "default", "most"), [
    ("args.max-total-args-size", "total", 3072, 65536), ("args.max-sized-arg-size", "sized", 256, 16384),
    ("args.max-str-arg-size", "string", 256, 16384)])
def test_arg_size_keys(key: str, field: str, default: int, most: int) -> None:
    assert getattr(ArgSizes(), field) == default and probe_set("-e", "x").arg_sizes == ArgSizes()
    for value in (1, 100, most):
        assert getattr(probe_set("-e", "x", "-C", f"{key}={value}").arg_sizes, field) == value
    for bad in ("0", str(most + 1), "1k"):
        err = refused("-e", "x", "-C", f"{key}={bad}")
        assert f"-C {key}: " in err and f"between 1 and {most}" in err, err
    # accepted above what the capture copies, and -v says the cap
    (line,) = capped_arg_sizes(ArgSizes(**{"total": 1, field: most}))
    assert line.startswith(f"-C {key}={most}: captured up to ") and "bytes" in line
    assert capped_arg_sizes(ArgSizes(total=MAX_ARG_DATA, sized=MAX_ARG_DATA, string=MAX_ARG_DATA)) == []


def test_every_retsnoop_key_is_known() -> None:
    retsnoops = {"bpf.ringbuf-size", "bpf.sessions-size", "stacks.symb-mode", "stacks.unfiltered",
                 "stacks.emit-addrs", "stacks.dec-offs", "args.max-total-args-size", "args.max-sized-arg-size",
                 "args.max-str-arg-size", "args.capture-raw-ptrs", "args.fmt-mode", "args.fmt-max-arg-width",
                 "fmt.lbr-max-count"}
    assert retsnoops <= set(C_KEYS) and set(C_KEYS) == set(C_HELP)


def test_config_help_lists_every_key_and_exits_zero() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        parse(["--config-help"], environ={})
    assert exc.value.code == 0
    listed = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("  -C ")]
    assert listed == list(C_HELP)
    assert f"captured up to {MAX_ARG_DATA} bytes per argument" in out.getvalue()
    assert "not in retsnoop-otel yet" not in out.getvalue()


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

"""`trace`'s flags for settings that are agent config keys are made from the keys' declarations
(runtime/config_flags.py): the flag has the key's default, help line, choices and range, and no argument of the
parser sets a key's setting by hand (issue 44 point 2)."""

from __future__ import annotations

import argparse

import pytest

from retsnoop_otel.agent.config_file import ConfigError, parse_config
from retsnoop_otel.command.flag_parser import FlagParser
from retsnoop_otel.runtime.config_flags import KeyType, c_help, declared, default_of, help_of
from retsnoop_otel.runtime.config_keys import Section, walk
from retsnoop_otel.runtime.config_sections import TOP
from retsnoop_otel.trace.flags import C_FROM_KEYS, C_HELP, build_parser, parse

HAND_WRITTEN = {"help", "config", "config_help", "case", "call_stack", "json", "trace_json", "lbr_max_count",
                "symbolize", "metrics_port", "metrics_addr", "dry_run", "verbose", "version",
                "origins_interval"}  # no config key


def _sections() -> list[Section]:
    out = [TOP]
    out += [key.kind.section for _, _, key in walk(TOP) if key.kind.section is not None]
    return out


def _actions() -> dict[tuple[str, ...], argparse.Action]:
    return {tuple(d.action.option_strings): d.action for d in build_parser().declared}


def test_every_declared_flag_is_the_parsers_with_the_keys_default_help_and_range() -> None:
    actions, seen = _actions(), 0
    for section, key, flag in declared(tuple(_sections())):
        action = actions.get(flag.names)
        assert action is not None, f"{key.name}: {flag.names} is not a trace flag"
        assert (action.dest, action.default, action.help) == (flag.dest, default_of(section, key, flag),
                                                              help_of(key, flag)), flag.names
        if flag.action not in ("store_true", "store_false", "store_const"):
            assert isinstance(action.type, KeyType) and action.type.key is key, flag.names
            assert action.choices == (key.kind.choices if flag.parse is None else None), flag.names
        seen += 1
    assert seen > 30


def test_no_argument_sets_a_keys_setting_by_hand() -> None:
    """An argument whose dest is a declared flag's, or a key's name or field, is one the declarations made:
    writing such a flag by hand again fails here."""
    flags = {flag.names: (key, flag) for _, key, flag in declared(tuple(_sections()))}
    settings = {flag.dest for _, flag in flags.values()}
    for section in _sections():
        settings |= {k.name for k in section.keys} | {f for k in section.keys for f in k.fields}
    wrong = []
    for names, action in _actions().items():
        if action.dest in HAND_WRITTEN:
            assert action.dest not in settings, action.dest
            continue
        made = flags.get(names)
        if made is None or action.help != help_of(*made):
            wrong.append("/".join(names))
    assert wrong == []


def test_the_c_keys_of_config_keys_come_from_them() -> None:
    assert set(C_FROM_KEYS) == {"bpf.ringbuf-size", "bpf.sessions-size"}
    for name, (section, key, flag) in C_FROM_KEYS.items():
        assert C_HELP[name] == c_help(section, key, flag)
    assert parse(["-e", "f", "-C", "bpf.ringbuf-size=1M"], environ={}).config.limits.ringbuf_size == 1 << 20


@pytest.mark.parametrize(("flag", "yaml_text"), [
    (["-C", "bpf.sessions-size=0"], "limits: {max_sessions: 0}"),
    (["-C", "bpf.ringbuf-size=3G"], "limits: {ringbuf_size: 3G}"),
    (["-p", "0"], "probe_sets: [{name: a, entry: f, filters: {pids: [0]}}]"),
    (["-L", "-1"], "probe_sets: [{name: a, entry: f, filters: {min_duration_ms: -1}}]"),
    (["-L", "nan"], "probe_sets: [{name: a, entry: f, filters: {min_duration_ms: .nan}}]"),
    (["--probe-set", "a b"], "probe_sets: [{name: 'a b', entry: f}]"),
    (["--user-attach", "uretprobe"], "probe_sets: [{name: a, entry: f, user_attach_mode: uretprobe}]"),
    (["--web.listen-address", "9464"], "metrics: {listen: '9464'}"),
])
def test_a_flag_refuses_what_its_key_refuses(flag: list[str], yaml_text: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["-e", "f", *flag], environ={})
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    text = yaml_text if yaml_text.startswith("probe_sets") else f"probe_sets: [{{name: a, entry: f}}]\n{yaml_text}"
    with pytest.raises(ConfigError):
        parse_config(text)


def test_a_flag_sets_what_its_key_sets() -> None:
    ps = parse(["-e", "f", "-L", "2.5", "-p", "7", "--cgroup", "/g", "--probe-set", "mine", "--user-attach", "uprobe",
                "--fentries"], environ={}).config.probe_sets[0]
    cfg = parse_config("probe_sets: [{name: mine, entry: f, user_attach_mode: uprobe, attach_mode: fentry, "
                       "filters: {min_duration_ms: 2.5, pids: 7, cgroup: /g}}]\nexporter: {console: true}\n")
    mine = cfg.runtime.probe_sets[0]
    fields = ("name", "min_duration_ns", "pids", "cgroup", "user_attach_mode", "attach_mode")
    assert [getattr(ps, f) for f in fields] == [getattr(mine, f) for f in fields]


def test_a_new_keys_flag_needs_no_line_in_trace_flags() -> None:
    """A flag declared and not placed by trace/flags.py is added to its help group, and its value goes to the
    key's field: a new key with a flag touches its declaration, its consumer and its test."""
    from typing import NamedTuple

    from retsnoop_otel.inputs.numbers import COUNT
    from retsnoop_otel.runtime.config_flags import add_other_key_flags, field_values
    from retsnoop_otel.runtime.config_keys import Flag, Key, integer_in

    class Target(NamedTuple):
        depth: int = 3

    section = Section("s", Target, (Key("depth", integer_in(COUNT), "how deep", flag=Flag(("--depth",), "depth")),))
    parser = FlagParser()
    add_other_key_flags(parser, (section,))
    assert "settings of the agent file" in parser.groups
    assert Target(**field_values(parser.parse_args([]), section)) == Target()
    assert Target(**field_values(parser.parse_args(["--depth", "0x10"]), section)) == Target(16)
    with pytest.raises(SystemExit):
        parser.parse_args(["--depth", "0"])

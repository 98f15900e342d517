"""`trace`'s parser reads a long command line in chunks (command/flag_parser.py): whatever the words, the result
is the one argparse's single parse gives, and the cost grows with the words, not their square (issue 47.3)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retsnoop_otel.command.flag_parser import CHUNK_WORDS, chunks, joined_values, option_words
from retsnoop_otel.command.help_format import OneLineParser
from retsnoop_otel.trace.flags import build_parser

PARSER = build_parser()
# whole flags with their values, in the forms argparse reads: spelled out, attached, abbreviated; then bad ones
GOOD = [
    ["-e", "x"], ["-a", "y"], ["-d", "z"], ["--allow=w"], ["-aq"], ["--allo", "q"], ["-v"], ["-vv"], ["-T"],
    ["-S"], ["-F"], ["--fentries"], ["-x", "-ENOMEM"], ["-x", "ENOENT"], ["-X", "EPERM"], ["-p", "12"],
    ["-c", "bpf"], ["--json"], ["-s"], ["-ss"], ["-s", "none"], ["-B"], ["-B", "any"], ["stray"], ["-L", "5"],
    ["--otlp-protocol", "grpc"], ["-C", "x=1"], ["--metrics-port", "80"], ["-n", "bash"], ["-k", "/boot/vmlinux"],
    ["--dry-run"], ["-V"], ["--no-such-flag"],
]
BAD = [["-p", "abc"], ["-c", "nope"], ["-a"], ["-K"], ["--otlp-protocol", "carrier-pigeon"], ["-L", "-1"]]


def _outcome(parse) -> tuple:  # type: ignore[no-untyped-def]
    """(exit code or None, the namespace's values, the extra words) of one parse."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns, extra = parse()
    except SystemExit as exc:
        return exc.code, None, None
    return None, vars(ns), extra


def _whole(words: list[str]) -> tuple:
    names = frozenset(o for d in PARSER.declared if d.action.nargs is None for o in d.action.option_strings)
    return _outcome(lambda: OneLineParser.parse_known_args(PARSER, joined_values(words, names)))


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.sampled_from(GOOD), min_size=20, max_size=120), st.lists(st.sampled_from(BAD), max_size=1),
       st.integers(min_value=0), st.booleans())
def test_chunked_parse_is_the_single_parse(pieces: list[list[str]], bad: list[list[str]], where: int,
                                           dashdash: bool) -> None:
    """Same values or the same refusal; a bad piece (or -K beside -F) sometimes, anywhere."""
    for piece in bad:
        pieces.insert(where % (len(pieces) + 1), piece)
    words = [w for p in pieces for w in p] + (["--", "-a", "after"] if dashdash else [])
    chunked = _outcome(lambda: PARSER.parse_known_args(words))
    assert chunked == _whole(words), words


def test_a_long_line_is_cut_only_before_option_words() -> None:
    names, shorts = option_words(PARSER)
    words = ["-e", "x"] + ["-a", "-v"] * 100 + ["-J", "-a", "-x", "stray"] * 50 + ["--", "-a", "b"]
    runs = chunks(words, names, shorts)
    assert len(runs) > 3 and [w for r in runs for w in r] == words
    assert all(len(r) >= CHUNK_WORDS for r in runs[:-1])
    assert all(r[0] in names or r[0][:2] in shorts for r in runs[1:])
    assert runs[-1][-3:] == ["--", "-a", "b"]


def test_repeated_values_keep_their_order_and_defaults() -> None:
    words = ["-e", "first"] + [w for i in range(500) for w in ("-a", f"f{i}", "-v")] + ["-C", "k=1", "-K"]
    ns = PARSER.parse_args(words)
    assert ns.allow == [f"f{i}" for i in range(500)] and ns.entry == ["first"] and ns.verbose == 500
    assert ns.config == ["k=1"] and ns.attach_mode == "kprobe"
    assert ns.deny == [] and ns.calls is False  # untouched: their defaults, as one parse leaves them


def _stderr_of(words: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        build_parser().parse_args(words)
    return exc.value.code, err.getvalue()


def test_exclusive_flags_in_different_chunks_are_refused_as_one_parse_refuses_them() -> None:
    code, text = _stderr_of(["-e", "x", "-F"] + ["-a", "y"] * 200 + ["-K"])
    assert code == 2 and "not allowed with argument" in text and "-F/--fentries" in text and "-K/--kprobes" in text
    assert text.count("\n") == 1


def test_a_bad_value_deep_in_a_long_line_names_its_flag() -> None:
    code, text = _stderr_of(["-e", "x"] + ["-a", "y"] * 5000 + ["-p", "nope"])
    assert code == 2 and text.startswith("retsnoop-otel trace: argument -p/--pid:"), text


def test_words_after_a_long_line_are_unrecognized_once() -> None:
    code, text = _stderr_of(["-e", "x"] + ["-a", "y", "stray"] * 100)
    assert code == 2 and "unrecognized arguments: stray stray" in text and text.count("\n") == 1


def test_the_parser_keeps_what_it_declares() -> None:
    """Docs and tests read the declared arguments from the parser's records, never argparse's private lists."""
    titles = list(PARSER.groups)
    assert titles[:2] == ["function selection", "what to capture and show"] and "misc" in titles
    assert {d.group for d in PARSER.declared} <= set(titles) | {"options"}
    modes = next(m for m in PARSER.exclusive if any("--fentries" in a.option_strings for a in m))
    assert {a.dest for a in modes} == {"attach_mode"} and len(modes) >= 3
    assert isinstance(next(d.action for d in PARSER.declared if "-a" in d.action.option_strings), argparse.Action)

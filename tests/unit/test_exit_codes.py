"""The exit codes live in one place (command/errors.py): the documentation's table and --help are rendered from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from retsnoop_otel import cli
from retsnoop_otel.command.errors import (
    EXIT_CODES,
    EXIT_HOST,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    InputError,
    SetupError,
    exit_code_table,
)
from retsnoop_otel.trace.flags import build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "exit-codes.md"


def test_documented_table_is_the_rendered_one() -> None:
    block = re.search(r"<!-- exit-codes:[^\n]*-->\n(.*?)\n<!-- /exit-codes -->", PAGE.read_text(), re.S)
    assert block is not None, "docs/reference/exit-codes.md lost its exit-codes block"
    assert block.group(1) == exit_code_table(), "the documented exit codes differ from command/errors.py: run " \
        "python -m tests.gen_docs_reference"


def test_codes_are_distinct_and_the_refusals_use_them() -> None:
    codes = [c.code for c in EXIT_CODES]
    assert len(set(codes)) == len(codes) and codes == sorted(codes)
    assert (InputError("x").exit_code, SetupError("x").exit_code) == (EXIT_INPUT.code, EXIT_HOST.code) == (2, 1)


def test_help_ends_with_every_code(capsys) -> None:
    for text in (build_parser().format_help(), cli.build_parser().format_help()):
        flat = " ".join(text.split())
        assert all(f"{c.code} {c.short}" in flat for c in EXIT_CODES), text


def test_unknown_command_and_keyboard_interrupt_codes(monkeypatch, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["frobnicate"])
    assert info.value.code == EXIT_INPUT.code
    import retsnoop_otel.trace.main as trace_main

    def interrupted(*_a: object, **_k: object) -> int:
        raise KeyboardInterrupt
    monkeypatch.setattr(trace_main, "run_trace", interrupted)
    assert cli.main(["trace", "-e", "x"]) == EXIT_INTERRUPTED.code == 130

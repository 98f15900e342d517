"""The help formatter: argparse's layout and width, without the shutil import a start paid for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from retsnoop_otel.command.help_format import HelpFormatter, terminal_columns
from retsnoop_otel.trace.flags import build_parser


def test_building_the_trace_parser_imports_no_shutil() -> None:
    code = ("import sys\nfrom retsnoop_otel.trace.main import run_trace\nfrom retsnoop_otel.trace.flags import "
            "build_parser\nbuild_parser().parse_args(['-e', 'x'])\nprint('shutil' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("columns", [50, 100])
def test_help_wraps_at_the_columns_asked_for(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    text = build_parser().format_help()
    options = text[text.index("\n\n") + 2:]  # usage lines cannot break inside a [-x | -y] group
    widths = [len(line) for line in options.splitlines()]
    assert max(widths) <= columns - 2
    assert max(widths) > columns - 20  # filled up to the width, not wrapped at a default


def test_without_a_terminal_or_columns_the_width_is_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "__stdout__", None)
    assert terminal_columns() == 80
    monkeypatch.setenv("COLUMNS", "not a number")
    assert terminal_columns() == 80


def test_an_explicit_width_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert HelpFormatter("prog", width=40)._width == 40
    assert HelpFormatter("prog")._width == 198

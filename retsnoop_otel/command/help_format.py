"""argparse's help formatter, sized to the terminal without importing shutil.

argparse builds a formatter at every add_argument (to check its metavar), and a formatter given no
width asks shutil for the terminal's size. shutil imports bz2 and lzma: 0.28 s of an emulated `trace`
start in the VM (cProfile, 20 functions), where each module file is a round trip to the host.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NoReturn

from retsnoop_otel.command.errors import EXIT_INPUT

# a word of more than 80 characters not cut already (inputs.files.shown's: its length said after it)
_LONG_WORD = re.compile(r"(?<!\S)\S{81,}(?!\S)(?! \(\d+ characters\))")


def terminal_columns() -> int:
    """shutil.get_terminal_size()'s answer: $COLUMNS, else standard output's terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """The default formatter with its width (argparse's: the terminal's less 2) given up front."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         terminal_columns() - 2 if width is None else width)


def _cut(match: re.Match[str]) -> str:
    word = match.group(0)
    return f"{word[:80]}… ({len(word)} characters)"


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line (not argparse's usage block and a second line) that points at --help, with
    each over-long word of it cut (argparse quotes the whole value: a 100 kB flag value made a 100 kB line)."""

    def error(self, message: str) -> NoReturn:
        text = _LONG_WORD.sub(_cut, " ".join(message.split()))
        self.exit(EXIT_INPUT.code, f"{self.prog}: {text} (see {self.prog} --help)\n")

"""argparse's help formatter, sized to the terminal without importing shutil.

argparse builds a formatter at every add_argument (to check its metavar), and a formatter given no
width asks shutil for the terminal's size. shutil imports bz2 and lzma: 0.28 s of an emulated `trace`
start in the VM (cProfile, 20 functions), where each module file is a round trip to the host.
"""

from __future__ import annotations

import argparse
import os
import sys


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

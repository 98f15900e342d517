"""Fixtures of the fakes in tests/fakes.py that the unit tests share."""

from __future__ import annotations

import pytest

from retsnoop_otel.symbols.kallsyms import Kallsyms
from retsnoop_otel.symbols.symbolize import KallsymsSymbolizer
from tests.fakes import LBR_ROOT, World


@pytest.fixture()
def world() -> World:
    """A kernel world of its own for the test: `world.deps()` is what the runtime is given."""
    return World()


@pytest.fixture(scope="session")
def lbr_sym() -> KallsymsSymbolizer:
    """The symbolizer of the kernel the LBR records come from (LBR_ROOT's kallsyms)."""
    return KallsymsSymbolizer(Kallsyms.load(str(LBR_ROOT)))

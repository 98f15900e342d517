"""The shared integer and number readers (inputs/numbers)."""

from __future__ import annotations

import pytest

from retsnoop_otel.inputs.numbers import PID, IntRange, NumberError, parse_float, parse_int


def test_parse_int_within_the_range():
    assert parse_int("4194304", PID) == 4194304
    assert parse_int(" 7 ", PID) == 7
    assert parse_int("0x10", IntRange(1, 100), prefixes=True) == 16


@pytest.mark.parametrize("text", ["0", "4194305", "-3", "99999999999999999999", "9" * 100000])
def test_parse_int_out_of_range_names_value_and_range(text: str):
    with pytest.raises(NumberError) as exc:
        parse_int(text, PID)
    msg = str(exc.value)
    assert "between 1 and 4194304" in msg and "PID_MAX_LIMIT" in msg
    assert repr(text[:80])[:-1] in msg and len(msg) < 300


@pytest.mark.parametrize("text", ["", "x", "1.5", "0x10", "1e3", "--1"])
def test_parse_int_not_an_integer(text: str):
    with pytest.raises(NumberError, match="expected an integer between 1 and 4194304"):
        parse_int(text, PID)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0", "-1", "1e400", "x"])
def test_parse_float_refuses_non_finite_and_out_of_range(text: str):
    with pytest.raises(NumberError, match=f"got '{text}'"):
        parse_float(text, 0, 1000, "milliseconds")
    assert parse_float("2.5", 0, 1000, "milliseconds") == 2.5

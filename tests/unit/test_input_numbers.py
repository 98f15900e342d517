"""The shared integer and number readers (inputs/numbers)."""

from __future__ import annotations

import pytest

from retsnoop_otel.inputs.numbers import PID, RINGBUF_BYTES, IntRange, NumberError, parse_float, parse_int, parse_size


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


@pytest.mark.parametrize("text", ["nan", "inf", "0.09", "-1", "86400.5", "1e400"])
def test_parse_float_closed_includes_its_bounds_only(text: str):
    with pytest.raises(NumberError, match=f"from 0.1 to 86400, got '{text}'"):
        parse_float(text, 0.1, 86400, "seconds", closed=True)
    assert [parse_float(t, 0.1, 86400, "seconds", closed=True) for t in ("0.1", "86400")] == [0.1, 86400]


@pytest.mark.parametrize(("text", "value"), [("8M", 8 << 20), ("16MiB", 16 << 20), ("512k", 512 << 10),
                                             (" 4096 ", 4096), ("0x1000", 4096), ("2G", 2 << 30), ("1 KB", 1024)])
def test_sizes_in_the_forms_the_config_and_the_flags_take(text: str, value: int) -> None:
    assert parse_size(text, RINGBUF_BYTES) == value


@pytest.mark.parametrize(("text", "problem"), [
    ("lots", "expected a size in bytes such as 8388608 or 8M, got 'lots'"),
    ("3T", "expected a size in bytes such as 8388608 or 8M, got '3T'"),
    ("4G", "must be a size in bytes between 1 and 2147483648 (bytes of a BPF ring buffer, at most 2 GiB), got '4G'"),
    ("0", "must be a size in bytes between 1 and 2147483648"),
    ("9" * 500, "(500 characters)")])
def test_sizes_refused_name_the_value_and_the_range(text: str, problem: str) -> None:
    with pytest.raises(NumberError) as info:
        parse_size(text, RINGBUF_BYTES)
    assert problem in str(info.value) and len(str(info.value)) < 200, str(info.value)

import time

import pytest

from retsnoop_otel.capture.clock import ClockOffset, measure_boot_to_wall_offset, measure_clock_offset


def scripted(values):
    it = iter(values)
    return lambda: next(it)


def test_tightest_bracket_wins():
    # sample 1: realtime 1000..1100 around boot 10 (width 100); sample 2: 5000..5004 around boot 20 (width 4)
    realtime = scripted([1000, 1100, 5000, 5004, 9000, 9050])
    boottime = scripted([10, 20, 30])
    off = measure_clock_offset(3, realtime, boottime)
    assert off == ClockOffset(offset_ns=5002 - 20, measured_at=20, uncertainty_ns=4)


def test_backwards_wall_clock_samples_are_ignored():
    realtime = scripted([2000, 1000, 3000, 3010])  # first sample: clock stepped back mid-read
    boottime = scripted([5, 7])
    assert measure_boot_to_wall_offset(2, realtime, boottime) == 3005 - 7


def test_all_samples_bad_is_an_error():
    with pytest.raises(RuntimeError, match="backwards"):
        measure_clock_offset(1, scripted([10, 5]), scripted([1]))
    with pytest.raises(ValueError):
        measure_clock_offset(0)


def test_real_clocks_agree_with_time_time():
    off = measure_clock_offset()
    wall = time.clock_gettime_ns(time.CLOCK_BOOTTIME) + off.offset_ns
    assert abs(wall - time.time_ns()) < 50_000_000  # 50 ms: generous for a loaded CI machine
    assert off.uncertainty_ns >= 0

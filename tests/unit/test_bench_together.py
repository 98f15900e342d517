"""bench/together_cost.py's report: rounds measured with both tools attached, grouped by mode and order."""

import math

from bench.together_cost import Round, table


def _round(mode: str, order: str, n: int, ours: float, peer: float) -> Round:
    return Round(mode, "1000", order, n, 1324, 2648, 90_000.0, ours, peer, 12.7, 12.3)


def test_each_order_has_its_row_and_the_mode_its_median_over_both() -> None:
    rounds = [_round("kprobe", "ours-first", 1, 900, 1000), _round("kprobe", "ours-first", 2, 1100, 1000),
              _round("kprobe", "peer-first", 1, 800, 1000), _round("fentry", "ours-first", 1, 3000, 1000)]
    text = table(rounds, "bpftrace", 2000)
    rows = [line for line in text.splitlines() if line.startswith("| kprobe") or line.startswith("| fentry")]
    assert rows == [
        "| kprobe | 1000 | 1324 / 2648 | ours-first | 2 | 1,000 | 1,000 | 0.90x, 1.10x | 12.7 / 12.3 |",
        "| kprobe | 1000 | 1324 / 2648 | peer-first | 1 | 800 | 1,000 | 0.80x | 12.7 / 12.3 |",
        "| fentry | 1000 | 1324 / 2648 | ours-first | 1 | 3,000 | 1,000 | 3.00x | 12.7 / 12.3 |",
    ]
    assert "- kprobe 1000: median ratio 0.90x over 3 rounds (range 0.80-1.10x)" in text
    assert "- fentry 1000: median ratio 3.00x over 1 round (range 3.00-3.00x)" in text
    assert "ours / bpftrace" in text


def test_a_peer_without_bpf_time_gives_no_ratio() -> None:
    assert math.isnan(_round("kprobe", "ours-first", 1, 900, 0).ratio)

"""`python -m bench.probe_cost --together`: which runs it pairs, and its report over both attach orders."""

import pytest

from bench.probe_cost import parse_spec, together_table


def _row(order: str, ratio: float) -> dict:
    return {"mode": "kprobe", "size": 20, "variant": "full vs bare", "order": order, "round": 1,
            "bpf_ns_per_call": round(1000 * ratio), "other_bpf_ns_per_call": 1000, "ratio": ratio}


def test_specs_name_a_variant_of_our_programs_and_optionally_a_build(tmp_path) -> None:
    assert parse_spec("full") == ("full", None)
    assert parse_spec(f"bare@{tmp_path}/base.bpf.o") == ("bare", tmp_path / "base.bpf.o")
    with pytest.raises(ValueError, match="'cookie'"):
        parse_spec("cookie")  # a bench-only variant program, not ours
    with pytest.raises(ValueError, match="'full_live'"):
        parse_spec("full_live")


def test_the_ratio_is_the_geometric_mean_over_both_orders() -> None:
    # being attached first costs x1.2: 1.2 one way round and 1/1.2 the other is no difference at all
    text = together_table([_row("this-first", 1.2), _row("other-first", 1 / 1.2)])
    row = text.splitlines()[-1]
    assert row.split()[:5] == ["kprobe", "20", "full", "vs", "bare"]
    assert "1.00x: 1.20, 0.83" in row

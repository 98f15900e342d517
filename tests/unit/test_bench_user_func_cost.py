"""`python -m bench.user_func_cost`: its medians over rounds, the wall time it adds against the same round's
nothing-attached run, and the pairs it compares."""

from bench.user_func_cost import comparisons, ratio, summarize, table


def _run(rnd: int, row: str, workload: str, wall: float, bpf: float | None = None, runs: float = 8.0) -> dict:
    out = {"round": rnd, "row": row, "workload": workload, "calls": 1000, "wall_ns_per_call": wall}
    if bpf is not None:
        out |= {"bpf_ns_per_call": bpf, "ns_per_run": bpf / runs, "runs_per_call": runs, "sessions_per_call": 1.0}
    return out


def test_the_added_time_is_against_the_same_round_without_probes() -> None:
    # round 2 runs twice as slow throughout (a guest's drift): against its own baseline it adds the same 1,000 ns
    lines = summarize([_run(1, "none", "chain", 10), _run(1, "user uprobe_session", "chain", 1010, 800),
                       _run(2, "none", "chain", 5000), _run(2, "user uprobe_session", "chain", 6000, 900),
                       _run(3, "none", "chain", 10), _run(3, "user uprobe_session", "chain", 1110, 1000)])
    (line,) = lines
    assert line["row"] == "user uprobe_session" and line["rounds"] == 3
    assert line["added_ns"] == 1000 and line["base_ns"] == 10
    assert line["bpf_ns_per_call"] == 900 and line["runs_per_call"] == 8.0


def test_user_sessions_are_compared_with_each_kernel_row_and_the_modes_with_uprobe_session() -> None:
    results = [_run(1, "none", w, 100) for w in ("chain", "inner", "syscall")]
    results += [_run(1, "user uprobe_session", "chain", 2100, 1000),
                _run(1, "user uprobe_session", "inner", 600, 150, 3),
                _run(1, "user uprobe_multi", "inner", 1100, 300, 6),
                _run(1, "kernel kprobe_session", "syscall", 1100, 2000)]
    lines = summarize(results)
    pairs = comparisons(lines, "uprobe_session", ["kernel kprobe_session", "kernel fsession"])
    assert [(r["a"], r["b"]) for r in pairs] == [
        (("user uprobe_session", "chain"), ("kernel kprobe_session", "syscall")),
        (("user uprobe_multi", "inner"), ("user uprobe_session", "inner"))]  # rows not measured are left out
    assert pairs[0]["added"] == 2.0 and pairs[0]["bpf_per_call"] == 0.5 and pairs[0]["per_run"] == 0.5
    assert pairs[1]["added"] == 2.0 and pairs[1]["bpf_per_call"] == 2.0 and pairs[1]["per_run"] == 1.0
    assert ratio(lines, ("user uprobe", "chain"), ("user uprobe_session", "chain")) is None
    assert "user uprobe_multi" in table(lines).splitlines()[3]

"""bench/kprofile.py: bpftrace's kstack printout folded per function (the bench's --profile report)."""

from bench.kprofile import USER, fold, frame_name, parse_stacks, script

# What bpftrace 0.17 prints at exit for `@[kstack(16)] = count()` (trimmed frames, real shapes)
PRINTOUT = """\
Attaching 2 probes...
READY


@[]: 5
@[
    ftrace_ops_trampoline+62
    is_ftrace_trampoline+13
    __kernel_text_address+38
    unwind_get_return_address+26
    perf_callchain_kernel+139
    get_perf_callchain+383
    bpf_get_stack_raw_tp+123
    bpf_prog_2b4bc1c8e7cd8d8e_fexit_inner+1131
    bpf_trampoline_6442501234+95
    array_map_alloc_check+5
]: 30
@[
    ftrace_ops_trampoline+70
    orc_ftrace_find+23
    unwind_next_frame+1122
    perf_callchain_kernel+170
    get_perf_callchain+383
    bpf_get_stack_raw_tp+123
    bpf_prog_2b4bc1c8e7cd8d8e_fexit_inner+1131
    bpf_trampoline_6442501234+95
]: 15
@[
    htab_lru_map_lookup_elem+12
    bpf_prog_91aa0c2f1b5a7e3d_fentry_inner+88
    bpf_trampoline_6442507777+62
    map_create+9
]: 50
"""


def test_each_stack_comes_back_leaf_first_with_its_count():
    stacks = parse_stacks(PRINTOUT)
    assert [n for _, n in stacks] == [5, 30, 15, 50]
    assert stacks[0][0] == []
    assert stacks[1][0][:3] == ["ftrace_ops_trampoline", "is_ftrace_trampoline", "__kernel_text_address"]
    assert stacks[1][0][-3:] == ["bpf_prog_fexit_inner", "bpf_trampoline", "array_map_alloc_check"]


def test_names_drop_offsets_program_tags_and_trampoline_ids():
    assert frame_name("  unwind_next_frame+1122 ") == "unwind_next_frame"
    assert frame_name("bpf_prog_2b4bc1c8e7cd8d8e_fexit_inner+1131") == "bpf_prog_fexit_inner"
    assert frame_name("bpf_trampoline_6442501234+95") == "bpf_trampoline"
    assert frame_name("bpf_prog_active") == "bpf_prog_active"  # not a program: no 16-digit tag


def test_shares_count_a_function_once_per_stack_and_user_samples_as_user():
    p = fold(parse_stacks(PRINTOUT))
    assert p.samples == 100
    self_share = dict(p.self_share)
    total = dict(p.total_share)
    assert self_share["ftrace_ops_trampoline"] == 0.45
    assert self_share["htab_lru_map_lookup_elem"] == 0.5
    assert self_share[USER] == 0.05 and total[USER] == 0.05
    assert total["get_perf_callchain"] == 0.45
    assert total["bpf_trampoline"] == 0.95
    assert p.self_share[0] == ("htab_lru_map_lookup_elem", 0.5)  # largest first
    assert fold([]).samples == 0 and fold([]).total_share == []


def test_the_sampler_is_filtered_to_the_workloads_cpu_and_command():
    assert "profile:hz:999 /cpu == 0 && comm == \"bpf_fail_loop\"/ { @[kstack(16)] = count(); }" in script(
        999, 0, "bpf_fail_loop")
    assert "profile:hz:99 { @[kstack(16)] = count(); }" in script(99, -1, "")

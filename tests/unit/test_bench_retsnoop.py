"""Upstream retsnoop as a peer of bench/peer_compare.py and bench/start_compare.py: finding its binary, its
command line, the one function set every tool attaches, and the reports."""

import os

import pytest

from bench import harness
from bench import peer_compare as pc
from bench import start_compare as sc

DRY_RUN = """\
Discovered 61123 available kprobes, filtered down to 9, and compacted to 8 unique names!
Found function '__x64_sys_bpf' at address 0xffffffff81385a50...
Found function '__sys_bpf' at address 0xffffffff81383f10...
Found function 'map_create' at address 0xffffffff81381d20...
Found function 'array_map_alloc_check' at address 0xffffffff8139b1e0...
Found function 'bpf_sys_bpf' at address 0xffffffff81385b10...
Found function 'kvm_arch_vcpu_ioctl [kvm]' at address 0xffffffffc0a01230...
Found function 'dup_name' at address 0xffffffff81000010...
Found function 'dup_name' at address 0xffffffff81000020...
Function 'bpf_log' has prototype incompatible with fentry/fexit, skipping.
Found 8 attachable functions in total.
"""


def test_the_dry_run_names_what_retsnoop_would_attach_once_per_name() -> None:
    assert harness.parse_retsnoop_dry_run(DRY_RUN) == {"__x64_sys_bpf", "__sys_bpf", "map_create", "bpf_sys_bpf",
                                                  "array_map_alloc_check", "kvm_arch_vcpu_ioctl", "dup_name"}
    assert harness.parse_retsnoop_dry_run("Receiving data...\n") == set()


def test_every_tool_gets_the_names_both_take_and_denies_what_only_it_would() -> None:
    ours = ["__sys_bpf", "__x64_sys_bpf", "map_create", "bpf_ringbuf_reserve"]  # ours denies its helpers
    retsnoop = {"__sys_bpf", "__x64_sys_bpf", "map_create", "bpf_sys_bpf"}
    same = harness.SameSet.of(ours, retsnoop, ["bpf_obj_free_fields"])
    assert same.names == ["__sys_bpf", "__x64_sys_bpf", "map_create"]
    assert same.ours_deny == ["bpf_obj_free_fields", "bpf_ringbuf_reserve"]
    assert same.retsnoop_deny == ["bpf_obj_free_fields", "bpf_sys_bpf"]
    # no retsnoop among the peers: our set, the user's denies
    alone = harness.SameSet.of(ours, None, ["x"])
    assert alone.names == sorted(ours) and alone.ours_deny == alone.retsnoop_deny == ["x"]


def test_what_one_tool_could_not_attach_after_all_is_denied_to_the_others() -> None:
    same = harness.SameSet.of(["a", "b", "c"], {"a", "b", "c", "d"}).narrowed(["a", "c", "zzz"])
    assert same.names == ["a", "c"]
    assert same.ours_deny == ["b"] and same.retsnoop_deny == ["d", "b"]


def test_retsnoop_runs_in_its_nearest_mode_without_dwarf() -> None:
    cmd = harness.retsnoop_command("/opt/retsnoop", "kprobe_session", ["*sys_bpf"], ["map_*"], ["bpf_sys_bpf"])
    assert cmd == ["/opt/retsnoop", "-v", "-M", "-sn", "-e", "*sys_bpf", "-a", "map_*", "-d", "bpf_sys_bpf"]
    assert harness.retsnoop_command("r", "fsession", ["e"], [])[2] == "-F"
    assert harness.retsnoop_command("r", "fsession_multi", ["e"], [])[2] == "-M"
    assert harness.retsnoop_command("r", "kprobe", ["e"], [], verbosity=3, dry_run=True) == [
        "r", "-vvv", "-K", "-sn", "--dry-run", "-e", "e"]
    assert {harness.NEAREST[m] for m in harness.NEAREST} <= set(harness.RETSNOOP_FLAGS)


def test_bpftrace_gets_its_nearest_mode_too() -> None:
    assert "kfunc:map_create" in harness.bpftrace_program("fsession", ["*sys_bpf"], [], ["map_create"])
    assert "kprobe:*sys_bpf" in harness.bpftrace_program("fsession_multi", ["*sys_bpf"], [], ["__sys_bpf"])


def test_the_binary_comes_from_the_flag_or_the_environment_and_its_absence_says_how_to_build_it(tmp_path) -> None:
    exe = tmp_path / "retsnoop"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert harness.retsnoop_bin(None, {harness.RETSNOOP_ENV: str(exe)}) == exe
    assert harness.retsnoop_bin(str(exe), {}) == exe
    with pytest.raises(ValueError, match="Compared with retsnoop.*--retsnoop-bin PATH or RETSNOOP_BIN"):
        harness.retsnoop_bin(None, {})
    (tmp_path / "plain").write_text("")
    os.chmod(tmp_path / "plain", 0o644)
    with pytest.raises(ValueError, match="not an executable file"):
        harness.retsnoop_bin(tmp_path / "plain", {})


def _run(tool: str, mode: str, peer_mode: str = "", **kw) -> pc.Run:
    return pc.Run(tool, mode, "1000", peer_mode=peer_mode, **kw)


def test_the_retsnoop_table_puts_ours_over_retsnoop_in_each_cell() -> None:
    ours = _run("ours", "kprobe_session", hooked=1000, start_s=12.0, load_attach_s=0.5, attach_s=0.2, detach_s=0.3,
                bpf_ns_per_call=3000.0, probe_runs_per_call=8.0, ns_per_call=90_000.0)
    rs = _run("retsnoop", "kprobe_session", "kprobe_multi", hooked=1000, start_s=4.0, load_attach_s=1.0,
              attach_s=0.4, detach_s=0.3, bpf_ns_per_call=6000.0, probe_runs_per_call=16.0, ns_per_call=95_000.0)
    text = pc.retsnoop_table([(ours, rs)], 30_000.0, "7.2.13", 2000)
    row = text.splitlines()[-1]
    assert row == ("| kprobe_session / -M | 1000 | 1,000 / 1,000 | 12.0 s / 4.00 s (3.00x) | 0.50 s / 1.00 s (0.50x) | "
                   "0.20 s / 0.40 s (0.50x) | 0.30 s / 0.30 s (1.00x) | 3,000 / 6,000 (0.50x) | 8.0 / 16.0 | "
                   "90.0 / 95.0 |")
    failed = _run("retsnoop", "fentry", "fentry", error="never ready: out: Failed to attach")
    text = pc.retsnoop_table([(_run("ours", "fentry"), failed)], 30_000.0, "7.2.13", 2000)
    assert "| fentry / -F | 1000 | 0 / 0 | - / - (-) |" in text
    assert "retsnoop fentry 1000: never ready" in text


def test_start_ratios_take_python_out_for_bpftrace_and_keep_it_for_retsnoop() -> None:
    results = {
        ("kprobe_session", "ours"): [{"start": 6.0, "after_python": 4.0, "imports": 1.0, "stop": 0.5},
                                     {"start": 8.0, "after_python": 6.0, "imports": 1.0, "stop": 0.7},
                                     {"start": 7.0, "after_python": 5.0, "imports": 1.0}],
        ("kprobe_session", "bpftrace"): [{"start": 5.0}, {"start": 5.0}, {"start": 5.0}],
        ("kprobe_session", "retsnoop"): [{"start": 3.5, "stop": 0.2}, {}, {"start": 3.5}],  # a failed start: left out
    }
    rows = sc.start_table(results, ["kprobe_session"], ["ours", "bpftrace", "retsnoop"]).splitlines()
    assert rows[2] == "| kprobe_session | ours | 7.00 | 5.00 | 1.00 | 4.00 | 1.00x | 2.00x | 600 ms | 3.00x |"
    assert rows[3] == "| kprobe_session | bpftrace (kprobe_multi) | 5.00 | - | - | - | - | - | - | - |"
    assert rows[4] == "| kprobe_session | retsnoop (-M) | 3.50 | - | - | - | - | - | 200 ms | - |"
    no_peers = sc.start_table({("fentry", "ours"): [{"start": 2.0, "after_python": 1.0}]}, ["fentry"], ["ours"])
    assert no_peers.splitlines()[-1] == "| fentry | ours | 2.00 | 1.00 | - | 1.00 | - | - | - | - |"


def test_a_peer_run_serves_the_modes_of_ours_that_map_to_the_same_run() -> None:
    kprobes = harness.SameSet.of(["a", "b", "nobtf"], {"a", "b", "nobtf", "r"})
    btf_only = harness.SameSet.of(["a", "b"], {"a", "b", "nobtf", "r"})  # a trampoline mode of ours: BTF only
    key = harness.peer_run_key
    assert key("retsnoop", "kprobe_session", kprobes) == key("retsnoop", "kprobe_multi", kprobes)
    assert key("retsnoop", "fsession_multi", btf_only) != key("retsnoop", "kprobe_multi", kprobes)  # its -d differs
    assert key("bpftrace", "fsession_multi", btf_only) == key("bpftrace", "kprobe_session", kprobes)  # globs
    assert key("bpftrace", "fsession", btf_only) == key("bpftrace", "fentry", btf_only)
    assert key("bpftrace", "fentry", btf_only) != key("bpftrace", "kprobe", kprobes)

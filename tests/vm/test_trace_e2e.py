"""The trace command on the newest kernel: --dry-run, the kernel cache, a warm start's imports, -T and -A
(the capture in each attach mode, on every kernel: test_trace_modes.py)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.vm


def test_a_warm_start_imports_neither_dataclasses_nor_inspect(vm_batch) -> None:
    """dataclasses pulls inspect, ast, dis and tokenize: 0.5 s of a 3 s start under emulation, where start
    is compared with bpftrace's (README, "Compared with bpftrace"). The warm --dry-run goes through the
    start's phases up to discovery; what load and attach import is imported with the command's modules."""
    (warm,) = [run for run in vm_batch["trace_dry_run"]["runs"] if run["step"] == "warm"]
    # a self time can be negative: the kernel's tables are read on a thread beside the imports, and -X importtime
    # takes one module's self time off the time of whichever import was open last, in either thread
    imported = set(re.findall(r"^import time:\s+-?\d+ \|\s+\d+ \| *(\S+)$", warm["err"], re.M))
    assert {"retsnoop_otel.runtime.runtime", "retsnoop_otel.kernel.tracer", "retsnoop_otel.kernel.features",
            "retsnoop_otel.symbols.kernel_facts"} <= imported, warm["err"][:3000]
    assert not imported & {"dataclasses", "inspect"}, [x for x in warm["err"].splitlines()
                                                       if "dataclasses" in x or "inspect" in x]


def test_dry_run_lists_and_attaches_nothing(vm_batch) -> None:
    r = vm_batch["trace_dry_run"]
    assert r["rc"] == 0, r["err"]
    out = r["out"]
    m = re.search(r"^(\d+) functions are available for tracing; would attach (\d+) \((\d+) entry\) in (\w+) mode",
                  out, re.M)
    assert m and int(m.group(1)) > 10000 and int(m.group(3)) >= 1, out[:2000]
    entries = out.split("Entry functions:")[1].split("Other functions:")[0]
    assert re.search(r"^\s+__x64_sys_bpf\s+returns signed$", entries, re.M), out[:3000]
    others = out.split("Other functions:")[1].split("Skipped functions:")[0]
    assert re.search(r"^\s+array_map_alloc_check\s+returns int32$", others, re.M), out[:3000]
    assert not re.search(r"^\s+array_map_free\s", others, re.M)  # -d wins
    assert re.search(r"^\s+array_map_free\s+denied by 'array_map_free'$", out.split("Skipped functions:")[1],
                     re.M), out[-3000:]
    assert "Receiving data" not in out and r["progs_before"] == [] and r["progs_after"] == []


def test_retsnoop_cases_resolve_on_a_real_kernel(vm_batch) -> None:
    """-c bpf -c perf: retsnoop's preset globs find both subsystems' syscalls as entries and their functions."""
    (run,) = [run for run in vm_batch["trace_dry_run"]["runs"] if run["step"] == "cases"]
    assert run["rc"] == 0, run["err"][-2000:]
    m = re.search(r"would attach (\d+) \((\d+) entry\)", run["out"])
    assert m and int(m.group(1)) > 500, run["out"][:2000]
    entries = run["out"].split("Entry functions:")[1].split("Other functions:")[0]
    for name in ("__x64_sys_bpf", "__x64_sys_perf_event_open", "perf_ioctl"):
        assert re.search(rf"^\s+{name}\s", entries, re.M), entries[:3000]
    assert re.search(r"denied by 'bpf_lsm_\*'", run["out"]) or "bpf_lsm_" not in entries
    assert vm_batch["trace_dry_run"]["progs_after"] == []


def _phases(text: str) -> dict[str, str]:
    """-v phase lines: name -> detail."""
    return {m.group(1): m.group(3) or "" for m in re.finditer(r"^Phase (\S+): (\d+) ms(?: \((.*)\))?$", text, re.M)}


def test_dry_run_phases_and_the_kernel_cache(vm_batch) -> None:
    """-v says where start-up time went; a second run takes the kernel's symbols, BTF and feature probe
    answers from the cache, a module load makes it read the symbols again (BTF and the feature answers belong to
    the kernel build: still cached)."""
    runs = {run["step"]: run for run in vm_batch["trace_dry_run"]["runs"]}
    cold, warm = _phases(runs["cold"]["err"]), _phases(runs["warm"]["err"])
    assert list(cold) == ["python", "imports", "flags", "inputs", "btf", "features", "symbols", "discovery", "other",
                          "dry-run"], \
        runs["cold"]["err"][-3000:]
    assert "cached" not in cold["btf"] and "cached" not in cold["symbols"] and "cached" not in cold["features"]
    assert warm["btf"].endswith(", cached") and warm["symbols"].endswith(", cached"), warm
    assert re.fullmatch(r"kernel feature probes, read beside the imports in \d+ ms, cached", warm["features"]), warm
    assert runs["warm"]["rc"] == 0 and runs["warm"]["out"] == runs["cold"]["out"]  # the same functions found
    module = runs["module"]
    assert "skipped" not in module, module.get("skipped")
    after = _phases(module["err"])
    assert module["rc"] == 0 and after["btf"].endswith(", cached") and "cached" not in after["symbols"], after
    assert after["features"].endswith(", cached"), after  # the attach types this build knows
    for step in ("cold", "warm", "module", "reloaded", "another boot"):  # what the cache holds is what kallsyms says
        assert runs[step]["symbols_same"], (step, runs[step]["symbols_differ"])
        # read (or taken from the cache) on a thread from the command's first line, beside the imports
        phases = _phases(runs[step]["err"])
        beside = [p for p in ("btf", "features", "symbols") if re.search(r", read beside the imports in \d+ ms",
                                                                          phases[p])]
        assert beside == ["btf", "features", "symbols"], phases
    one = runs["one cpu"]  # pinned to one CPU: the run reads the symbols itself, finds the same, fills the cache
    phases = _phases(one["err"])
    assert one["rc"] == 0 and one["out"] == runs["cold"]["out"] and one["symbols_same"], one["err"][-2000:]
    assert list(phases) == list(cold) and not [p for p in phases.values() if "cached" in p], phases
    beside = [p for p in ("btf", "features", "symbols") if "read beside the imports" in phases[p]]
    assert beside == ["btf", "features"], phases  # the probes' waits still overlap the imports


def test_the_symbols_of_another_boot_or_a_reloaded_module_are_moved_not_read(vm_batch) -> None:
    """The same build with the same modules has the same symbols, moved: the kernel's by its KASLR offset, each
    module's by where it was loaded. A module reloaded elsewhere, and a cache entry rewritten as another boot
    (another boot id, the kernel's text and every module lower) are moved to match kallsyms exactly."""
    runs = {run["step"]: run for run in vm_batch["trace_dry_run"]["runs"]}
    reloaded, other = runs["reloaded"], runs["another boot"]
    assert reloaded["reload_rc"] == 0 and reloaded["dummy_moved_by"], reloaded
    assert reloaded["rc"] == 0 and _phases(reloaded["err"])["symbols"].endswith(", cached at another boot, moved")
    assert reloaded["out"] == runs["module"]["out"]  # the same functions found (dummy's among them)
    # the rewritten entry: Debian's modules carry build-ids, so a rebuilt module would be told apart
    assert other["rewritten"]["anchor"] in ("_text", "_stext") and "dummy" in other["rewritten"]["modules"]
    assert len(other["rewritten"]["build_ids"]) == len(other["rewritten"]["modules"]), other["rewritten"]
    assert other["rc"] == 0 and _phases(other["err"])["symbols"].endswith(", cached at another boot, moved")
    assert other["out"] == runs["module"]["out"] and other["symbols_source"] == "cached"
    assert other["symbols_same"] and "dummy" in other["symbols_modules"], other["symbols_differ"]


def test_call_table_and_arguments(vm_batch) -> None:
    r = vm_batch["trace_calls_args"]
    out = r["output"]
    assert r["started"] and r["rc"] == 0, out
    assert re.search(r"^→ __x64_sys_bpf\s+regs=&\{", out, re.M), out  # its one argument, in the CONTEXT column
    assert re.search(r"^← __x64_sys_bpf\s+\[-EINVAL\]\s+\d+\.\d{3}us$", out, re.M), out
    # -A: the union bpf_attr * of map creation, decoded with BTF, in the CONTEXT column (args.fmt-mode=compact)
    assert re.search(r"^FUNCTION CALLS\s+RESULT\s+DURATION  CONTEXT$", out, re.M), out
    assert re.search(r"^\s+↔ array_map_alloc_check\s+\[-EINVAL\]\s+\d+\.\d{3}us  "
                     r"attr=&\{map_type=2,key_size=4,value_size=4,max_entries=0,", out, re.M), out
    events = [e for e in r["trace_json"]["traceEvents"] if e["ph"] == "X"]
    names = [e["name"] for e in events]
    assert "array_map_alloc_check" in names and "__x64_sys_bpf" in names
    for e in events:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()


def test_multiline_arguments_and_stack_addresses(vm_batch) -> None:
    """-T -A -E -C args.fmt-mode=multiline -C stacks.emit-addrs=true: each argument on a line of its own under
    its call (retsnoop's `› name = value`, zero fields left out), and each stack frame's address first."""
    r = vm_batch["trace_calls_args"]["multiline"]
    out = r["output"]
    assert r["started"] and r["rc"] == 0, out
    assert re.search(r"^FUNCTION CALLS\s+RESULT\s+DURATION$", out, re.M), out  # no CONTEXT column
    m = re.search(r"^(\s+)↔ array_map_alloc_check\s+\[-EINVAL\].*\n\1  › attr = &\{map_type=2,key_size=4,"
                  r"value_size=4(,.*)?\}$", out, re.M)
    assert m and "max_entries=" not in (m.group(2) or ""), out
    # the stack under the table: address, then symbol+offset, for the callers of the failing function
    assert re.search(r"^\s+\d+us \[-EINVAL\]\s+ [0-9a-f]{16} __x64_sys_bpf\+0x[0-9a-f]+", out, re.M), out
    assert re.search(r"^\s+ [0-9a-f]{16} do_syscall_64\+0x[0-9a-f]+", out, re.M), out
    assert re.search(r"^!\s+\d+us \[-EINVAL\]\s{19,}array_map_alloc_check", out, re.M), out

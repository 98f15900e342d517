"""The capture in every attach mode on every kernel (issues 2, 30): one failing bpf() call seen as text, as OTLP
spans at a real receiver and as metrics; each mode the kernel lacks refused in one line; nothing left attached."""

from __future__ import annotations

import re

import pytest

from tests.otlp_json import PYTHON_EXE
from tests.otlp_json import spans as otlp_spans

pytestmark = [pytest.mark.vm, pytest.mark.kernels("all")]


def test_stack_printed_with_einval(vm_batch) -> None:
    r = vm_batch["trace_otlp_metrics"]
    assert r["simfail"]["rc"] == 0, r["simfail"]
    out = r["tracer_output"]
    assert "Receiving data..." in out
    header = re.search(r"^\d\d:\d\d:\d\d\.\d{6} -> \d\d:\d\d:\d\d\.\d{6} TID/PID (\d+)/(\d+) \(python/python\):$",
                       out, re.M)
    assert header, out
    # before 5.14 the unwinder cannot walk out of a kretprobe's trampoline: no stack, the chain alone (both marked)
    entry = r"\s+\d+us \[-EINVAL\]\s+__x64_sys_bpf\+0x[0-9a-f]+" if vm_batch.at_least(5, 14) else \
        r"!\s+\d+us \[-EINVAL\]\s+__x64_sys_bpf"
    assert re.search(rf"^{entry}$", out, re.M), out
    assert re.search(r"^!\s+\d+us \[-EINVAL\]\s+array_map_alloc_check$", out, re.M), out
    assert re.search(r"Detaching\.\.\. DONE in \d+ ms\.", out)


def test_one_otlp_trace_with_nested_error_spans(vm_batch) -> None:
    r = vm_batch["trace_otlp_metrics"]
    spans = otlp_spans(r["otlp"])
    roots = [s for s in spans if not s.get("parentSpanId") and s["attrs"].get("error.type") == "EINVAL"]
    assert len(roots) == 1, [(s["name"], s["attrs"].get("error.type")) for s in spans if not s.get("parentSpanId")]
    root = roots[0]
    assert root["name"] == "__x64_sys_bpf"
    assert root["attrs"]["process.executable.name"] == PYTHON_EXE
    assert root["status"]["code"] == "STATUS_CODE_ERROR"
    trace = [s for s in spans if s["traceId"] == root["traceId"]]
    by_id = {s["spanId"]: s for s in trace}
    leaf = [s for s in trace if s["name"] == "array_map_alloc_check"]
    assert len(leaf) == 1
    leaf = leaf[0]
    assert leaf["attrs"]["error.type"] == "EINVAL" and leaf["status"]["code"] == "STATUS_CODE_ERROR"
    # walk up: every span nests in its parent, and the chain ends at the root
    node = leaf
    while node.get("parentSpanId"):
        parent = by_id[node["parentSpanId"]]
        assert int(parent["startTimeUnixNano"]) <= int(node["startTimeUnixNano"])
        assert int(node["endTimeUnixNano"]) <= int(parent["endTimeUnixNano"])
        node = parent
    assert node is root
    # the traced process's service (its executable: simfail publishes no OTel process context)
    assert root["resource"]["service.name"] == root["attrs"]["process.executable.name"]
    assert root["resource"]["os.version"].startswith(vm_batch.series + ".")
    # kernel addresses stay out of exported data by default
    assert not re.search(r"0xffff[0-9a-f]{12}", str(trace))


def test_prometheus_counts_the_error(vm_batch) -> None:
    text = vm_batch["trace_otlp_metrics"]["metrics"]
    calls = re.search(r'^retsnoop_function_calls_total\{function="array_map_alloc_check",probe_set="default"\} '
                      r'(\d+)', text, re.M)
    errors = re.search(r'^retsnoop_function_errors_total\{error_type="EINVAL",function="array_map_alloc_check",'
                       r'probe_set="default"\} (\d+)', text, re.M)
    assert calls and float(calls.group(1)) >= 1, text
    assert errors and float(errors.group(1)) >= 1, text


def test_nothing_stays_attached_after_sigterm(vm_batch) -> None:
    r = vm_batch["trace_otlp_metrics"]
    assert r["progs_while_attached"], "our programs should be listed while attached"
    assert r["tracer_rc"] == 0
    assert r["progs_after"] == []


MODES = {"trace_fentry": "fentry", "trace_kprobe": "kprobe", "trace_kprobe_multi": "kprobe_multi",
         "trace_kprobe_session": "kprobe_session", "trace_fsession": "fsession",
         "trace_fsession_multi": "fsession_multi"}
TRAMPOLINE = ("fentry", "fsession", "fsession_multi")  # attached by BTF id: the kernel refuses variadic _printk


# mode -> (the first kernel that has it, why older ones refuse it)
MISSING = {"kprobe_multi": ((5, 18), "has no kprobe_multi (Linux 5.18+ needed)"),
           "kprobe_session": ((6, 10), "has no kprobe.session (Linux 6.10+ needed)"),
           "fsession": ((7, 0), "has no fsession (Linux 7.0+ needed)"),
           "fsession_multi": ((7, 2), "has no fsession.multi (Linux 7.2+ needed)"),
           "fentry": ((5, 19), "has no BPF cookies for fentry/fexit (Linux 5.19+ needed)")}


def _lacks(vm_batch, mode: str) -> str | None:
    """Why this kernel has no `mode` (the text after "this kernel"), or None where it has it."""
    if mode == "kprobe_multi" and vm_batch.series == "6.1":
        return "has no kprobe_multi (CONFIG_FPROBE is off)"  # Debian's 6.1 is built without fprobes
    if mode in MISSING and not vm_batch.at_least(*MISSING[mode][0]):
        return MISSING[mode][1]
    return None


def _refusal(vm_batch, mode: str) -> str | None:
    """The one line a kernel without `mode` answers with, or None where it has the mode."""
    why = _lacks(vm_batch, mode)
    if why is None:
        return None
    usable = [m for m in ("kprobe_session", "kprobe_multi", "fsession_multi", "fsession", "fentry", "kprobe")
              if _lacks(vm_batch, m) is None]
    names = {"fentry": "-F (fentry/fexit)", "kprobe": "-K (kprobes)", "kprobe_multi": "-M (kprobe_multi)",
             "kprobe_session": "--kprobe-session (kprobe.session)", "fsession": "--fsession (fsession)",
             "fsession_multi": "--fsession-multi (fsession.multi)"}
    return (f"retsnoop-otel: this kernel {why}, so {names[mode]} cannot be used here: use "
            f"{' or '.join(names[m] for m in usable)} instead, or leave the mode out to pick one automatically")


@pytest.mark.parametrize("scenario", list(MODES))
def test_attach_modes(vm_batch, scenario) -> None:
    r = vm_batch[scenario]
    refusal = _refusal(vm_batch, MODES[scenario])
    if refusal is not None:
        # a mode the kernel lacks: one line naming what is missing, since when, and what to use; exit 1
        assert not r["started"] and r["rc"] == 1, r["output"]
        (line,) = [x for x in r["output"].splitlines() if x.startswith("retsnoop-otel: ")]
        assert line == refusal, r["output"]
        assert "Traceback" not in r["output"] and r["progs_after"] == []
        return
    assert r["started"], r["output"]
    assert "HOST-LIBBPF-LOADS" not in r["output"]  # trace_kprobe: the system's libbpf was hidden from the tracer
    assert r["workload"]["rc"] == 0, r["workload"]
    assert re.search(r"^!\s+\d+us \[-EINVAL\]\s+array_map_alloc_check$", r["output"], re.M), r["output"]
    # -v says which attach mode was used and how long attaching took
    assert re.search(rf"^Using attach mode {MODES[scenario]}$", r["output"], re.M), r["output"][:3000]
    assert re.search(r"^Successfully attached \d+ functions in \d+ ms\.$", r["output"], re.M), r["output"][:3000]
    # -v: one line per start-up phase before "Receiving data...", the shutdown's after "Detaching..."
    phases = re.findall(r"^Phase (\S+): \d+ ms", r["output"], re.M)
    assert phases == ["python", "imports", "flags", "inputs", "btf", "features", "symbols", "discovery", "load",
                      "attach", "outputs", "other", "ready", "detach", "drain", "flush"], r["output"][:3000]
    # fentry's attach also says how much of it was the kernel verifying a program pair per function (fsession: one)
    per_function = {"fentry": "a program pair", "fsession": "a program"}.get(MODES[scenario])
    verified = rf", [\d.]+ s of it verifying {per_function} per function" if per_function else ""
    assert re.search(rf"^Phase attach: \d+ ms \(\d+ functions, {MODES[scenario]}{verified}\)$", r["output"], re.M), \
        r["output"][:3000]
    if MODES[scenario] in TRAMPOLINE:  # a function the kernel refuses fails alone, even the templates' first target
        assert re.search(r"^Failed to attach _printk: .+", r["output"], re.M), r["output"][:3000]
        assert "could not" not in r["output"] and "Traceback" not in r["output"], r["output"][:3000]
    # trace_kprobe is stopped with SIGINT (Ctrl-C), the others with SIGTERM: both detach cleanly
    assert re.search(r"Detaching\.\.\. DONE in \d+ ms\.", r["output"]), r["output"][-2000:]
    assert r["rc"] == 0 and r["progs_after"] == []



"""Injected probes (-J, issue 35) on a real kernel, 6.12 and the newest: `tp:syscalls:sys_exit_bpf` and a kprobe at an
offset inside a traced function, in the session where each fired, in the -T text, --json, Perfetto and OTLP span
events at a real receiver; a refused offset is exit 2 with one message and nothing attached (guest side:
tests/vm/scenarios/inject.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.otlp_json import attributes
from tests.otlp_json import spans as otlp_spans

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.12", "newest")]
FUNC = "array_map_alloc_check"


def _facts(vm_batch) -> dict:
    r = vm_batch["inject_probes"]
    assert r["exit_entry"], f"no traceable function of the syscall exit work: sys_exit_bpf has no session ({r})"
    assert r["good"] and r["bad"], (r["accepted"], r["refused"])
    return r


def test_the_kprobe_offset_is_an_instruction_boundary_the_kernel_found(vm_batch) -> None:
    r = _facts(vm_batch)
    assert r["good"] > 4 and r["good"] in r["accepted"] and r["bad"] in r["refused"]
    assert r["kprobe"] == f"kprobe:{FUNC}+0x{r['good']:x}"


def test_dry_run_lists_the_injected_probes(vm_batch) -> None:
    r = _facts(vm_batch)["dry_run"]
    assert r["rc"] == 0, r["err"][-2000:]
    assert "Would inject 2 probes:" in r["out"], r["out"][-2000:]
    assert "◎ tp:syscalls:sys_exit_bpf" in r["out"] and f"◎ kprobe:{FUNC}+0x" in r["out"]


def _sessions(text: str) -> list[str]:
    """The -T sessions of the output, each from its header line to the next."""
    return re.split(r"^(?=\d\d:\d\d:\d\d\.\d{6} -> )", text, flags=re.M)[1:]


def test_text_shows_each_probe_in_the_session_and_at_the_depth_it_fired(vm_batch) -> None:
    r = _facts(vm_batch)
    run = r["text"]
    assert run["started"] and run["rc"] == 0 and run["workload"]["rc"] == 0, run["output"][-3000:]
    assert run["progs_while_attached"] and run["progs_after"] == []
    sessions = _sessions(run["output"])
    bpf = [s for s in sessions if re.search(r"^→ __x64_sys_bpf", s, re.M)]
    assert len(bpf) == 1, run["output"][-4000:]
    # the kprobe fired inside array_map_alloc_check: one level under it, between its entry and exit
    kp = re.escape(r["kprobe"])
    m = re.search(rf"^( +)→ {FUNC}\s*\n\1    ◎ {kp}  ip=0x[0-9a-f]+\s*\n\1← {FUNC}\s+\[-EINVAL\]", bpf[0], re.M)
    assert m, bpf[0]
    # the tracepoint fired in the syscall's exit work, after __x64_sys_bpf returned: in that session, with the
    # failing call's result by its field name
    exits = [s for s in sessions if "◎ tp:syscalls:sys_exit_bpf" in s]
    assert len(exits) == 1, run["output"][-4000:]
    entry = re.escape(r["exit_entry"])
    assert re.search(rf"^→ {entry}\s*\n(    .*\n)*    ◎ tp:syscalls:sys_exit_bpf  __syscall_nr=321  ret=-22\s*\n"
                     rf"(    .*\n)*← {entry}", exits[0], re.M), exits[0]
    assert "tp:syscalls:sys_exit_bpf" not in bpf[0]


def test_json_lists_the_probes_with_the_function_they_fired_in(vm_batch) -> None:
    r = _facts(vm_batch)
    run = r["json"]
    assert run["started"] and run["rc"] == 0, run["output"][-3000:]
    objs = [json.loads(line) for line in run["output"].splitlines() if line.startswith("{")]
    probes = [p for o in objs for p in o.get("probes", [])]
    kp = [p for p in probes if p["kind"] == "kprobe"]
    tp = [p for p in probes if p["kind"] == "tp"]
    assert len(kp) == 1 and len(tp) == 1, probes
    # one level under array_map_alloc_check, wherever the traced functions put it (__sys_bpf is one of them)
    indent = re.search(rf"^( *)→ {FUNC}$", r["text"]["output"], re.M)
    assert indent, r["text"]["output"][-3000:]
    assert kp[0]["probe"] == r["kprobe"] and kp[0]["function"] == FUNC
    assert kp[0]["depth"] == len(indent.group(1)) // 4 + 1
    assert tp[0] == {**tp[0], "probe": "tp:syscalls:sys_exit_bpf", "function": r["exit_entry"], "depth": 1}
    assert tp[0]["fields"] == {"__syscall_nr": 321, "ret": -22}
    owner = next(o for o in objs if kp[0] in o.get("probes", []))
    assert owner["is_err"] and owner["chain"][0]["function"] == "__x64_sys_bpf"


def test_otlp_span_events_on_the_span_of_the_call_they_fired_in(vm_batch) -> None:
    r = _facts(vm_batch)
    spans = otlp_spans(r["otlp"])
    with_events = [(s, e) for s in spans for e in s.get("events", [])]
    kp = [(s, e) for s, e in with_events if e["name"] == r["kprobe"]]
    tp = [(s, e) for s, e in with_events if e["name"] == "tp:syscalls:sys_exit_bpf"]
    assert len(kp) == 1 and len(tp) == 1, [(s["name"], e["name"]) for s, e in with_events]
    span, event = kp[0]
    assert span["name"] == FUNC and span["attrs"]["error.type"] == "EINVAL"
    assert int(span["startTimeUnixNano"]) <= int(event["timeUnixNano"]) <= int(span["endTimeUnixNano"])
    attrs = attributes(event.get("attributes", []))
    assert attrs == {"retsnoop.probe.kind": "kprobe"}  # its ip is an address: not exported by default
    root = next(s for s in spans if s["trace"] == span["trace"] and not s.get("parent"))
    assert root["name"] == "__x64_sys_bpf"
    span, event = tp[0]
    assert span["name"] == r["exit_entry"] and not span.get("parent")  # the root span: the entry call
    assert attributes(event["attributes"]) == {"retsnoop.probe.kind": "tp", "__syscall_nr": 321, "ret": -22}


def test_perfetto_has_an_instant_event_per_probe(vm_batch) -> None:
    r = _facts(vm_batch)
    assert "trace_json_error" not in r, r.get("trace_json_error")
    events = [e for e in r["trace_json"]["traceEvents"] if e.get("cat") == "probe"]
    assert sorted(e["name"] for e in events) == sorted([r["kprobe"], "tp:syscalls:sys_exit_bpf"])
    assert all(e["ph"] == "i" for e in events)
    assert next(e for e in events if e["args"]["kind"] == "tp")["args"]["ret"] == -22


def test_kretprobe_and_raw_tracepoint_probes(vm_batch) -> None:
    """The other two kinds: the kretprobe's return value, the raw tracepoint's arguments (regs, ret) in the exit
    session of the failing bpf() call."""
    r = _facts(vm_batch)
    run = r["other_kinds"]
    assert run["started"] and run["rc"] == 0 and run["progs_after"] == [], run["output"][-3000:]
    objs = [json.loads(line) for line in run["output"].splitlines() if line.startswith("{")]
    probes = [p for o in objs for p in o.get("probes", [])]
    kret = [p for p in probes if p["kind"] == "kretprobe"]
    assert len(kret) == 1 and kret[0]["probe"] == f"kretprobe:{FUNC}" and kret[0]["fields"] == {"ret": -22}, probes
    raw = [p for p in probes if p["kind"] == "rawtp" and p["fields"].get("arg1") == -22 % (1 << 64)]
    assert raw and raw[0]["probe"] == "rawtp:sys_exit" and raw[0]["function"] == r["exit_entry"], probes
    assert set(raw[0]["fields"]) == {"arg0", "arg1"}  # sys_exit(struct pt_regs *regs, long ret)


def test_a_refused_offset_is_one_message_exit_2_and_nothing_attached(vm_batch) -> None:
    r = _facts(vm_batch)
    run = r["refused_run"]
    assert not run["started"] and run["rc"] == 2, run["output"][-3000:]
    line = f"kprobe:{FUNC}+0x{r['bad']:x}: the kernel refused offset 0x{r['bad']:x} (EILSEQ: not the start of an " \
           "instruction)"
    assert line in run["output"], run["output"][-3000:]
    assert [x for x in run["output"].splitlines() if x.startswith("retsnoop-otel:")] == \
        [x for x in run["output"].splitlines() if line in x]
    assert run["progs_after"] == []

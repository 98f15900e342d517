"""Injected probes (-J) in the kernel: resolve each spec against this kernel, turn on the programs of the kinds in
use, fill their payload sizes and attach one link per probe, its probe id as the BPF cookie (bpf/inject.bpf.h).

Every refusal is one sentence naming the probe and the fix (InjectError: the spec cannot work on this kernel;
InjectUnsupported: this kernel cannot tell probes apart). The tracer detaches everything when an attach fails.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from retsnoop_otel.capture.inject import InjectError, InjectSpec, ProbeInfo, TpFormat, read_format
from retsnoop_otel.kernel import libbpf as lb
from retsnoop_otel.kernel.libbpf_btf import (
    BTF_KIND_CONST,
    BTF_KIND_FUNC_PROTO,
    BTF_KIND_PTR,
    BTF_KIND_RESTRICT,
    BTF_KIND_TYPEDEF,
    BTF_KIND_VOLATILE,
)
from retsnoop_otel.kernel.mode_probes import HELPER_GET_ATTACH_COOKIE

PROGRAMS = {"kprobe": "inject_kprobe", "kretprobe": "inject_kretprobe", "tp": "inject_tp", "rawtp": "inject_rawtp"}
_MAX_RAWTP_ARGS = 12  # MAX_BPF_FUNC_ARGS
_QUALIFIERS = (BTF_KIND_TYPEDEF, BTF_KIND_VOLATILE, BTF_KIND_CONST, BTF_KIND_RESTRICT)  # what a pointer may hide under


class InjectUnsupported(RuntimeError):
    """This kernel cannot run a kind of injected probe (a host limit, not a wrong spec)."""


def _cookies(prog_type: int) -> bool:
    return lb.probe_helper(prog_type, HELPER_GET_ATTACH_COOKIE)


def check_kernel(specs: Sequence[InjectSpec], cookies: Callable[[int], bool] = _cookies) -> None:
    """Probe ids travel as BPF cookies: kprobes and tracepoints have them from Linux 5.15, raw tracepoints from
    6.10 (the kernel's helper check: bpf_get_attach_cookie() allowed in that program type)."""
    kinds = {s.kind for s in specs}
    if kinds & {"kprobe", "kretprobe", "tp"} and not cookies(lb.PROG_TYPE_KPROBE):
        raise InjectUnsupported("-J needs BPF cookies (Linux 5.15+) to tell injected probes apart; this kernel "
                                "has none: run without -J")
    if "rawtp" in kinds and not cookies(lb.PROG_TYPE_RAW_TRACEPOINT):
        raise InjectUnsupported("-J rawtp: needs raw tracepoint BPF cookies (Linux 6.10+), which this kernel lacks: "
                                "inject the tracepoint as tp:CATEGORY:NAME instead")


def rawtp_args(btf: Any, name: str) -> tuple[bool, ...] | None:
    """Which of a raw tracepoint's arguments are pointers, from the kernel BTF's `btf_trace_NAME` typedef (a
    pointer to the probe's prototype, whose first parameter is the tracepoint's private data); None: no such
    tracepoint."""
    tid = btf.find(f"btf_trace_{name}", BTF_KIND_TYPEDEF)
    if tid is None:
        return None
    t = btf.type_by_id(btf.type_by_id(tid).size_or_type)
    if t.kind != BTF_KIND_PTR:
        return None
    proto = btf.type_by_id(t.size_or_type)
    if proto.kind != BTF_KIND_FUNC_PROTO:
        return None
    out = []
    for ptid in btf.param_types(proto.id)[1:_MAX_RAWTP_ARGS + 1]:
        while ptid and btf.type_by_id(ptid).kind in _QUALIFIERS:
            ptid = btf.type_by_id(ptid).size_or_type
        out.append(bool(ptid) and btf.type_by_id(ptid).kind == BTF_KIND_PTR)
    return tuple(out)


def resolve(specs: Sequence[InjectSpec], tracefs: str | Path, by_name: Callable[[str], list[Any]],
            btf: Callable[[], Any], ret_kind: Callable[[str], Any] | None = None,
            formats: dict[tuple[str, str], TpFormat] | None = None) -> list[ProbeInfo]:
    """ProbeInfo per spec (id = position), checked against this kernel: tracepoint formats under `tracefs`,
    functions and their sizes by `by_name` (kallsyms' KSym list), raw tracepoints in the kernel BTF, how a
    kretprobe's value reads by `ret_kind` (capture.model.RetKind from BTF; unknown reads as a 32-bit int).
    `formats`: the tracepoint formats already read from this kernel, by (category, name); those read here are added."""
    out = []
    known: dict[tuple[str, str], TpFormat] = {} if formats is None else formats
    for i, spec in enumerate(specs):
        if spec.kind == "tp":
            key = (spec.category, spec.name)
            if key not in known:
                known[key] = read_format(tracefs, spec.category, spec.name)
            out.append(ProbeInfo(i, spec, fmt=known[key]))
            continue
        if spec.kind == "rawtp":
            kernel_btf = btf()
            args = rawtp_args(kernel_btf, spec.name) if kernel_btf is not None else None
            if args is None:
                raise InjectError(f"-J {spec.text}: no raw tracepoint '{spec.name}' in the kernel's BTF (no "
                                  f"btf_trace_{spec.name}); name a tracepoint without its category, as "
                                  "events/CATEGORY/NAME has it")
            out.append(ProbeInfo(i, spec, nargs=len(args), arg_addresses=args))
            continue
        syms = by_name(spec.name)
        if not syms:
            raise InjectError(f"-J {spec.text}: no kernel function '{spec.name}' in /proc/kallsyms; check the name "
                              "(modules must be loaded)")
        size = syms[0].size
        if spec.offset and size and spec.offset >= size:
            raise InjectError(f"-J {spec.text}: offset 0x{spec.offset:x} is past the end of {spec.name} ({size} "
                              f"bytes); give an offset inside the function")
        kind = getattr(ret_kind(spec.name), "value", "unknown") if ret_kind and spec.kind == "kretprobe" else ""
        out.append(ProbeInfo(i, spec, ret_int32=kind in ("int32", "unknown", "")))
    return out


def configure(obj: lb.BpfObject, probes: Sequence[ProbeInfo]) -> None:
    """Before load: only the programs of the kinds in use are loaded (none without -J)."""
    kinds = {p.spec.kind for p in probes}
    for kind, name in PROGRAMS.items():
        obj.program(name).set_autoload(kind in kinds)
    obj.map("inject_infos").set_max_entries(max(1, len(probes)))


def fill(obj: lb.BpfObject, probes: Sequence[ProbeInfo]) -> None:
    """After load: each probe's payload size, by its id."""
    infos = obj.map("inject_infos") if probes else None
    for p in probes:
        assert infos is not None
        infos.update(struct.pack("<I", p.id), struct.pack("<II", p.payload_size, 0))


def _refusal(spec: InjectSpec, exc: lb.LibbpfError) -> InjectError:
    err = exc.errno
    if spec.kind in ("kprobe", "kretprobe"):
        if err == errno.EILSEQ:
            return InjectError(f"-J {spec.text}: the kernel refused offset 0x{spec.offset:x} (EILSEQ: not the start "
                               f"of an instruction); pick an instruction boundary (objdump -d of vmlinux)")
        if err == errno.ENOENT:
            return InjectError(f"-J {spec.text}: the kernel has no probe point '{spec.name}'; check the name")
        return InjectError(f"-J {spec.text}: the kernel refused the probe ({errno.errorcode.get(err, err)}: kprobes "
                           f"are not allowed there, e.g. a notrace or blacklisted function); pick another point")
    where = f"tracepoint {spec.category}:{spec.name}" if spec.kind == "tp" else f"raw tracepoint {spec.name}"
    return InjectError(f"-J {spec.text}: the kernel refused to attach to the {where} "
                       f"({errno.errorcode.get(err, err)}); check that it exists")


def attach(obj: lb.BpfObject, probes: Sequence[ProbeInfo]) -> list[lb.Link]:
    """One link per probe; on a refusal the links made so far are destroyed and InjectError raised."""
    links: list[lb.Link] = []
    try:
        for p in probes:
            s, prog = p.spec, obj.program(PROGRAMS[p.spec.kind])
            try:
                if s.kind == "tp":
                    links.append(prog.attach_tracepoint(s.category, s.name, cookie=p.id))
                elif s.kind == "rawtp":
                    links.append(prog.attach_raw_tracepoint_cookie(s.name, p.id))
                else:
                    links.append(prog.attach_kprobe(s.name, retprobe=s.kind == "kretprobe", cookie=p.id,
                                                    offset=s.offset))
            except lb.LibbpfError as exc:
                raise _refusal(s, exc) from None
    except BaseException:
        detach(links)
        raise
    return links


def detach(links: list[lb.Link]) -> list[lb.Link]:
    """Destroys the links; returns the empty list the caller keeps."""
    for link in reversed(links):
        link.destroy()
    return []


def dry_run_lines(specs: Sequence[InjectSpec]) -> list[str]:
    """--dry-run: the injected probes that would be attached."""
    if not specs:
        return []
    return [f"Would inject {len(specs)} probes:", *(f"    ◎ {s.text}" for s in specs)]

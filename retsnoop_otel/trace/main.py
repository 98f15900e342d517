"""`retsnoop-otel trace`: discovery -> load -> attach -> poll -> sinks -> detach."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from retsnoop_otel import __version__
from retsnoop_otel.capture.errfilter import ErrorFilter
from retsnoop_otel.capture.model import Session, TracedFunc
from retsnoop_otel.kernel import libbpf as lb


class UsageError(Exception):
    """Bad input: one clear sentence for the user, exit code 2."""


class SetupError(Exception):
    """The environment cannot run the trace (privileges, kernel features): exit code 1."""


@dataclass
class TraceOptions:
    entry: list[str]
    allow: list[str]
    deny: list[str]
    mode: str | None
    calls: bool
    call_stack: bool
    success: bool
    json: bool
    dry_run: bool
    verbose: int
    errors: ErrorFilter
    pids: list[int]
    no_pids: list[int]
    comms: list[str]
    no_comms: list[str]
    min_duration_ns: int
    cgroup: str | None
    otlp_endpoint: str | None
    otlp_protocol: str | None
    export_addresses: bool
    metrics_port: int | None
    metrics_addr: str
    probe_set: str
    kernel: str | None
    symbolize: int | None
    capture_args: bool = False
    trace_json: str | None = None
    lbr_flags: int | None = None  # perf branch_sample_type; None: --lbr not given
    lbr_max_count: int | None = None
    ringbuf_size: int = 8 << 20
    sessions_size: int = 4096
    max_calls: int = 20_000  # -T calls kept per session (the rest are counted)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def otlp_enabled(self) -> bool:
        return bool(self.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                    or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def parse_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> TraceOptions | None:
    args = parser.parse_args(list(argv))
    if args.version:
        print(f"retsnoop-otel v{__version__}")
        if args.verbose:
            from retsnoop_otel.kernel import features
            print(features.format_features(features.detect()))
        return None
    if not args.entry:
        parser.error("at least one entry glob is needed: -e GLOB (for example -e '*sys_bpf')")
    if args.success_stacks and args.allow_errors:
        parser.error("-S (success sessions) conflicts with -x (only sessions with given errors)")
    try:
        errors = ErrorFilter.parse(args.allow_errors, args.deny_errors)
    except ValueError as exc:
        parser.error(str(exc))
    cfg = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"-C expects KEY=VALUE, got '{item}'")
        cfg[key.strip()] = value.strip()
    ringbuf_size = _int_cfg(parser, cfg, "bpf.ringbuf-size", 8 << 20)
    sessions_size = _int_cfg(parser, cfg, "bpf.sessions-size", 4096)
    from retsnoop_otel.capture.sessions import DEFAULT_MAX_CALLS
    max_calls = _int_cfg(parser, cfg, "calls.max-per-session", DEFAULT_MAX_CALLS)
    unknown = set(cfg) - {"bpf.ringbuf-size", "bpf.sessions-size", "calls.max-per-session"}
    if unknown:
        parser.error(f"unknown -C key '{sorted(unknown)[0]}' (known: bpf.ringbuf-size, bpf.sessions-size, "
                     "calls.max-per-session)")
    lbr_flags = None
    if args.lbr is not None:
        from retsnoop_otel.render.lbr import LbrError, parse_specs
        try:
            lbr_flags = parse_specs(args.lbr)
        except LbrError as exc:
            parser.error(str(exc))
    if args.lbr_max_count is not None and (args.lbr is None or args.lbr_max_count <= 0):
        parser.error("--lbr-max-count needs --lbr and a positive count")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        parser.error(f"--metrics-port {args.metrics_port} is not a TCP port (1..65535)")
    return TraceOptions(
        entry=args.entry, allow=args.allow, deny=args.deny, mode=args.mode, calls=args.calls,
        call_stack=args.call_stack, success=args.success_stacks or (args.calls and
                                                                                        not args.allow_errors),
        json=args.json, dry_run=args.dry_run, verbose=args.verbose, errors=errors, pids=args.pid,
        no_pids=args.no_pid, comms=args.comm, no_comms=args.no_comm, min_duration_ns=args.longer,
        cgroup=args.cgroup, otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol,
        export_addresses=args.export_addresses, metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr, probe_set=args.probe_set, kernel=args.kernel,
        symbolize=args.symbolize, ringbuf_size=ringbuf_size, sessions_size=sessions_size, max_calls=max_calls,
        capture_args=args.capture_args, trace_json=args.trace_json, lbr_flags=lbr_flags,
        lbr_max_count=args.lbr_max_count)


def _int_cfg(parser: argparse.ArgumentParser, cfg: dict[str, str], key: str, default: int) -> int:
    if key not in cfg:
        return default
    try:
        value = int(cfg[key], 0)
    except ValueError:
        parser.error(f"-C {key} expects an integer, got '{cfg[key]}'")
    if value <= 0:
        parser.error(f"-C {key} must be positive")
    return value


def run_trace(parser: argparse.ArgumentParser, argv: Sequence[str], out: TextIO = sys.stdout,
              err: TextIO = sys.stderr) -> int:
    opts = parse_options(parser, argv)
    if opts is None:
        return 0
    try:
        return _run(opts, out, err)
    except UsageError as exc:
        print(f"retsnoop-otel: {exc}", file=err)
        return 2
    except (SetupError, lb.LibbpfError, lb.LibbpfUnavailable) as exc:
        print(f"retsnoop-otel: {exc}", file=err)
        return 1


def _log(opts: TraceOptions, level: int, msg: str, err: TextIO) -> None:
    if opts.verbose >= level:
        print(msg, file=err, flush=True)


def _check_privileges() -> None:
    from retsnoop_otel.kernel.caps import effective_caps
    caps = effective_caps()
    if os.geteuid() != 0 and not {"CAP_BPF", "CAP_PERFMON"} <= caps and "CAP_SYS_ADMIN" not in caps:
        raise SetupError("tracing kernel functions needs root or the CAP_BPF and CAP_PERFMON capabilities: "
                         "run it with sudo")


def _check_globs(opts: TraceOptions) -> None:
    """Glob syntax needs no kernel: refuse a malformed glob before the slow kernel reads (~40 s under TCG)."""
    from retsnoop_otel.symbols import discovery
    try:
        for glob in discovery.expand_glob_args([*opts.entry, *opts.allow, *opts.deny]):
            discovery.parse_glob(glob)
    except discovery.DiscoveryError as exc:
        raise UsageError(str(exc)) from None


def _check_lbr(feats: object) -> None:
    """--lbr is refused before anything loads where the CPU keeps no branch records or the kernel
    cannot snapshot them from BPF (retsnoop silently drops LBR there; a user who asked should know)."""
    from retsnoop_otel.render.lbr import LbrError, lbr_missing, require_lbr
    why = lbr_missing(feats.lbr, feats.branch_snapshot)  # type: ignore[attr-defined]
    try:
        require_lbr(not why, why)
    except LbrError as exc:
        raise SetupError(str(exc)) from None


def _run(opts: TraceOptions, out: TextIO, err: TextIO) -> int:
    from retsnoop_otel.kernel import features
    from retsnoop_otel.symbols import discovery, tracefs
    from retsnoop_otel.symbols.btf import ReturnKinds
    from retsnoop_otel.symbols.kallsyms import Kallsyms, KallsymsError

    _check_globs(opts)
    _check_privileges()
    vmlinux = _find_vmlinux(opts)  # before the slow kernel reads: a wrong -k is bad input
    feats = features.detect()
    if opts.lbr_flags is not None:
        _check_lbr(feats)
    mode = opts.mode or features.choose_mode(feats)
    try:
        features.require_tracing(feats, mode)
    except features.FeatureError as exc:
        raise SetupError(str(exc)) from None
    _log(opts, 1, f"Using attach mode {mode}" + ("" if opts.mode else " (auto-detected)"), err)

    try:
        ksyms = Kallsyms.load()
    except KallsymsError as exc:
        raise SetupError(str(exc)) from None
    try:
        available = tracefs.read_available_filter_functions()
    except tracefs.TracefsError as exc:
        raise SetupError(str(exc)) from None
    btf = lb.Btf.load_vmlinux()
    ret_kinds = ReturnKinds(btf)
    _log(opts, 1, f"Using vmlinux {vmlinux} for DWARF" if vmlinux else
         "No vmlinux with DWARF found: kallsyms names only", err)
    resolve = None
    if vmlinux:
        from retsnoop_otel.symbols.dwarf import SourceIndex
        resolve = SourceIndex.load_or_build(vmlinux).match
    try:
        disc = discovery.discover(opts.entry, opts.allow, opts.deny, ksyms, available, ret_kinds, mode,
                                  resolve_source_glob=resolve)
    except discovery.DiscoveryError as exc:
        raise UsageError(str(exc)) from None
    if opts.dry_run or opts.verbose:
        print(discovery.format_dry_run(disc, opts.verbose), file=err if not opts.dry_run else out, flush=True)
    if opts.dry_run:
        return 0
    funcs = {f.id: f for f in disc.funcs}
    symbolizer = _symbolizer(ksyms, vmlinux if opts.symbolize != 0 else None, opts.symbolize)

    from retsnoop_otel.kernel.tracer import CaptureConfig, Tracer
    cgroup_id, cgroup_level = _cgroup(opts.cgroup) if opts.cgroup else (0, 0)
    arg_specs: dict[int, list[int]] = {}
    if opts.capture_args:
        from retsnoop_otel.symbols.args import ArgFormatter, describe_args, spec_words
        descs = {f.id: describe_args(btf, f.name) for f in disc.funcs}
        arg_specs = {fid: spec_words(d) for fid, d in descs.items() if d}
        sinks_args = ArgFormatter(btf, descs).format
        # exported data leaves the host: pointers inside arguments would reveal the KASLR offset
        export_args = ArgFormatter(btf, descs, show_pointers=opts.export_addresses).format
    else:
        sinks_args = export_args = None
    emit_calls = opts.calls or opts.otlp_enabled or opts.capture_args or bool(opts.trace_json)
    cfg = CaptureConfig(mode=mode, emit_calls=emit_calls, capture_args=opts.capture_args,
                        capture_success=opts.success,
                        min_duration_ns=opts.min_duration_ns, pids=opts.pids, no_pids=opts.no_pids,
                        comms=opts.comms, no_comms=opts.no_comms, cgroup_id=cgroup_id, cgroup_level=cgroup_level,
                        ringbuf_size=opts.ringbuf_size, max_sessions=opts.sessions_size,
                        lbr_branch_types=opts.lbr_flags or 0)
    tracer = Tracer(disc.funcs, cfg, btf_func_id=ret_kinds.func_id, arg_specs=arg_specs)
    sinks = _Sinks(opts, funcs, symbolizer, out, err, fmt_args=sinks_args, export_args=export_args)
    stop = _install_stop_handlers()
    try:
        tracer.load()
        report = tracer.attach(on_error=lambda f, e: _log(opts, 1, f"Failed to attach {f.name}: {e}", err))
        _log(opts, 1, f"Successfully attached {len(report.attached)} functions in {report.attach_ms:.0f} ms.",
             err)
        if mode == "fentry":
            ksyms.refresh_bpf_symbols()  # name the trampolines that fexit stacks run through
        sinks.start(tracer)
        print("Receiving data...", file=out, flush=True)
        from retsnoop_otel.capture.sessions import SessionAssembler
        assembler = SessionAssembler(max_calls=opts.max_calls)

        def on_record(rec: object) -> None:
            session = assembler.feed(rec)  # type: ignore[arg-type]
            if session is not None:
                sinks.emit(session)

        tracer.open_ring_buffer(on_record)
        while not stop():
            tracer.poll(100)
    finally:
        print("Detaching... ", end="", file=out, flush=True)
        t0 = time.monotonic()
        cstats = None
        try:
            cstats = tracer.capture_stats() if tracer._obj is not None else None
        finally:
            tracer.close()
            sinks.close()
        if cstats and (cstats.dropped_sessions or cstats.incomplete_sessions or cstats.dropped_records):
            print(f"DROPPED SESSIONS: {cstats.dropped_sessions}, INCOMPLETE SESSIONS: "
                  f"{cstats.incomplete_sessions}, LOST RECORDS: {cstats.dropped_records}. ", end="", file=out)
        print(f"DONE in {(time.monotonic() - t0) * 1000:.0f} ms.", file=out, flush=True)
    return 0


def _find_vmlinux(opts: TraceOptions) -> str | None:
    """-k must match the running kernel; otherwise look in the standard places (-sn skips unless -k)."""
    from retsnoop_otel.symbols.dwarf import DwarfError, find_vmlinux
    if opts.symbolize == 0 and not opts.kernel:
        return None
    try:
        return find_vmlinux(opts.kernel)
    except DwarfError as exc:
        raise UsageError(str(exc)) from None


def _symbolizer(ksyms: object, vmlinux: str | None, level: int | None) -> object:
    """kallsyms names always; with a vmlinux, file:line (-s) and inlined frames (-ss, the default)."""
    from retsnoop_otel.symbols.symbolize import DwarfSymbolizer, KallsymsSymbolizer
    if not vmlinux:
        return KallsymsSymbolizer(ksyms)  # type: ignore[arg-type]
    from retsnoop_otel.symbols.dwarf import LlvmSymbolizer, kaslr_offset
    source = LlvmSymbolizer(vmlinux, kaslr_offset(vmlinux, ksyms.stext),  # type: ignore[attr-defined]
                            inlines=level is None or level >= 2)
    return DwarfSymbolizer(ksyms, source)  # type: ignore[arg-type]


def _cgroup(path: str) -> tuple[int, int]:
    from retsnoop_otel.runtime.probe_set import cgroup_target
    try:
        return cgroup_target(path)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None


def _install_stop_handlers() -> Callable[[], bool]:
    stopped = {"flag": False}

    def handler(_sig: int, _frame: object) -> None:
        stopped["flag"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: stopped["flag"]


class _Sinks:
    """Text/JSON output, OTLP export and the metrics endpoint for one trace run."""

    def __init__(self, opts: TraceOptions, funcs: dict[int, TracedFunc], symbolizer: object, out: TextIO,
                 err: TextIO, fmt_args: Callable[..., list[str]] | None = None,
                 export_args: Callable[..., list[str]] | None = None) -> None:
        self.opts = opts
        self.fmt_args = fmt_args
        self.export_args = export_args
        self.funcs = funcs
        self.symbolizer = symbolizer
        self.out = out
        self.err = err
        self.otlp = None
        self.encoder = None
        self.metrics_server = None
        self.resource = None
        from retsnoop_otel.capture.clock import measure_boot_to_wall_offset
        self.offset_ns = measure_boot_to_wall_offset()
        self.trace_json = None
        if opts.trace_json:
            from retsnoop_otel.render.trace_json import TraceJsonWriter
            self.trace_json = TraceJsonWriter(opts.trace_json, funcs, self.offset_ns)

    def start(self, tracer: object) -> None:
        if self.opts.otlp_enabled:
            from retsnoop_otel.export.otlp import OtlpTraceSink
            from retsnoop_otel.export.otlp_fast import SpanEncoder
            from retsnoop_otel.export.resource import build_resource
            self.resource = build_resource()
            self.otlp = OtlpTraceSink(endpoint=self.opts.otlp_endpoint, protocol=self.opts.otlp_protocol)
            from functools import partial

            from retsnoop_otel.symbols.symbolize import definition
            self.encoder = SpanEncoder(self.funcs, self.resource, locate=partial(definition, self.symbolizer),
                                       symbolize=self.symbolizer.describe,  # type: ignore[attr-defined]
                                       export_addresses=self.opts.export_addresses,
                                       format_args=self.export_args)
        if self.opts.metrics_port is not None:
            from retsnoop_otel.metrics.collector import MetricsCollector, make_registry, serve_metrics
            collector = MetricsCollector(
                probe_set=self.opts.probe_set, funcs=self.funcs,
                func_stats=tracer.func_stats,  # type: ignore[attr-defined]
                capture_stats=tracer.capture_stats,  # type: ignore[attr-defined]
                export_stats=(lambda: self.otlp.stats()) if self.otlp else None,
                session_stats=tracer.session_stats,  # type: ignore[attr-defined]
                program_stats=tracer.program_stats)  # type: ignore[attr-defined]
            self.metrics_server = serve_metrics(self.opts.metrics_port, make_registry(collector),
                                                addr=self.opts.metrics_addr)

    def emit(self, session: Session) -> None:
        if not self.opts.errors.accepts(session, self.funcs):
            return
        if self.opts.json:
            self.out.write(json.dumps(_session_json(session, self.funcs, self.offset_ns)) + "\n")
        else:
            self.out.write(self._text(session))
        self.out.flush()
        if self.trace_json is not None:
            self.trace_json.add(session)
            self.trace_json.flush()
        if self.otlp is not None and self.encoder is not None:
            self.otlp.submit(self.encoder.encode(session, self.offset_ns))

    def _text(self, session: Session) -> str:
        """retsnoop's order: the call table (-T), then the stack (default, or -E with -T)."""
        from retsnoop_otel.render.calls import render_calls, render_chain_args
        from retsnoop_otel.render.stack import render_header, render_stack
        lbr = self._lbr(session)
        if not self.opts.calls:
            text = render_stack(session, self.funcs, self.symbolizer, self.offset_ns)
            if lbr:
                head, _, rows = text.partition("\n\n")
                text = head + "\n\n" + lbr + "\n" + rows
            if self.fmt_args is not None and session.calls:
                text = text.rstrip("\n") + "\n\n" + render_chain_args(session, self.funcs, self.fmt_args) + "\n"
            return text
        parts = [render_header(session, self.offset_ns) + "\n\n", render_calls(session, self.funcs, self.fmt_args)]
        if lbr:
            parts.append("\n" + lbr)
        if self.opts.call_stack:
            stack = render_stack(session, self.funcs, self.symbolizer, self.offset_ns)
            parts.append("\n" + stack.split("\n", 2)[2] if stack.count("\n") >= 2 else stack)
        else:
            parts.append("\n\n")
        return "".join(parts)

    def _lbr(self, session: Session) -> str:
        if session.lbr is None:
            return ""
        from retsnoop_otel.render.lbr import render_session_lbr
        return render_session_lbr(session, self.funcs, self.symbolizer,  # type: ignore[arg-type]
                                  self.opts.lbr_max_count or 0)

    def close(self) -> None:
        if self.trace_json is not None:
            self.trace_json.close()
        if self.otlp is not None:
            self.otlp.shutdown(timeout=5.0)
        if self.metrics_server is not None:
            server = self.metrics_server[0]
            server.shutdown()


def _session_json(session: Session, funcs: dict[int, TracedFunc], offset_ns: int) -> dict[str, object]:
    from retsnoop_otel.capture.model import error_type, format_result
    chain = []
    for e in session.chain:
        f = funcs[e.func_id]
        chain.append({"function": f.name, "latency_ns": e.latency_ns,
                      "result": format_result(e.result if e.latency_ns is not None else None, f.ret),
                      "error": error_type(e.result, f.ret) if e.latency_ns is not None else None})
    return {"tid": session.tid, "pid": session.pid, "comm": session.comm, "proc_comm": session.proc_comm,
            "start_ns": session.start_ns + offset_ns, "end_ns": session.end_ns + offset_ns,
            "is_err": session.is_err, "chain": chain, "dropped_records": session.dropped_records,
            **({"lbr": _lbr_json(session, funcs)} if session.lbr is not None else {})}


def _lbr_json(session: Session, funcs: dict[int, TracedFunc]) -> dict[str, object]:
    """Raw branch pairs for scripts (this output stays on the host, like the text view)."""
    from retsnoop_otel.capture.errnos import errno_name
    cap = session.lbr
    assert cap is not None
    func = funcs.get(cap.func_id)
    return {"function": func.name if func else None, "depth": cap.depth,
            "error": (errno_name(cap.error) or f"E{cap.error}") if cap.error else None,
            "branches": [{"from": f"0x{b.src:x}", "to": f"0x{b.dst:x}"} for b in cap.branches]}

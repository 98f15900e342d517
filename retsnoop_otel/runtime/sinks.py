"""Where kept sessions go, for both commands: console text or JSON, Chrome trace JSON, OTLP exporters (to a
collector, to an OTLP-JSON file, or as OTLP/JSON lines on the console with OTEL_TRACES_EXPORTER=console).

Built before anything is loaded into the kernel, so that building them is the check of their
inputs: an OTLP setting that cannot work, or a file that cannot be written, stops the run with one
line. OTLP exporters sit behind bounded queues (the network never blocks capture); a trace handed
to an exporter also leaves its id as a metrics exemplar (unless OTEL_METRICS_EXEMPLAR_FILTER=always_off).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, TextIO

from retsnoop_otel.capture.model import Session, lookup_func
from retsnoop_otel.capture.origins import error_origin
from retsnoop_otel.command.errors import InputError, SetupError
from retsnoop_otel.export.otlp_settings import OtlpSettings
from retsnoop_otel.export.processor_env import DEFAULT_QUEUE_SPANS
from retsnoop_otel.export.resource import Resource, with_cluster_name
from retsnoop_otel.export.span_limits import SpanLimits
from retsnoop_otel.inputs.files import plain
from retsnoop_otel.metrics.trace_counts import TraceCounts
from retsnoop_otel.render.formats import ArgsFormat
from retsnoop_otel.runtime.config import ExporterConfig, Limits, RuntimeConfig
from retsnoop_otel.runtime.environment import name_it
from retsnoop_otel.runtime.settings import RunSettings

SenderFactory = Callable[[OtlpSettings], Any]  # -> export.senders.Sender


def sinks_key(cfg: RuntimeConfig) -> tuple:
    """What the sinks are built from: a reload whose config differs here builds new ones."""
    return cfg.exporter, cfg.limits, cfg.kubernetes.cluster_name


class ExportTotals:
    __slots__ = ("spans_exported", "spans_dropped", "export_errors")

    def __init__(self, spans_exported: int = 0, spans_dropped: dict[str, int] | None = None,
                 export_errors: int = 0) -> None:
        self.spans_exported = spans_exported
        self.spans_dropped = {} if spans_dropped is None else spans_dropped
        self.export_errors = export_errors


class _SetOutputs:
    """Per probe set: its span encoder and argument formatters (a reload builds new probe sets)."""

    def __init__(self, ps: Any, cfg: ExporterConfig, limits: Limits, envelopes: Any, span_limits: SpanLimits) -> None:
        from functools import partial

        from retsnoop_otel.symbols.symbolize import definition
        self.fmt_args = self.export_args = None
        self.stack_layouts: Any = None  # render.stack.StackLayouts, made by the console's first session
        if ps.arg_descs and ps.btf is not None:
            from retsnoop_otel.symbols.args import ArgFormatter
            shown = cfg.console.args if cfg.console is not None else ArgsFormat()
            self.fmt_args = ArgFormatter(ps.btf, ps.arg_descs, width=shown.max_width, mode=shown.mode,
                                         raw_ptrs=shown.raw_ptrs).format
            # exported data leaves the host: pointers inside arguments would reveal the KASLR offset
            self.export_args = ArgFormatter(ps.btf, ps.arg_descs, show_pointers=cfg.export_addresses).format
        self.encoder = None
        if not cfg.spans:
            return
        from retsnoop_otel.export.span_encoder import SpanEncoder
        self.encoder = SpanEncoder(ps.funcs, envelopes.base, symbolize=ps.symbolizer.describe,
                                   locate=partial(definition, ps.symbolizer), export_addresses=cfg.export_addresses,
                                   max_spans=limits.max_spans_per_trace, format_args=self.export_args,
                                   workloads=envelopes, value_limit=span_limits.value_length,
                                   count_limit=span_limits.attributes, event_limit=span_limits.events,
                                   event_attribute_limit=span_limits.event_attributes,
                                   service_per_session=cfg.service_name_from == "workload")


class Sinks:
    """The configured destinations of kept sessions."""

    def __init__(self, settings: RunSettings, resource: Resource, console: TextIO,
                 make_sender: SenderFactory) -> None:
        cfg = settings.config.exporter
        self._names = names = settings.config.names
        self.cfg = cfg
        self.limits = limits = settings.config.limits
        # the run's resource (one service.instance.id per run) with this config's k8s.cluster.name
        self._resource = resource = with_cluster_name(resource, settings.config.kubernetes.cluster_name)
        self._console = console if cfg.console is not None else None
        self.exporters: list[Any] = []  # export.otlp_sink.OtlpTraceSink
        self.span_limit_dropped = 0
        self.exemplars: Any = None  # metrics.exemplars.ExemplarStore once there is an exporter
        self.traces = TraceCounts(settings.config.metrics.max_workloads)  # by probe set, service and status
        self._per_set: weakref.WeakKeyDictionary[Any, _SetOutputs] = weakref.WeakKeyDictionary()
        self._envelopes: Any = None  # export.span_encoder.WorkloadEnvelopes: one resource per workload, all sets
        self._final: ExportTotals | None = None  # counters at close, when the exporters are gone
        self.trace_json = None
        self._span_limits = settings.span_limits
        try:
            if cfg.spans:  # grpc and protobuf load only when they are needed
                from retsnoop_otel.export.otlp_sink import OtlpTraceSink
                from retsnoop_otel.export.span_encoder import WorkloadEnvelopes
                from retsnoop_otel.metrics.exemplars import ExemplarStore
                self.exemplars = ExemplarStore() if settings.exemplars else None
                self._envelopes = WorkloadEnvelopes(resource.attributes, resource.schema_url)
            batch = settings.batch
            queue = dict(max_queue_spans=limits.export_queue_spans or batch.max_queue_spans or DEFAULT_QUEUE_SPANS,
                         max_batch_spans=batch.max_batch_spans, schedule_delay_s=batch.schedule_delay_s)
            if settings.traces is not None:
                self.exporters.append(OtlpTraceSink(make_sender(settings.traces), **queue))
            if cfg.file is not None:
                from retsnoop_otel.export.otlp_file import OtlpJsonFileSender
                self.exporters.append(OtlpTraceSink(_open(cfg.file, names.file, OtlpJsonFileSender), **queue))
            if cfg.otlp_console:
                from retsnoop_otel.export.otlp_file import OtlpJsonFileSender
                self.exporters.append(OtlpTraceSink(OtlpJsonFileSender("<stdout>", stream=console), **queue))
            if cfg.trace_json is not None:
                from retsnoop_otel.render.trace_json import TraceJsonWriter
                self.trace_json = _open(cfg.trace_json, names.trace_json, TraceJsonWriter)
        except BaseException:
            self.close(0.0)
            raise

    @staticmethod
    def due(settings: RunSettings, running: RuntimeConfig | None) -> bool:
        """Whether a start or a reload (`running`: the config it replaces) builds sinks: a reload only when their
        config changed. Built after the attach; their files are checked now, so an unwritable one is said first."""
        if due := running is None or sinks_key(settings.config) != sinks_key(running):
            check_outputs(settings)
        return due

    @staticmethod
    def modules(settings: RunSettings) -> list[str]:
        """What building these sinks imports, for runtime/prefetch.py (beside the kernel's load)."""
        cfg, out = settings.config.exporter, []
        if cfg.spans:
            out += ["retsnoop_otel.export.otlp_sink", "retsnoop_otel.export.span_encoder",
                    "retsnoop_otel.metrics.exemplars"]
        if settings.traces is not None:
            out.append("retsnoop_otel.export.senders")
        if cfg.file is not None or cfg.otlp_console:
            out.append("retsnoop_otel.export.otlp_file")
        if cfg.trace_json is not None:
            out.append("retsnoop_otel.render.trace_json")
        return out

    def _outputs(self, ps: Any) -> _SetOutputs:
        out = self._per_set.get(ps)
        if out is None:
            out = self._per_set[ps] = _SetOutputs(ps, self.cfg, self.limits, self._envelopes, self._span_limits)
        return out

    def emit(self, ps: Any, session: Session, offset_ns: int) -> None:
        out = self._outputs(ps)
        if self._console is not None:  # flushed once per poll (flush()), not per session
            self._console.write(self._text(ps, out, session, offset_ns))
        if self.trace_json is not None and session.calls:
            self.trace_json.add(session, ps.funcs, offset_ns)
        if not self.exporters:
            return
        trace = out.encoder.encode(session, offset_ns)
        self.span_limit_dropped += trace.spans_dropped + session.calls_cut  # both: the per-trace span limit
        accepted = [sink.submit(trace) for sink in self.exporters]
        if any(accepted):
            self.traces.add(ps.name, self._service(session), session.is_err)
        if any(accepted) and self.exemplars is not None and session.entry_func_id is not None:  # of a trace that exists
            entry = lookup_func(ps.funcs, session.entry_func_id).name
            self.exemplars.record(ps.name, entry, session.end_ns - session.start_ns, trace.trace_id,
                                  session.end_ns + offset_ns)
            if (origin := error_origin(session, ps.funcs)) is not None:
                self.exemplars.record_origin(ps.name, entry, lookup_func(ps.funcs, origin.func_id).name, origin.error,
                                             trace.trace_id, session.end_ns + offset_ns)

    def _service(self, session: Session) -> str:
        """The service.name the session's spans carry (export/service_name.py)."""
        if self.cfg.service_name_from == "workload":
            from retsnoop_otel.export.service_name import session_service
            return session_service(session)
        return str(self._resource.attributes.get("service.name", ""))

    def _text(self, ps: Any, out: _SetOutputs, session: Session, offset_ns: int) -> str:
        from retsnoop_otel.render.console import session_json, session_text
        from retsnoop_otel.render.stack import StackLayouts
        console = self.cfg.console
        assert console is not None
        if console.format == "json":
            import json  # not at start: its import is 0.2 s of an emulated one
            text = json.dumps(session_json(session, ps.funcs, offset_ns)) + "\n"
        else:
            calls_view = console.view == "calls" or (console.view == "auto" and ps.cfg.mode == "calls"
                                                     and bool(session.calls))
            if out.stack_layouts is None:
                out.stack_layouts = StackLayouts(ps.funcs, ps.symbolizer, fmt=console.stacks)
            text = session_text(session, ps.funcs, ps.symbolizer, offset_ns, calls_view=calls_view,
                                call_stack=console.call_stack, fmt_args=out.fmt_args,
                                lbr_max_count=console.lbr_max_count, layouts=out.stack_layouts,
                                stacks=console.stacks, args_mode=console.args.mode)
        return f"[{ps.name}] {text}" if console.prefix else text

    def totals(self) -> ExportTotals:
        if self._final is not None:
            return self._final
        t = ExportTotals()
        for sink in self.exporters:
            s = sink.stats()
            t.spans_exported += s.spans_exported
            t.export_errors += s.export_errors
            for cause, n in s.spans_dropped.items():
                t.spans_dropped[cause] = t.spans_dropped.get(cause, 0) + n
        if self.span_limit_dropped:
            t.spans_dropped["span_limit"] = t.spans_dropped.get("span_limit", 0) + self.span_limit_dropped
        return t

    def last_errors(self) -> list[str]:
        return [s.last_error for s in self.exporters if s.last_error]

    def flush(self) -> None:
        """After each poll: the console and the trace JSON file get a poll's sessions in one write, not
        a write (and, on a pipe, a wakeup of its reader) per session."""
        if self._console is not None:
            self._console.flush()
        if self.trace_json is not None and self.trace_json.pending:
            self.trace_json.flush()
        self.check_files()

    def check_files(self) -> None:
        """A file output that failed (a full disk) ends the run like a failed stdout, with one line naming it."""
        if self.trace_json is not None and self.trace_json.error is not None:
            exc = self.trace_json.error
            raise SetupError(f"{self._names.trace_json} {plain(self.trace_json.path)}: {exc.strerror or exc}; the "
                             "file output stopped there")

    def close(self, timeout: float) -> None:
        """Flush within `timeout` in total (shared by the exporters), then stop them."""
        deadline = time.monotonic() + timeout
        if self._console is not None:
            self._console.flush()
        for sink in self.exporters:
            sink.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        self._final = self.totals()
        self.exporters = []
        if self.trace_json is not None:
            self.trace_json.close()
            self.trace_json = None


def _open(path: str, name: str, opener: Callable[[str], Any]) -> Any:
    """A file output opened now: an unwritable path is the user's input error, said before any attach. Its kind is
    checked first: a FIFO would block the open (and the signals with it), a device such as /dev/full loses every
    span without a word."""
    refused = _kind_refused(path)
    if refused:
        raise InputError(name_it(name, f"{plain(path)}: {refused}; give a regular file (or /dev/null)"))
    try:
        return opener(path)
    except OSError as exc:  # the path echoed as every message does: one line, bounded
        raise InputError(name_it(name, f"{plain(path)}: {exc.strerror or exc}; give a writable file")) from None


def _kind_refused(path: str) -> str:
    """Why an existing output path is no file the run can append to ("" when it is one, or does not exist yet)."""
    import os
    import stat
    if path == "":
        return "an empty path"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""  # created by the open, or refused there with the system's reason
    if stat.S_ISREG(mode) or os.path.realpath(path) == "/dev/null":
        return ""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return "is " + next((what for test, what in kinds if test(mode)), "not a regular file")


def check_outputs(settings: RunSettings) -> None:
    """agent --check: each output file opened (created) the way the run opens it, nothing written; a file that
    the check created is removed again, so that a check leaves the host as it found it."""
    import os
    cfg, names = settings.config.exporter, settings.config.names
    for path, name in ((cfg.file, names.file), (cfg.trace_json, names.trace_json)):
        if path is None:
            continue
        existed = os.path.lexists(path)
        _open(path, name, lambda p: open(p, "a", encoding="utf-8")).close()  # noqa: SIM115
        if not existed:
            os.unlink(path)

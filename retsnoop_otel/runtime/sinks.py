"""Where kept sessions go, for both commands: console text or JSON, Chrome trace JSON, OTLP exporters.

Built before anything is loaded into the kernel, so that building them is the check of their
inputs: an OTLP setting that cannot work, or a file that cannot be written, stops the run with one
line. OTLP exporters sit behind bounded queues (the network never blocks capture); a trace handed
to an exporter also leaves its id as a metrics exemplar.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from retsnoop_otel.capture.model import Session, lookup_func
from retsnoop_otel.export.otlp_settings import (
    OtlpConfig,
    OtlpConfigError,
    OtlpSettings,
    attribute_count_limit,
    attribute_value_limit,
    resolve_settings,
)
from retsnoop_otel.export.processor_env import (
    DEFAULT_QUEUE_SPANS,
    BatchSettings,
    ReaderSettings,
    batch_settings,
    bounded,
    reader_settings,
)
from retsnoop_otel.export.resource import Resource, resource_attributes_problem
from retsnoop_otel.inputs.files import shown
from retsnoop_otel.runtime.config import AGENT_NAMES, ExporterConfig, InputNames, Limits
from retsnoop_otel.runtime.environment import name_it
from retsnoop_otel.runtime.errors import InputError

SenderFactory = Callable[[OtlpSettings], Any]  # -> export.senders.Sender


def otlp_settings(cfg: OtlpConfig, signal: str, names: Mapping[str, str],
                  environ: Mapping[str, str] = os.environ) -> OtlpSettings:
    """The one endpoint check: config, then OTEL_EXPORTER_OTLP_* variables, as the specification orders them."""
    try:
        return resolve_settings(cfg, signal, environ, names)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def attribute_limits(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT and OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT, or the input error they are."""
    try:
        return attribute_value_limit(environ), attribute_count_limit(environ)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def processor_env(environ: Mapping[str, str]) -> tuple[BatchSettings, ReaderSettings]:
    """OTEL_BSP_* and OTEL_METRIC_EXPORT_*, or the input error they are."""
    try:
        return batch_settings(environ), reader_settings(environ)
    except OtlpConfigError as exc:
        raise InputError(str(exc)) from None


def check_export_env(environ: Mapping[str, str], traces: bool, metrics: bool) -> None:
    """What the exports read from the environment beyond their endpoints, checked at start (exit 2 if unusable)."""
    if traces:
        attribute_limits(environ)
    if traces or metrics:
        check_resource_attributes(environ)
        processor_env(environ)


def check_resource_attributes(environ: Mapping[str, str]) -> None:
    """OTEL_RESOURCE_ATTRIBUTES that cannot be read is an input error (export.resource says why)."""
    attrs = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    problem = resource_attributes_problem(attrs)
    if problem:
        raise InputError(f"OTEL_RESOURCE_ATTRIBUTES={shown(attrs)}: {problem}; write it like key1=value1,key2=value2 "
                         "with each value percent-encoded")


class ExportTotals:
    __slots__ = ("spans_exported", "spans_dropped", "export_errors")

    def __init__(self, spans_exported: int = 0, spans_dropped: dict[str, int] | None = None,
                 export_errors: int = 0) -> None:
        self.spans_exported = spans_exported
        self.spans_dropped = {} if spans_dropped is None else spans_dropped
        self.export_errors = export_errors


class _SetOutputs:
    """Per probe set: its span encoder and argument formatters (a reload builds new probe sets)."""

    def __init__(self, ps: Any, cfg: ExporterConfig, limits: Limits, envelopes: Any,
                 attr_limits: tuple[int | None, int | None]) -> None:
        from functools import partial

        from retsnoop_otel.symbols.symbolize import definition
        self.fmt_args = self.export_args = None
        self.stack_layouts: Any = None  # render.stack.StackLayouts, made by the console's first session
        if ps.arg_descs and ps.btf is not None:
            from retsnoop_otel.symbols.args import ArgFormatter
            self.fmt_args = ArgFormatter(ps.btf, ps.arg_descs).format
            # exported data leaves the host: pointers inside arguments would reveal the KASLR offset
            self.export_args = ArgFormatter(ps.btf, ps.arg_descs, show_pointers=cfg.export_addresses).format
        self.encoder = None
        if not cfg.otlp and not cfg.file:
            return
        from retsnoop_otel.export.span_encoder import SpanEncoder
        self.encoder = SpanEncoder(ps.funcs, envelopes.base, symbolize=ps.symbolizer.describe,
                                   locate=partial(definition, ps.symbolizer), export_addresses=cfg.export_addresses,
                                   max_spans=limits.max_spans_per_trace, format_args=self.export_args,
                                   workloads=envelopes, value_limit=attr_limits[0], count_limit=attr_limits[1],
                                   service_per_session=cfg.service_name_from == "workload")


class Sinks:
    """The configured destinations of kept sessions."""

    def __init__(self, cfg: ExporterConfig, limits: Limits, resource: Resource, console: TextIO,
                 make_sender: SenderFactory, names: InputNames = AGENT_NAMES,
                 environ: Mapping[str, str] = os.environ) -> None:
        self.cfg = cfg
        self.limits = limits
        self._resource = resource
        self._console = console if cfg.console is not None else None
        self.exporters: list[Any] = []  # export.otlp_sink.OtlpTraceSink
        self.span_limit_dropped = 0
        self.exemplars: Any = None  # metrics.exemplars.ExemplarStore once there is an exporter
        self._per_set: weakref.WeakKeyDictionary[Any, _SetOutputs] = weakref.WeakKeyDictionary()
        self._envelopes: Any = None  # export.span_encoder.WorkloadEnvelopes: one resource per workload, all sets
        self._final: ExportTotals | None = None  # counters at close, when the exporters are gone
        self.trace_json = None
        self._attr_limits: tuple[int | None, int | None] = (None, None)
        try:
            if cfg.otlp is not None or cfg.file is not None:  # grpc and protobuf load only when they are needed
                from retsnoop_otel.export.otlp_sink import OtlpTraceSink
                from retsnoop_otel.export.span_encoder import WorkloadEnvelopes
                from retsnoop_otel.metrics.exemplars import ExemplarStore
                self.exemplars = ExemplarStore()
                self._envelopes = WorkloadEnvelopes(resource.attributes, resource.schema_url)
                self._attr_limits = attribute_limits(environ)
            batch = processor_env(environ)[0]
            queue = dict(max_queue_spans=limits.export_queue_spans or batch.max_queue_spans or DEFAULT_QUEUE_SPANS,
                         max_batch_spans=batch.max_batch_spans, schedule_delay_s=batch.schedule_delay_s)
            if cfg.otlp is not None:
                settings = otlp_settings(cfg.otlp, "traces", names.otlp, environ)
                settings = settings._replace(timeout_s=bounded(settings.timeout_s, batch.export_timeout_s))
                self.exporters.append(OtlpTraceSink(make_sender(settings), **queue))
            if cfg.file is not None:
                from retsnoop_otel.export.otlp_file import OtlpJsonFileSender
                self.exporters.append(OtlpTraceSink(_open(cfg.file, names.file, OtlpJsonFileSender), **queue))
            if cfg.trace_json is not None:
                from retsnoop_otel.render.trace_json import TraceJsonWriter
                self.trace_json = _open(cfg.trace_json, names.trace_json, TraceJsonWriter)
        except BaseException:
            self.close(0.0)
            raise

    def _outputs(self, ps: Any) -> _SetOutputs:
        out = self._per_set.get(ps)
        if out is None:
            out = self._per_set[ps] = _SetOutputs(ps, self.cfg, self.limits, self._envelopes, self._attr_limits)
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
        if any(accepted) and session.entry_func_id is not None:  # an exemplar must lead to a trace that exists
            self.exemplars.record(ps.name, lookup_func(ps.funcs, session.entry_func_id).name,
                                  session.end_ns - session.start_ns, trace.trace_id, session.end_ns + offset_ns)

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
                out.stack_layouts = StackLayouts(ps.funcs, ps.symbolizer)
            text = session_text(session, ps.funcs, ps.symbolizer, offset_ns, calls_view=calls_view,
                                call_stack=console.call_stack, fmt_args=out.fmt_args,
                                lbr_max_count=console.lbr_max_count, layouts=out.stack_layouts)
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
    """A file output opened now: an unwritable path is the user's input error, said before any attach."""
    try:
        return opener(path)
    except OSError as exc:
        raise InputError(name_it(name, f"{path}: {exc.strerror or exc}; give a writable file")) from None

"""Publish a Python service's active span per OS thread to out-of-process readers (OpenTelemetry Thread Context,
OTEP 4947, and Process Context, OTEP 4719), so that retsnoop-otel nests the kernel spans it traces under them.

Use: `pip install 'retsnoop-otel[publisher]'` in the service's environment and run it with
`OTEL_PYTHON_CONTEXT=retsnoop_thread_ctx`. The OpenTelemetry API then uses `ThreadContextRuntimeContext`
(runtime_context.py): after every context attach and detach, the calling OS thread's record holds the span
now current (trace id, span id and its W3C trace flags byte: unsampled spans too, with the sampled bit 0x01
clear; recent SDKs also set the random-trace-id bit 0x02), or is invalid when no valid span is current. A
thread that never attached a context has no record (NULL pointer). `RETSNOOP_OTEL_THREAD_ATTRIBUTES=
http.route,user.id` also copies those attributes of SDK spans (the ones with `.attributes`) into the record,
as (key index, length, value) entries in that order; a record holds at most 640 bytes (entries that do not
fit are left out whole, values are cut at 255 bytes).

When the runtime context is created, the process context is published once: a memfd mapping named
`OTEL_CTX` (if memfd_create is refused: shared anonymous memory named OTEL_CTX with prctl; if the kernel
cannot name it either, nothing is published and one warning says so) holding the Resource with service.name
(OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), `threadlocal.schema_version` = "tls_v1" and
`threadlocal.attribute_key_map`. Call `publish_process_context(resource)` with the SDK's Resource to publish
the full resource (an update, OTEP 4719's update protocol).

The native part is libotel_thread_ctx.so (otel_thread_ctx.c, built at install time, no code of the
service's own): it exports the TLS variable `otel_thread_ctx_v1` in .dynsym (TLSDESC relocations), one fixed
640-byte record per thread, updated by toggling its `valid` byte between compiler fences. Loaded with
dlopen, its 648-byte TLS block exceeds glibc's optional static TLS (512 bytes by default), so it lives in
dynamic TLS: readers reach it through the thread's DTV (dtv[module id] + st_value of the symbol).

Limits:
- Linux on x86-64 or aarch64 with glibc (ELF TLS as glibc lays it out; musl is untested).
- The record follows the OS thread's last attach or detach, not the contextvars context. asyncio (and other
  coroutine schedulers, gevent...) switch tasks on one thread without either: OpenTelemetry's `use_span` and
  `start_as_current_span` attach once on entry and detach once on exit, not at every task step, and Python
  < 3.14 has no hook on context switches (PyContext_AddWatcher is 3.14+). So while task A awaits inside span a,
  another task B that runs on that thread without a span of its own still shows a's span to a reader; if B
  enters and leaves a span b, the record shows b and then B's own context (no span: invalid), and when A
  resumes inside a the record stays invalid (or shows whatever the last attach/detach on the thread
  published) until A's next attach or detach. Threads are exact: each OS thread has its own record.
- Attributes are read when the span is attached (and again when a child detaches back to it): attributes
  set on the span after that appear only at its next attach/detach. String values only (others are turned
  into text, lists comma-joined).
"""

# opentelemetry.context first: with OTEL_PYTHON_CONTEXT=retsnoop_thread_ctx it imports runtime_context itself
# (the entry point), which must not find that module half-imported by this package
import opentelemetry.context  # noqa: F401

from .process_context import publish_process_context
from .runtime_context import ThreadContextRuntimeContext

__all__ = ["ThreadContextRuntimeContext", "publish_process_context"]

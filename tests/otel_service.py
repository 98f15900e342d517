"""A small Python service instrumented with the OpenTelemetry SDK whose requests fail in the kernel.

    OTEL_PYTHON_CONTEXT=retsnoop_thread_ctx python -m tests.otel_service --endpoint 127.0.0.1:4317 --requests 3

Each request is a SERVER span `GET /users/{id}` (attribute http.route) with a child span `load_user`, in which
the service makes a system call the kernel refuses: bpf(BPF_MAP_CREATE) of an array map with max_entries 0
(-EINVAL, which `load_user` records as its error.type and status, as instrumented services do; `--call sim`
calls sk_syscall of libsimkern.so instead, for uprobe tests on the host). With the retsnoop-otel publisher
selected (OTEL_PYTHON_CONTEXT), the thread's OTel context is published while the call runs (with `user.id` when
RETSNOOP_OTEL_THREAD_ATTRIBUTES=user.id), so retsnoop-otel nests the kernel's spans under `load_user`. The
service exports its own spans to the same OTLP endpoint (a collector, Jaeger). One JSON line per request says
which ids the kernel should have seen.
The demo (tests/demo.py) and the VM scenario app_context run it.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import sys
import time

ROUTE = "/users/{id}"


def failing_call(how: str) -> int:
    if how == "sim":
        lib = ctypes.CDLL(os.environ["SIMKERN"])
        return lib.sk_syscall(0)
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 5)(2, 4, 4, 0, 0)  # array map, key 4, value 4, max_entries 0
    ret = libc.syscall(321, 0, ctypes.byref(attr), ctypes.sizeof(attr))  # SYS_bpf, BPF_MAP_CREATE
    return -ctypes.get_errno() if ret < 0 else ret


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", help="OTLP/gRPC endpoint for the service's own spans (host:port)")
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between requests")
    p.add_argument("--call", choices=("bpf", "sim"), default="bpf")
    args = p.parse_args(argv)

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                                       "users-service")}))
    if args.endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        # 60 s, not the default 10: a loaded emulated guest (the collector beside the agent) must not lose the
        # service's own spans, which the tests read as the other half of each joined trace
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint, insecure=True,
                                                                         timeout=60)))
    tracer = provider.get_tracer("users-service")
    print(json.dumps({"pid": os.getpid(), "context": os.environ.get("OTEL_PYTHON_CONTEXT", "")}), flush=True)
    for i in range(args.requests):
        with tracer.start_as_current_span(f"GET {ROUTE}", kind=SpanKind.SERVER,
                                          attributes={"http.route": ROUTE, "http.request.method": "GET"}):
            with tracer.start_as_current_span("load_user", attributes={"user.id": str(1000 + i)}) as span:
                ret = failing_call(args.call)
                if ret < 0:  # as instrumented services do: the failing request's span says so
                    span.set_attribute("error.type", errno.errorcode.get(-ret, str(-ret)))
                    span.set_status(Status(StatusCode.ERROR))
                ctx = span.get_span_context()
                print(json.dumps({"request": i, "tid": ctypes.CDLL(None).gettid(), "trace_id": f"{ctx.trace_id:032x}",
                                  "span_id": f"{ctx.span_id:016x}", "ret": ret}), flush=True)
        time.sleep(args.interval)
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

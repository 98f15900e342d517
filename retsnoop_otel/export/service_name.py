"""Which service a kernel session's spans belong to: the workload's, not the tracer's.

A user who looks up their own service in Jaeger or Tempo should find the kernel spans their requests caused.
So a session's resource names the service of the process it ran in, taken in this order: the application's
own `service.name` from its process context (OTEP 4719), the Kubernetes container's name (what the pod spec
calls it: usually the application's name), the executable's name. The tracer itself stays visible as the
spans' instrumentation scope (`retsnoop_otel`) and keeps `retsnoop-otel` for its own telemetry; `agent`
(`exporter.service_name_from`, `--service-name-from`) puts every kernel span under that one service instead.
"""

from __future__ import annotations

from retsnoop_otel.capture.model import Session

SERVICE_NAME_FROM = ("workload", "agent")
UNKNOWN_SERVICE = "unknown_service"  # the specification's value when nothing names the service


def session_service(session: Session) -> str:
    app = session.app
    if app is not None and app.service_name:
        return app.service_name
    workload = session.workload
    if workload is not None and workload.container_name:
        return workload.container_name
    exe = session.exe_name or session.proc_comm
    return exe if exe else UNKNOWN_SERVICE

"""Which service a kernel session's spans belong to: the workload's, not the tracer's.

A user who looks up their own service in Jaeger or Tempo should find the kernel spans their requests caused.
So a session's resource names the service of the process it ran in, taken from the first of:
1. the application's own `service.name` from its process context (OTEP 4719): what its own spans say;
2. its pod's `resource.opentelemetry.io/service.name` annotation (OpenTelemetry's Kubernetes conventions);
3. its pod's `app.kubernetes.io/name` label (Kubernetes' well-known label for the application's name);
4. the name of the workload that owns the pod, the highest one known: the Deployment (else its ReplicaSet),
   StatefulSet, DaemonSet, CronJob (else its Job);
5. the Kubernetes container's name (a bare pod's, or a container whose pod is not known yet);
6. the executable's name (a process outside Kubernetes), else its comm.
Steps 2 to 5 follow the order of OpenTelemetry's non-normative "Resource attributes in Kubernetes" page, with
two differences: `app.kubernetes.io/instance` (a release's name, such as Helm's) is not used, and the
container's name comes before the pod's, which is not used (a bare pod's name is rarely the service's).
Every container of a pod (a sidecar too) is thus under the pod's service, as the pod's owner names it, unless its
process names its own. The tracer itself stays visible as the spans' instrumentation scope (`retsnoop_otel`) and
keeps `retsnoop-otel` for its own telemetry; `agent` (`exporter.service_name_from`, `--service-name-from`) puts
every kernel span under that one service instead.
"""

from __future__ import annotations

from retsnoop_otel.capture.model import Session

SERVICE_NAME_FROM = ("workload", "agent")
UNKNOWN_SERVICE = "unknown_service"  # the specification's value when nothing names the service


def session_service(session: Session) -> str:
    app = session.app
    if app is not None and app.service_name:
        return app.service_name
    w = session.workload
    if w is not None:
        named = w.annotated_service or w.app_name or (w.owners[-1][1] if w.owners else "") or w.container_name
        if named:
            return named
    exe = session.exe_name or session.proc_comm
    return exe if exe else UNKNOWN_SERVICE

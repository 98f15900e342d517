"""Which service a kernel session's spans belong to: the workload's, not the tracer's.

A user who looks up their own service in Jaeger or Tempo should find the kernel spans their requests caused.
So a session's resource names the service of the process it ran in, taken from the first of:
1. the application's own `service.name` from its process context (OTEP 4719): what its own spans say;
2. its pod's `resource.opentelemetry.io/service.name` annotation;
3. its pod's `app.kubernetes.io/instance` label, then its `app.kubernetes.io/name` label: Kubernetes' well-known
   labels, read only when the agent is told to (`kubernetes.well_known_labels: true`; off by default, then pods
   are named by their annotations and owners only);
4. the name of the workload that owns the pod, in this order of kinds: Deployment, ReplicaSet, StatefulSet,
   DaemonSet, CronJob, Job (a pod has one chain of owners, so this is the highest one known: a Deployment's
   ReplicaSet is named by the Deployment, a CronJob's Job by the CronJob);
5. the pod's name (a bare pod);
6. the Kubernetes container's name;
7. the executable's name (a process outside Kubernetes), else its comm.
Steps 2 to 6 are the order of OpenTelemetry's non-normative "Resource attributes in Kubernetes" page (the
semantic conventions' k8s-attributes derivation), whose label steps apply only when labels are enabled (the
OpenTelemetry Operator's `useLabelsForResourceAttributes`): here `kubernetes.well_known_labels`. Every container
of a pod (a sidecar too) is thus under the pod's service, unless its process names its own.

The rest of the service's identity goes with it (session_identity):
- `service.namespace`: the application's own (process context), else the pod's
  `resource.opentelemetry.io/service.namespace` annotation, else the pod's Kubernetes namespace; none otherwise
  (the agent's own service.namespace, from OTEL_RESOURCE_ATTRIBUTES, qualifies the agent's service, not this one);
- `service.instance.id`: the application's own (process context), else the pod's
  `resource.opentelemetry.io/service.instance.id` annotation, else `<k8s.namespace.name>.<k8s.pod.name>.
  <k8s.container.name>` as the conventions build it, when the three are known; else the agent's own (one per
  agent run: outside Kubernetes, or a pod-level cgroup whose container has no name, the node's agent is the
  instance the spans can name).
The tracer itself stays visible as the spans' instrumentation scope (`retsnoop_otel`) and keeps `retsnoop-otel`
for its own telemetry; `agent` (`exporter.service_name_from`, `--service-name-from`) puts every kernel span under
that one service instead, with the agent's own identity.
"""

from __future__ import annotations

from retsnoop_otel.capture.model import Session, Workload

SERVICE_NAME_FROM = ("workload", "agent")
UNKNOWN_SERVICE = "unknown_service"  # the specification's value when nothing names the service
# the conventions' order of owner kinds (Workload.owners, workload/pod_fields.py)
OWNER_ORDER = ("deployment", "replicaset", "statefulset", "daemonset", "cronjob", "job")

Identity = tuple[tuple[str, str], ...]  # ("service.name", value), ("service.namespace", ...), ...


def workload_service(w: Workload) -> str:
    """The service the pod's Kubernetes metadata names (steps 2 to 6), "" if none."""
    named = w.annotated_service or w.app_instance or w.app_name
    if not named and w.owners:
        owned = dict(w.owners)
        named = next((owned[kind] for kind in OWNER_ORDER if owned.get(kind)), "")
    return named or w.pod_name or w.container_name


def session_service(session: Session) -> str:
    app = session.app
    if app is not None and app.service_name:
        return app.service_name
    w = session.workload
    if w is not None:
        named = workload_service(w)
        if named:
            return named
    exe = session.exe_name or session.proc_comm
    return exe if exe else UNKNOWN_SERVICE


def instance_id(w: Workload) -> str:
    """The conventions' service.instance.id of a container: `<namespace>.<pod>.<container>`, "" unless all known."""
    return f"{w.namespace}.{w.pod_name}.{w.container_name}" if w.namespace and w.pod_name and w.container_name \
        else ""


def session_identity(session: Session) -> Identity:
    """service.name, service.namespace and service.instance.id of the session's own service, those known (see the
    module's docstring); an absent service.instance.id means the agent's own."""
    app, w = session.app, session.workload
    namespace = app.service_namespace if app is not None else ""
    instance = app.service_instance_id if app is not None else ""
    if w is not None:
        namespace = namespace or w.annotated_namespace or w.namespace
        instance = instance or w.annotated_instance or instance_id(w)
    out: list[tuple[str, str]] = [("service.name", session_service(session))]
    if namespace:
        out.append(("service.namespace", namespace))
    if instance:
        out.append(("service.instance.id", instance))
    return tuple(out)

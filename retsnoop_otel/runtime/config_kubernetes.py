"""The agent file's `kubernetes:` section: the pod metadata watch (off unless `metadata: true`).

    kubernetes:
      metadata: true            # k8s.pod.name, k8s.namespace.name, k8s.container.name on spans
      node_name: node-a         # default: $K8S_NODE_NAME (downward API spec.nodeName)
      api_server: https://...   # default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
      token_file: ...           # default: the service account's (re-read before each request)
      ca_file: ...              # default: the service account's ca.crt
      keep_deleted: 300         # seconds a deleted pod's names stay, for its last sessions
      well_known_labels: false  # true: app.kubernetes.io/instance and /name labels name a pod's service too
      cluster_name: prod-eu-1   # k8s.cluster.name on every resource (default: OTEL_RESOURCE_ATTRIBUTES' if any)

Checked with file:line like the rest of the file; what only the environment tells (a node name, an API
server, a mounted token) is checked when the agent starts and by `agent --check`, before anything is
loaded, so that the shipped file parses on any machine.
"""

from __future__ import annotations

from retsnoop_otel.runtime.config_keys import BOOL, STR, Key, Section, num, read_section
from retsnoop_otel.runtime.yaml_nodes import ConfigError, Nodes, yaml
from retsnoop_otel.workload.k8s_settings import KubeConfigError, KubernetesConfig, check_form

KUBERNETES = Section("kubernetes", KubernetesConfig, (
    Key("metadata", BOOL, "pod, namespace, container, owner and image names from a watch of this node's pods"),
    Key("node_name", STR, "this node's name (unset: $K8S_NODE_NAME)"),
    Key("api_server", STR, "the API server's URL (unset: the pod's service variables)"),
    Key("token_file", STR, "the service account's token, re-read before each request"),
    Key("ca_file", STR, "the CA that verifies the API server"),
    Key("keep_deleted", num(0, unit=" (s)"), "seconds a deleted pod's names stay, for its last sessions",
        field="keep_deleted_s"),
    Key("well_known_labels", BOOL, "a pod's app.kubernetes.io/instance, then app.kubernetes.io/name label names its "
        "service before its owners do (off: annotations and owners only)"),
    Key("cluster_name", STR, "k8s.cluster.name of the agent's and every workload's resource (unset: "
        "OTEL_RESOURCE_ATTRIBUTES' k8s.cluster.name, if any)",
        check=lambda name: None if name.strip() and name == name.strip() else
        "expected the cluster's name, without surrounding spaces (leave the key out for none)"),
))
KEYS = KUBERNETES.names


def parse_kubernetes(ctx: Nodes, node: yaml.Node) -> KubernetesConfig:
    values, m = read_section(ctx, node, "kubernetes", KUBERNETES)
    cfg = KubernetesConfig(**values)
    try:
        check_form(cfg)
    except KubeConfigError as exc:
        bad = m.get(exc.key.removeprefix("kubernetes."), m.get("metadata", node))
        raise ConfigError(f"{ctx.filename}:{bad.start_mark.line + 1}: {exc}") from None
    return cfg

"""The agent file's `kubernetes:` section: the pod metadata watch (off unless `metadata: true`).

    kubernetes:
      metadata: true            # k8s.pod.name, k8s.namespace.name, k8s.container.name on spans
      node_name: node-a         # default: $K8S_NODE_NAME (downward API spec.nodeName)
      api_server: https://...   # default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
      token_file: ...           # default: the service account's (re-read before each request)
      ca_file: ...              # default: the service account's ca.crt
      keep_deleted: 300         # seconds a deleted pod's names stay, for its last sessions

Checked with file:line like the rest of the file; what only the environment tells (a node name, an API
server, a mounted token) is checked when the agent starts and by `agent --check`, before anything is
loaded, so that the shipped file parses on any machine.
"""

from __future__ import annotations

import yaml

from retsnoop_otel.agent.yaml_nodes import ConfigError, Nodes, boolean, mapping, number, string
from retsnoop_otel.workload.k8s_settings import KubeConfigError, KubernetesConfig, check_form

KEYS = ("metadata", "node_name", "api_server", "token_file", "ca_file", "keep_deleted")


def parse_kubernetes(ctx: Nodes, node: yaml.Node) -> KubernetesConfig:
    m = mapping(ctx, node, "kubernetes", KEYS)
    d = KubernetesConfig()
    cfg = KubernetesConfig(
        metadata=boolean(ctx, m["metadata"], "kubernetes.metadata") if "metadata" in m else False,
        node_name=string(ctx, m["node_name"], "kubernetes.node_name") if "node_name" in m else None,
        api_server=string(ctx, m["api_server"], "kubernetes.api_server") if "api_server" in m else None,
        token_file=string(ctx, m["token_file"], "kubernetes.token_file") if "token_file" in m else d.token_file,
        ca_file=string(ctx, m["ca_file"], "kubernetes.ca_file") if "ca_file" in m else d.ca_file,
        keep_deleted_s=number(ctx, m["keep_deleted"], "kubernetes.keep_deleted", 0) if "keep_deleted" in m
        else d.keep_deleted_s)
    try:
        check_form(cfg)
    except KubeConfigError as exc:
        bad = m.get(exc.key.removeprefix("kubernetes."), m.get("metadata", node))
        raise ConfigError(f"{ctx.filename}:{bad.start_mark.line + 1}: {exc}") from None
    return cfg

"""Whether a pod spec may be scheduled on a node, from the node's labels: the pod's nodeSelector and its required
node affinity, evaluated as the Kubernetes scheduler does (terms ORed, a term's expressions ANDed). The manifests'
tests ask it of both architectures the image is built for (tests/test_image_arm64.py) and of others."""

from __future__ import annotations

IMAGE_ARCHITECTURES = ("amd64", "arm64")  # GOARCH names, as in the node label kubernetes.io/arch


def _matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"node selector operator {op} is not handled by this check")


def schedules_on(pod: dict, labels: dict[str, str]) -> bool:
    """True if a node with these labels satisfies the pod's nodeSelector and required node affinity."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    terms = required["nodeSelectorTerms"]
    assert not [t for t in terms if t.get("matchFields")], "matchFields is not handled by this check"
    return any(all(_matches(e, labels) for e in term.get("matchExpressions", [])) for term in terms)


def node(arch: str, **labels: str) -> dict[str, str]:
    """The labels of a Linux node of this architecture, and any others."""
    return {"kubernetes.io/os": "linux", "kubernetes.io/arch": arch, **labels}

"""The Helm chart (config/helm/retsnoop-otel) checked without a cluster, with the pinned helm that `make setup`
builds (tests/peers/build-helm).

`helm lint --strict` of the default values and of every toggle on; the default render describes the same objects as
the kustomize base (config/k8s/base: DaemonSet, RBAC, priority class, agent config), the toggles render the same
Prometheus Operator objects and dashboards as the monitoring overlay; the agent config rendered from values passes
the agent's own parser; the endpoint and headers become env and a Secret; every object carries the recommended
app.kubernetes.io labels; the image is named alike in the chart and the kustomize base; and the renders pass the
Kubernetes API schemas, as tests/test_k8s_manifests.py checks the base.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from retsnoop_otel.agent.config_file import parse_config
from tests.gen_k8s_monitoring import chart_files_stale
from tests.node_scheduling import IMAGE_ARCHITECTURES, node, schedules_on

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "config" / "helm" / "retsnoop-otel"
HELM_VERSION = "v4.3.2"  # tests/peers/build-helm
CACHE = Path(os.environ.get("RETSNOOP_OTEL_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retsnoop-otel")
HELM = CACHE / f"helm-{HELM_VERSION}" / "helm"
RELEASE, NAMESPACE = "retsnoop-otel", "retsnoop-otel"  # the kustomize base's names
RECOMMENDED = ("name", "instance", "version", "component", "part-of", "managed-by")
MANAGED_BY = "app.kubernetes.io/managed-by"
TOGGLES = {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}, "dashboards": {"enabled": True},
           "createNamespace": True}
OLDEST_KUBERNETES = "1.30.0"
MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


@pytest.fixture(scope="module")
def helm() -> str:
    if not os.access(HELM, os.X_OK):
        pytest.fail(f"{HELM}: no helm {HELM_VERSION} there: run `make setup` (tests/peers/build-helm builds it)")
    return str(HELM)


@pytest.fixture(scope="module")
def template(helm, tmp_path_factory) -> Callable[..., list[dict]]:
    def render(values: dict | None = None) -> list[dict]:
        path = tmp_path_factory.mktemp("values") / "values.yaml"
        path.write_text(yaml.safe_dump(values or {}))
        res = subprocess.run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(path)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return _docs(res.stdout)
    return render


def _unmanaged(doc: dict) -> dict:
    """The object without app.kubernetes.io/managed-by (Helm vs kustomize), anywhere it is set."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != MANAGED_BY}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    return strip(doc)


# ---- helm lint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, TOGGLES], ids=["defaults", "toggles"])
def test_lint_is_clean(helm, tmp_path, values) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    res = subprocess.run([helm, "lint", "--strict", str(CHART), "-f", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[WARNING]" not in res.stdout and "[ERROR]" not in res.stdout, res.stdout


def test_helm_is_the_pinned_version(helm) -> None:
    res = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout.startswith(HELM_VERSION), res.stdout + res.stderr


# ---- the same objects as the kustomize base ----------------------------------------------------------


def test_default_render_is_the_kustomize_base(template, kustomize) -> None:
    """The same DaemonSet (containers, image, args, env, capabilities, mounts, volumes, probes, host namespaces,
    service account, scheduling), the same RBAC, priority class and agent config; only managed-by differs, and
    the Namespace comes from the chart only with createNamespace (helm installs into an existing one)."""
    chart = {_key(d): _unmanaged(d) for d in template()}
    base = {_key(d): _unmanaged(d) for d in kustomize("base")}
    assert set(base) - set(chart) == {("Namespace", NAMESPACE)}
    assert set(chart) <= set(base), set(chart) - set(base)
    config = ("ConfigMap", "retsnoop-otel-config")
    assert yaml.safe_load(chart[config]["data"].pop("agent.yaml")) == \
        yaml.safe_load(base[config]["data"].pop("agent.yaml"))
    for key in chart:
        assert chart[key] == base[key], key
    # the parts the issue names, spelled out so that a difference says where it is
    ds = chart[("DaemonSet", "retsnoop-otel")]["spec"]["template"]["spec"]
    (agent,) = ds["containers"]
    assert agent["image"] == "ghcr.io/retsnoop-otel/retsnoop-otel:0.1.0"
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                        "add": ["BPF", "PERFMON", "SYSLOG", "SYS_RESOURCE"]}
    assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(agent)
    assert ds["hostPID"] is True and ds["serviceAccountName"] == "retsnoop-otel"


def test_create_namespace_renders_the_bases_namespace(template, kustomize) -> None:
    chart = {_key(d): _unmanaged(d) for d in template({"createNamespace": True})}
    base = {_key(d): _unmanaged(d) for d in kustomize("base")}
    assert chart[("Namespace", NAMESPACE)] == base[("Namespace", NAMESPACE)]


def test_toggles_render_the_monitoring_overlays_objects(template, kustomize) -> None:
    defaults = {_key(d) for d in template()}
    assert not {k for k in defaults if k[0] in MONITORING_KINDS or k == ("ConfigMap", "retsnoop-otel-dashboards")}
    chart = {_key(d): _unmanaged(d) for d in template(TOGGLES)}
    overlay = {_key(d): _unmanaged(d) for d in kustomize("monitoring")}
    added = set(overlay) - {_key(d) for d in kustomize("base")}
    assert added == {("PodMonitor", "retsnoop-otel"), ("PrometheusRule", "retsnoop-otel"),
                     ("ConfigMap", "retsnoop-otel-dashboards")}
    for key in added:
        assert chart[key] == overlay[key], key


def test_monitoring_labels_are_added(template) -> None:
    docs = template({**TOGGLES, "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
                     "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}})
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:
            assert doc["metadata"]["labels"]["release"] == "kps", doc["kind"]


def test_chart_files_are_the_dashboards_and_alerts() -> None:
    assert chart_files_stale() == [], "run .venv/bin/python tests/gen_k8s_monitoring.py"


# ---- values -------------------------------------------------------------------------------------------


def _agent_config(docs: list[dict]) -> str:
    (cm,) = [d for d in docs if _key(d) == ("ConfigMap", "retsnoop-otel-config")]
    return cm["data"]["agent.yaml"]


def _container(docs: list[dict]) -> dict:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    return agent


def test_endpoint_and_headers_go_to_env_and_a_secret(template) -> None:
    docs = template({"exporter": {"endpoint": "https://otlp.example.com:4318", "protocol": "http/protobuf",
                                  "headers": "authorization=Bearer s3cret"}})
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert secret["stringData"] == {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret"}
    env = {e["name"]: e for e in _container(docs)["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "https://otlp.example.com:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "http/protobuf"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"] == {
        "secretKeyRef": {"name": secret["metadata"]["name"], "key": "OTEL_EXPORTER_OTLP_HEADERS"}}
    assert "s3cret" not in yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])


def test_existing_secret_is_referenced_not_made(template) -> None:
    docs = template({"exporter": {"existingSecret": "my-otlp", "existingSecretKey": "headers"}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    env = {e["name"]: e for e in _container(docs)["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {"name": "my-otlp", "key": "headers"}


def test_default_agent_config_passes_the_agents_parser(template) -> None:
    cfg = parse_config(_agent_config(template()), "chart:agent.yaml")
    assert [ps.name for ps in cfg.runtime.probe_sets] == ["bpf_errors"]


def test_probe_sets_sampling_and_config_values_pass_the_agents_parser(template) -> None:
    values = {
        "probeSets": [{"name": "opens", "entry": ["do_sys_openat2"], "mode": "calls"},
                      {"name": "loads", "entry": ["bpf_prog_load"], "sampling": {"success_rate_per_s": 5}}],
        "sampling": {"success_probability": 0.1},
        "config": {"kubernetes": {"metadata": False}, "logging": {"level": "debug"}},
    }
    docs = template(values)
    text = _agent_config(docs)
    cfg = parse_config(text, "chart:agent.yaml")
    assert [ps.name for ps in cfg.runtime.probe_sets] == ["opens", "loads"]
    raw = yaml.safe_load(text)
    assert raw["probe_sets"][0]["sampling"] == {"success_probability": 0.1}  # the chart's default sampling
    assert raw["probe_sets"][1]["sampling"] == {"success_rate_per_s": 5}  # a set's own wins
    assert raw["metrics"] == {"listen": "0.0.0.0:9464"} and raw["logging"] == {"format": "json", "level": "debug"}
    # no metadata watch: no API token in the pod
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_scheduling_and_resources_values(template) -> None:
    """Helm merges maps with the defaults: a default key goes with null (nodeSelector's os here); a list of the
    user's (nodeSelectorTerms) replaces the default's."""
    values = {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
              "nodeSelector": {"kubernetes.io/os": None, "tracing": "on"},
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                  {"matchExpressions": [{"key": "tracing", "operator": "In", "values": ["on"]}]}]}}},
              "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
              "priorityClass": {"create": False, "name": "my-class"}}
    docs = template(values)
    assert not [d for d in docs if d["kind"] == "PriorityClass"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["nodeSelector"] == {"tracing": "on"}
    assert pod["affinity"] == values["affinity"] and pod["priorityClassName"] == "my-class"
    assert _container(docs)["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                             "limits": {"cpu": "1", "memory": "1Gi"}}


def test_default_schedules_on_both_image_architectures(template) -> None:
    """amd64 and arm64 nodes get the agent (the image is built for both), others not; a nodeSelector of the user's is
    added to the default os one and keeps the architectures."""
    for values in ({}, {"nodeSelector": {"tracing": "on"}}):
        (ds,) = [d for d in template(values) if d["kind"] == "DaemonSet"]
        pod = ds["spec"]["template"]["spec"]
        extra = values.get("nodeSelector", {})
        for arch in IMAGE_ARCHITECTURES:
            assert schedules_on(pod, node(arch, **extra)), (arch, values)
        assert not schedules_on(pod, node("s390x", **extra)), values
        if extra:
            assert not schedules_on(pod, node("arm64")), "the user's nodeSelector applies"


def test_image_values(template) -> None:
    docs = template({"image": {"repository": "registry.example.com/tools/retsnoop-otel", "tag": "dev"}})
    assert _container(docs)["image"] == "registry.example.com/tools/retsnoop-otel:dev"


# ---- labels, image, schemas ----------------------------------------------------------------------------


def test_every_object_carries_the_recommended_labels(template, kustomize) -> None:
    renders = {"chart": template(TOGGLES), "base": kustomize("base"), "monitoring": kustomize("monitoring")}
    for where, docs in renders.items():
        for doc in docs:
            labels = doc["metadata"].get("labels", {})
            missing = [k for k in RECOMMENDED if f"app.kubernetes.io/{k}" not in labels]
            assert not missing, (where, _key(doc), missing)
            if doc["kind"] == "DaemonSet":
                pod_labels = doc["spec"]["template"]["metadata"]["labels"]
                assert all(f"app.kubernetes.io/{k}" in pod_labels for k in RECOMMENDED), where
                assert doc["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "retsnoop-otel"}, where


def test_the_image_is_named_alike_in_the_chart_and_the_base() -> None:
    """The chart names the image (values.yaml image.repository, Chart.yaml appVersion as the tag); the kustomize
    base, the package version and the Dockerfile's VERSION must agree."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (image,) = yaml.safe_load((REPO / "config" / "k8s" / "base" / "kustomization.yaml").read_text())["images"]
    assert values["image"]["tag"] == ""  # the tag is appVersion
    assert (image["newName"], image["newTag"]) == (values["image"]["repository"], chart["appVersion"])
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert version and version.group(1) == chart["appVersion"]
    dockerfile = re.search(r"^ARG VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert dockerfile and dockerfile.group(1) == chart["appVersion"]
    labels = yaml.safe_load((REPO / "config" / "k8s" / "base" / "kustomization.yaml").read_text())["labels"]
    assert {"app.kubernetes.io/version": chart["appVersion"]}.items() <= labels[0]["pairs"].items()


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_renders_match_the_kubernetes_schemas(template, version) -> None:
    import kubernetes_validate as kv

    version = kv.latest_version() if version == "latest" else version
    renders = [template(), template(TOGGLES), template({"exporter": {"headers": "a=b"}})]
    for doc in (d for docs in renders for d in docs):
        if doc["kind"] not in MONITORING_KINDS:  # custom resources: no schema here
            kv.validate(doc, version, strict=True)


@pytest.mark.parametrize("values, error", [
    ({"podMonitr": {"enabled": True}}, "additional properties 'podMonitr' not allowed"),
    ({"exporter": {"protocol": "http/json"}}, "/exporter/protocol"),  # the agent refuses http/json
    ({"priorityClass": {"value": 2_000_000_000}}, "/priorityClass/value"),  # a system class's range
])
def test_values_schema_refuses_mistakes(helm, tmp_path, values, error) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    res = subprocess.run([helm, "template", RELEASE, str(CHART), "-f", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and error in res.stderr, res.stderr

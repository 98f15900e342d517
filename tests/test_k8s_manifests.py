"""The Kubernetes manifests (config/k8s/base/daemonset.yaml, config/k8s/) checked without a cluster.

No cluster is reachable here, so nothing is applied. The core objects are checked against the API
schemas kubernetes-validate ships (offline; strict, so a misspelt field fails) for the oldest
Kubernetes the manifest supports and for the newest. The Prometheus Operator objects are custom
resources without a schema here: PodMonitor and PrometheusRule are checked field by field, the rules
through promtool (the same unit tests as dashboards/alerts.yml), the PodMonitor's relabelings inside
an equivalent scrape config through `promtool check config`. The policy part is what managed clusters
and reviewers ask of a privileged agent: our own PriorityClass, the namespace's pod-security level,
the runtime default seccomp and AppArmor profiles, a start-up probe, the service-account token mounted
exactly when the shipped config turns the pod metadata watch on (with RBAC that reads pods and nothing
else), and every capability and host access mapped to the code that needs it.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from retsnoop_otel.agent.config_file import parse_config
from retsnoop_otel.kernel import caps
from tests.dashboard_files import (
    ALERTS_TEST,
    SCRAPE_CONFIG,
    load_dashboards,
    promtool,
    variable_defaults,
)
from tests.gen_k8s_monitoring import (
    DASHBOARDS,
    DASHBOARDS_OUTPUT,
    SIDECAR_LABEL,
    render,
    render_dashboards,
    rule_groups,
)
from tests.gen_k8s_monitoring import OUTPUT as PROMETHEUS_RULE
from tests.node_scheduling import IMAGE_ARCHITECTURES, node, schedules_on

REPO = Path(__file__).resolve().parents[1]
DAEMONSET = REPO / "config" / "k8s" / "base" / "daemonset.yaml"
PODMONITOR = REPO / "config" / "k8s" / "monitoring" / "podmonitor.yaml"
UNIT = REPO / "config" / "retsnoop-otel.service"
OLDEST_KUBERNETES = "1.30.0"  # securityContext.appArmorProfile is GA since 1.30
CORE_KINDS = {"Namespace", "PriorityClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
              "DaemonSet"}
SYSTEM_PRIORITY_CLASSES = {"system-node-critical", "system-cluster-critical"}
MAX_USER_PRIORITY = 1_000_000_000  # the API server refuses higher values outside the system classes

# Every capability the agent's container adds: what the agent does with it, and where the code shows it.
CAPABILITY_USES = {
    "BPF": ("load the BPF programs, create and read their maps (bpf())",
            "retsnoop_otel/kernel/caps.py", '{"CAP_BPF", "CAP_PERFMON"}'),
    "PERFMON": ("attach fentry/fexit, kprobes and kprobe_multi (perf_event_open(), BPF links), kernel stacks",
                "retsnoop_otel/kernel/bpfsys.py", "def perf_event_open"),
    "SYSLOG": ("real addresses in /proc/kallsyms when kernel.kptr_restrict=1 (zeros without it)",
               "retsnoop_otel/symbols/kallsyms.py", "missing CAP_SYSLOG"),
    "SYS_RESOURCE": ("RLIMIT_MEMLOCK above its hard limit on kernels older than 5.11 (libbpf raises it for the "
                     "maps), and RLIMIT_NOFILE's hard limit for kprobe mode (four fds per function)",
                     "retsnoop_otel/kernel/caps.py", "Root (CAP_SYS_RESOURCE) may raise the hard limit"),
}
# Needed only by what the shipped agent config turns on: test_process_reading_and_sys_ptrace_go_together.
CONFIG_CAPABILITIES = {
    "SYS_PTRACE": ("app_context and user_stacks read other processes' /proc/PID/{maps,mem,root}: ptrace-read "
                   "access, which for processes of other users or holding capabilities the agent lacks takes "
                   "CAP_SYS_PTRACE", "retsnoop_otel/appctx/process_context.py", "needs ptrace-read access"),
}
# Never added.
NOT_ADDED = {
    "SYS_ADMIN": "only kernels older than 5.8 (no CAP_BPF/CAP_PERFMON) need it; caps.can_trace accepts it instead",
}
# Every host namespace and host path the pod uses: why, and where the code reads it.
HOST_ACCESS = {
    "hostPID": ("the kernel reports host pids: /proc/<pid> must be that process when the agent reads it "
                "(app_context, user_stacks, /proc/PID/cgroup and /proc/PID/exe for the workload)",
                "retsnoop_otel/appctx/watch.py", 'f"{self.proc_root}/{tgid}"'),
    "/sys/fs/cgroup": ("the host's cgroup v2 hierarchy: a session's cgroup id (the directory's inode) -> its path "
                       "-> container.id and k8s.pod.uid", "retsnoop_otel/workload/cgroupfs.py",
                       'DEFAULT_MOUNT = "/sys/fs/cgroup"'),
    "/sys/kernel/btf": ("vmlinux BTF: return types and fentry attach", "retsnoop_otel/kernel/features.py",
                        '"sys/kernel/btf/vmlinux"'),
    "/sys/kernel/tracing": ("available_filter_functions: what ftrace can attach to",
                            "retsnoop_otel/kernel/tracefs.py", '"sys/kernel/tracing"'),
    "/sys/kernel/debug": ("the same under debugfs, on hosts that mount tracefs only there",
                          "retsnoop_otel/kernel/tracefs.py", '"sys/kernel/debug/tracing"'),
    "/boot": ("/boot/config-<release> (why a feature is missing) and vmlinux with DWARF",
              "retsnoop_otel/kernel/kconfig.py", 'f"boot/config-{release}"'),
    "/usr/lib/debug": ("vmlinux with DWARF from the distribution's debug packages (source lines)",
                       "retsnoop_otel/symbols/vmlinux.py", 'f"usr/lib/debug/boot/vmlinux-{release}"'),
    "/etc/machine-id": ("host.id on the resource: the node's machine id, not the image's",
                        "retsnoop_otel/export/resource.py", '"etc/machine-id"'),
}
# What Pod Security "baseline" lets a pod add (Kubernetes Pod Security Standards).
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def core() -> dict[str, dict]:
    docs = load_docs(DAEMONSET)
    kinds = [d["kind"] for d in docs]
    assert len(set(kinds)) == len(kinds) and set(kinds) == CORE_KINDS, kinds
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def pod(core) -> dict:
    return core["DaemonSet"]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def agent(pod) -> dict:
    (container,) = pod["containers"]
    return container


def namespace(core) -> str:
    return core["Namespace"]["metadata"]["name"]


def added_capabilities(agent) -> set[str]:
    return set(agent["securityContext"]["capabilities"]["add"])


# ---- schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_core_objects_match_the_kubernetes_schemas(version: str) -> None:
    import kubernetes_validate as kv  # a dev dependency; its schemas ship with it (no network)

    version = kv.latest_version() if version == "latest" else version
    for doc in load_docs(DAEMONSET):
        kv.validate(doc, version, strict=True)


def test_kubernetes_1_29_refuses_only_the_apparmor_field() -> None:
    """Why 1.30 is the oldest: the first version whose schema has securityContext.appArmorProfile."""
    import kubernetes_validate as kv

    for doc in load_docs(DAEMONSET):
        if doc["kind"] != "DaemonSet":
            kv.validate(doc, "1.29.0", strict=True)
            continue
        with pytest.raises(kv.ValidationError, match="'appArmorProfile' was unexpected"):
            kv.validate(doc, "1.29.0", strict=True)
        sc = doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        sc.pop("appArmorProfile")
        kv.validate(doc, "1.29.0", strict=True)


def test_namespaced_objects_live_in_the_agents_namespace(core) -> None:
    ns = namespace(core)
    for doc in [*core.values(), *load_docs(PODMONITOR), *load_docs(PROMETHEUS_RULE)]:
        if doc["kind"] in {"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding"}:
            assert "namespace" not in doc["metadata"], doc["kind"]
        else:
            assert doc["metadata"]["namespace"] == ns, doc["kind"]


# ---- policy --------------------------------------------------------------------------------------


def test_schedules_on_both_image_architectures_only(pod) -> None:
    """The image is built for amd64 and arm64 (one manifest list): nodes of either get the agent; a node of another
    architecture, for which no image exists, does not (it would sit in ImagePullBackOff); nor does a Windows node."""
    for arch in IMAGE_ARCHITECTURES:
        assert schedules_on(pod, node(arch)), arch
    assert not schedules_on(pod, node("s390x")) and not schedules_on(pod, node("ppc64le"))
    assert not schedules_on(pod, {"kubernetes.io/os": "windows", "kubernetes.io/arch": "amd64"})


def test_own_priority_class_not_a_system_one(core, pod) -> None:
    ns = namespace(core)
    assert ns == "kube-system" or pod["priorityClassName"] not in SYSTEM_PRIORITY_CLASSES
    pc = core["PriorityClass"]
    assert pod["priorityClassName"] == pc["metadata"]["name"]
    assert 0 < pc["value"] <= MAX_USER_PRIORITY and pc["globalDefault"] is False
    assert pc["preemptionPolicy"] in {"PreemptLowerPriority", "Never"}


def test_namespace_enforces_the_level_the_pod_needs(core, pod, agent) -> None:
    labels = core["Namespace"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    # and "baseline" would refuse the pod: the label is not wider than needed
    beyond_baseline = [name for name, hit in [
        ("hostPID", pod.get("hostPID")),
        ("hostPath volumes", any("hostPath" in v for v in pod["volumes"])),
        ("capabilities", added_capabilities(agent) - BASELINE_CAPABILITIES),
    ] if hit]
    assert beyond_baseline


def test_runtime_default_seccomp_and_apparmor(core, pod, agent) -> None:
    assert "Unconfined" not in yaml.safe_dump(core["DaemonSet"]), "no Unconfined profile anywhere in the pod"
    sc = agent["securityContext"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["appArmorProfile"] == {"type": "RuntimeDefault"}
    assert not any(k.startswith("container.apparmor.security.beta.kubernetes.io")
                   for k in core["DaemonSet"]["spec"]["template"]["metadata"].get("annotations", {}))
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")


def test_each_capability_is_used_by_the_agent(agent) -> None:
    added = added_capabilities(agent)
    assert added - set(CONFIG_CAPABILITIES) == set(CAPABILITY_USES), \
        f"map each added capability to its use: {sorted(added)}"
    assert not added & set(NOT_ADDED), "see NOT_ADDED"
    for cap, (_, path, needle) in {**CAPABILITY_USES, **CONFIG_CAPABILITIES}.items():
        assert needle in (REPO / path).read_text(), (cap, path, needle)
    base = {f"CAP_{c}" for c in CAPABILITY_USES}
    assert base <= set(caps.TRACING_CAPS), "the agent checks and reports each of them (kernel/caps.py)"
    assert caps.can_trace(base)
    for needed in ("CAP_BPF", "CAP_PERFMON"):
        assert not caps.can_trace(base - {needed}), needed
    # the systemd unit runs the same agent with the same needs
    unit = dict(line.split("=", 1) for line in UNIT.read_text().splitlines() if line.startswith("AmbientCapabilities"))
    assert set(unit["AmbientCapabilities"].split()) == base


def test_process_reading_and_sys_ptrace_go_together(core, agent) -> None:
    """SYS_PTRACE is added exactly when a probe set of the shipped config reads other processes."""
    cfg = parse_config(core["ConfigMap"]["data"]["agent.yaml"], "daemonset.yaml:agent.yaml")
    reads_processes = any(ps.app_context or ps.user_stacks for ps in cfg.runtime.probe_sets)
    assert ("SYS_PTRACE" in added_capabilities(agent)) == reads_processes


def test_each_host_access_is_used_by_the_agent(pod, agent) -> None:
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    used = host_paths | ({"hostPID"} if pod.get("hostPID") else set())
    assert used == set(HOST_ACCESS), f"map each host access to its use: {sorted(used)}"
    for what, (_, path, needle) in HOST_ACCESS.items():
        assert needle in (REPO / path).read_text(), (what, path, needle)
    host_volumes = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    for mount in agent["volumeMounts"]:
        if mount["name"] in host_volumes:
            assert mount.get("readOnly") is True, mount


def test_startup_probe_covers_a_long_attach(core, agent) -> None:
    health = {"path": "/healthz", "port": "metrics"}
    assert '"/healthz"' in (REPO / "retsnoop_otel/metrics/http_app.py").read_text()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"] == health, probe
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    cfg = parse_config(core["ConfigMap"]["data"]["agent.yaml"], "daemonset.yaml:agent.yaml")
    assert ports["metrics"] == cfg.runtime.metrics.port
    startup = agent["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    # /healthz turns 503 after stall_after_s without a poll, which a first attach can exceed by minutes
    assert budget >= 300 > cfg.runtime.metrics.stall_after_s
    assert "initialDelaySeconds" not in agent["livenessProbe"], "the start-up probe holds liveness back"


def _agent_uses_the_api() -> list[str]:
    pattern = re.compile(r"/api/v1/|KUBERNETES_SERVICE_HOST|serviceaccount", re.M)
    return [str(p.relative_to(REPO)) for p in sorted((REPO / "retsnoop_otel").rglob("*.py"))
            if pattern.search(p.read_text())]


def test_service_account_token_only_with_the_metadata_watch(core, pod, agent) -> None:
    """The token is mounted exactly when the shipped config watches pods; only the watch talks to the API."""
    sa = core["ServiceAccount"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    users = set(_agent_uses_the_api())
    assert "retsnoop_otel/workload/k8s_watch.py" in users and users <= {
        "retsnoop_otel/workload/k8s_watch.py", "retsnoop_otel/workload/k8s_settings.py",
        "retsnoop_otel/runtime/config_kubernetes.py"}, users
    cfg = parse_config(core["ConfigMap"]["data"]["agent.yaml"], "daemonset.yaml:agent.yaml")
    assert pod["automountServiceAccountToken"] is cfg.runtime.kubernetes.metadata is True
    assert sa["automountServiceAccountToken"] is False, "only this pod gets the token, not every pod of the account"
    # the watch's defaults are what the kubelet mounts and sets: token and CA of the account, the API server's
    # service variables, and the node name from the downward API
    from retsnoop_otel.workload.k8s_settings import NODE_ENV, SA_DIR, KubernetesConfig
    assert (cfg.runtime.kubernetes.node_name, cfg.runtime.kubernetes.api_server) == (None, None)
    assert cfg.runtime.kubernetes.token_file == KubernetesConfig().token_file == f"{SA_DIR}/token"
    assert SA_DIR == "/var/run/secrets/kubernetes.io/serviceaccount"
    env = {e["name"]: e for e in agent["env"]}
    assert env[NODE_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_rbac_reads_pods_only(core) -> None:
    role, binding, sa = core["ClusterRole"], core["ClusterRoleBinding"], core["ServiceAccount"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]


# ---- PodMonitor ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podmonitor() -> dict:
    (pm,) = load_docs(PODMONITOR)
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    assert pm["metadata"]["name"]
    return pm


def _scrape_job() -> dict:
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    return next(j for j in cfg["scrape_configs"] if j["job_name"] == "retsnoop-otel")


def test_podmonitor_selects_the_agents_metrics_port(core, agent, podmonitor) -> None:
    spec = podmonitor["spec"]
    pod_labels = core["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "namespaceSelector" not in spec, "its own namespace, the DaemonSet's"
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in agent["ports"]}
    assert endpoint["path"] == "/metrics"
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings"}


def test_podmonitor_labels_match_the_dashboards_and_the_scrape_config(core, podmonitor) -> None:
    spec = podmonitor["spec"]
    pod_labels = core["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    job = pod_labels[spec["jobLabel"]]  # the operator names the job after this pod label's value
    assert job == _scrape_job()["job_name"]
    for name, dash in load_dashboards().items():  # the dashboards open on this job (their `job` variable)
        assert variable_defaults(dash)["job"] == job, name
    (endpoint,) = spec["podMetricsEndpoints"]
    (instance,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "instance"]
    assert instance["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    keep = _scrape_job()["metric_relabel_configs"]
    assert [_snake(r) for r in endpoint["metricRelabelings"]] == keep


_FIELDS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex", "action": "action",
           "replacement": "replacement", "separator": "separator", "modulus": "modulus"}


def _snake(relabeling: dict) -> dict:
    unknown = set(relabeling) - set(_FIELDS)
    assert not unknown, f"not a RelabelConfig field: {unknown}"
    return {_FIELDS[k]: v for k, v in relabeling.items()}


def test_podmonitor_relabelings_pass_promtool(tmp_path: Path, podmonitor) -> None:
    """The operator turns the PodMonitor into a scrape job; the same relabelings in a plain job (Debian's
    promtool has no Kubernetes discovery, so a static target carries the discovered pod's node label)."""
    (endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    job = {"job_name": "podmonitor", "metrics_path": endpoint["path"], "scrape_interval": endpoint["interval"],
           "scrape_timeout": endpoint["scrapeTimeout"],
           "static_configs": [{"targets": ["10.0.0.1:9464"], "labels": {"__meta_kubernetes_pod_node_name": "node-a"}}],
           "relabel_configs": [_snake(r) for r in endpoint["relabelings"]],
           "metric_relabel_configs": [_snake(r) for r in endpoint["metricRelabelings"]]}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    res = promtool("check", "config", path)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- PrometheusRule ------------------------------------------------------------------------------


def test_prometheusrule_is_generated_from_the_alerts() -> None:
    assert PROMETHEUS_RULE.read_text() == render(), \
        "config/k8s/monitoring/prometheusrule.yaml is out of date: run .venv/bin/python tests/gen_k8s_monitoring.py"


def test_prometheusrule_structure() -> None:
    (rule,) = load_docs(PROMETHEUS_RULE)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] and set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == rule_groups()
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"], group
        for r in group["rules"]:
            assert {"alert", "expr", "labels", "annotations"} <= set(r) and set(r) <= {
                "alert", "expr", "for", "labels", "annotations"}, r.get("alert")


def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    """Extracted from the custom resource: `promtool check rules`, then the unit tests of alerts.yml."""
    (rule,) = load_docs(PROMETHEUS_RULE)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    res = promtool("check", "rules", rules)
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert res.returncode == 0 and f"SUCCESS: {count} rules found" in res.stdout, res.stdout + res.stderr
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    tests["rule_files"] = [rules.name]
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    res = promtool("test", "rules", tmp_path / "rules_test.yml")
    assert res.returncode == 0, res.stdout + res.stderr


# ---- TLS and basic auth on the metrics port, as the comments say ------------------------------------


def _uncommented(text: str, marker: str) -> str:
    """The commented-out YAML right after the first line that contains `marker`, uncommented."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line) + 1
    block = []
    for line in lines[start:]:
        m = re.match(r"^(\s*)# ?(.*)$", line)
        if not m or not m.group(2).strip():
            break
        block.append(m.group(1) + m.group(2))
    return textwrap.dedent("\n".join(block)) + "\n"


def _tls_variant() -> tuple[dict, dict, str, str]:
    """The DaemonSet, the ConfigMap's agent.yaml and web.yml, with the commented-out TLS parts turned on."""
    text = DAEMONSET.read_text()
    docs = {d["kind"]: d for d in load_docs(DAEMONSET)}
    pod_spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    probe_http = yaml.safe_load(_uncommented(text, "user of basic_auth_users"))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        container[probe]["httpGet"].update(probe_http)
    container["volumeMounts"] += yaml.safe_load(_uncommented(text, "            # metrics.web_config_file:"))
    pod_spec["volumes"] += yaml.safe_load(_uncommented(text, "the agent reloads them when the kubelet"))
    agent_yaml = docs["ConfigMap"]["data"]["agent.yaml"].replace("# web_config_file:", "web_config_file:")
    web_yml = yaml.safe_load(_uncommented(text, "# metrics.web_config_file (see agent.yaml below)"))["web.yml"]
    return docs["DaemonSet"], docs["ConfigMap"], agent_yaml, web_yml


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "latest"])
def test_the_commented_tls_variant_is_valid(version: str) -> None:
    import kubernetes_validate as kv

    daemonset, _cm, _agent_yaml, _web = _tls_variant()
    kv.validate(daemonset, kv.latest_version() if version == "latest" else version, strict=True)


def test_the_commented_tls_variant_fits_together() -> None:
    """The agent reads web.yml where the volume puts it, web.yml names the files the volume holds, and the
    probes send the probe user over HTTPS."""
    import base64

    import bcrypt

    from retsnoop_otel.metrics.web_config import parse_web_config
    daemonset, configmap, agent_yaml, web_text = _tls_variant()
    cfg = parse_config(agent_yaml, "daemonset.yaml:agent.yaml")
    assert cfg.runtime.metrics.web_config_file is not None
    pod_spec = daemonset["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "web")
    assert os.path.dirname(cfg.runtime.metrics.web_config_file) == mount["mountPath"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "web"]
    sources = volume["projected"]["sources"]
    assert next(s["configMap"]["name"] for s in sources if "configMap" in s) == configmap["metadata"]["name"]
    projected = {item["path"] for s in sources for kind in ("configMap", "secret") for item in s.get(kind, {})
                 .get("items", [])}
    hashed = bcrypt.hashpw(b"probe-password", bcrypt.gensalt(4)).decode()
    web, _ = parse_web_config(web_text.replace("$2y$10$...", hashed), cfg.runtime.metrics.web_config_file)
    assert web.tls is not None and set(web.users) == {"prometheus", "probe"}
    assert {os.path.basename(web.tls.cert_file), os.path.basename(web.tls.key_file), "web.yml"} == projected
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        http_get = container[probe]["httpGet"]
        (header,) = http_get["httpHeaders"]
        scheme, token = header["value"].split()
        assert (http_get["scheme"], header["name"], scheme) == ("HTTPS", "Authorization", "Basic")
        assert base64.b64decode(token) == b"probe:probe-password"


# ---- Grafana dashboards ConfigMap ----------------------------------------------------------------


def test_dashboards_configmap_is_generated_from_the_dashboards() -> None:
    assert DASHBOARDS_OUTPUT.read_text() == render_dashboards(), \
        "config/k8s/monitoring/grafana-dashboards.yaml is out of date: run .venv/bin/python tests/gen_k8s_monitoring.py"


def test_dashboards_configmap_is_what_the_sidecar_loads() -> None:
    import kubernetes_validate as kv

    (cm,) = load_docs(DASHBOARDS_OUTPUT)
    kv.validate(cm, kv.latest_version(), strict=True)
    assert cm["metadata"]["labels"][SIDECAR_LABEL[0]] == SIDECAR_LABEL[1]
    assert cm["metadata"]["namespace"] == next(d for d in load_docs(DAEMONSET) if d["kind"] == "DaemonSet")[
        "metadata"]["namespace"]
    assert cm["data"] == {p.name: p.read_text() for p in DASHBOARDS} and len(cm["data"]) == 3
    assert len(DASHBOARDS_OUTPUT.read_bytes()) < 1024 * 1024  # a ConfigMap holds at most 1 MiB


# ---- kustomize -----------------------------------------------------------------------------------

IMAGE = "ghcr.io/retsnoop-otel/retsnoop-otel:0.1.0"


def _key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _without_added_labels(doc: dict) -> dict:
    """The object without the recommended labels kustomization.yaml adds (the files carry the name on a few)."""
    added = {f"app.kubernetes.io/{k}" for k in ("name", "instance", "version", "component", "part-of",
                                                "managed-by")}
    doc = yaml.safe_load(yaml.safe_dump(doc))
    parts = [doc["metadata"]]
    if doc["kind"] == "DaemonSet":
        parts.append(doc["spec"]["template"]["metadata"])
    for meta in parts:
        labels = {k: v for k, v in meta.get("labels", {}).items() if k not in added}
        if labels:
            meta["labels"] = labels
        else:
            meta.pop("labels", None)
    return doc


def test_base_renders_the_daemonset_with_the_image_it_names(kustomize) -> None:
    import kubernetes_validate as kv

    rendered = {_key(d): d for d in kustomize("base")}
    source = {_key(d): d for d in load_docs(DAEMONSET)}
    assert set(rendered) == set(source)
    (c,) = rendered[("DaemonSet", "retsnoop-otel")]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == IMAGE
    c["image"] = "retsnoop-otel"
    rendered = {k: _without_added_labels(d) for k, d in rendered.items()}
    source = {k: _without_added_labels(d) for k, d in source.items()}
    assert rendered == source  # nothing but the image and the recommended labels change
    for doc in kustomize("base"):
        kv.validate(doc, OLDEST_KUBERNETES, strict=True)


def test_monitoring_overlay_adds_the_operator_objects_and_the_dashboards(kustomize) -> None:
    base = {_key(d) for d in kustomize("base")}
    overlay = {_key(d): d for d in kustomize("monitoring")}
    added = {k: _without_added_labels(overlay[k]) for k in set(overlay) - base}
    files = [PODMONITOR, PROMETHEUS_RULE, DASHBOARDS_OUTPUT]
    assert added == {_key(d): _without_added_labels(d) for f in files for d in load_docs(f)}


def test_the_image_is_named_in_one_place() -> None:
    named = [str(p.relative_to(REPO)) for p in sorted((REPO / "config").rglob("*")) if p.is_file()
             and "ghcr.io/retsnoop-otel" in p.read_text(errors="replace")]
    # the chart's values and the base, kept alike by tests/test_helm_chart.py
    assert named == ["config/helm/retsnoop-otel/values.yaml", "config/k8s/base/kustomization.yaml"], named

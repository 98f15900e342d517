"""The agent file's keys are declared once (runtime/config_keys.py: Key, Section): the reader, the defaults (the
targets' field defaults), the trace flags (tests/unit/test_config_flags.py), the reference table and the JSON
Schema all come from there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from retsnoop_otel.agent.config_file import LoggingConfig, parse_config
from retsnoop_otel.runtime.config import ExporterConfig, Limits, MetricsConfig, ProbeSetConfig
from retsnoop_otel.runtime.config_keys import walk
from retsnoop_otel.runtime.config_sections import TOP
from retsnoop_otel.runtime.yaml_nodes import ConfigError
from retsnoop_otel.workload.k8s_settings import KubernetesConfig

# keys whose value the section's reader uses without a field of its own
CONSUMED = {"probe_sets", "exporter", "metrics", "limits", "logging", "vmlinux", "kubernetes", "probe_sets.sampling",
            "probe_sets.filters", "probe_sets.filters.allow_errors",
            "probe_sets.filters.deny_errors"}


def _dotted(name: str) -> str:
    return name.replace("[]", "")


def test_every_key_sets_a_field_of_its_target() -> None:
    wrong = []
    for name, section, key in walk(TOP):
        if section.target is None or key.field == "*" or _dotted(name) in CONSUMED:
            continue
        wrong += [f"{name}: {f}" for f in key.fields if f not in section.target._fields]
    assert wrong == []


def test_keys_left_out_are_the_targets_defaults() -> None:
    cfg = parse_config("probe_sets: [{name: a, entry: [f]}]\n")
    rt = cfg.runtime
    assert rt.probe_sets == (ProbeSetConfig(name="a", entry=("f",)),)
    assert (rt.exporter, rt.metrics, rt.limits, rt.kubernetes, cfg.logging) == (
        ExporterConfig(), MetricsConfig(), Limits(), KubernetesConfig(), LoggingConfig())


def test_each_key_sets_its_field() -> None:
    cfg = parse_config("probe_sets:\n  a: {entry: f, mode: calls, filters: {min_duration_ms: 2, pids: 7}}\n"
                       "metrics: {listen: '127.0.0.1:1', otlp_interval: 5, web_config_file: ''}\n"
                       "limits: {max_spans_per_trace: 9, ringbuf_size: 1M}\n"
                       "kubernetes: {keep_deleted: 4}\nlogging: {level: debug}\nexporter: {console: true}\n")
    ps, rt = cfg.runtime.probe_sets[0], cfg.runtime
    assert (ps.name, ps.mode, ps.min_duration_ns, ps.pids) == ("a", "calls", 2_000_000, (7,))
    assert (rt.metrics.host, rt.metrics.port, rt.metrics.otlp_interval_s, rt.metrics.web_config_file) == (
        "127.0.0.1", 1, 5.0, None)
    assert (rt.limits.max_spans_per_trace, rt.limits.max_calls_per_session, rt.limits.ringbuf_size) == (9, 9, 1 << 20)
    assert rt.kubernetes.keep_deleted_s == 4.0 and cfg.logging.level == "debug"
    assert rt.exporter.otlp is None and rt.exporter.console is not None and rt.exporter.console.prefix


@pytest.mark.parametrize("section", ["metrics", "limits", "logging", "exporter", "kubernetes"])
def test_unknown_keys_name_the_declared_ones(section: str) -> None:
    keys = TOP.key(section).kind.section.names
    with pytest.raises(ConfigError) as exc:
        parse_config(f"probe_sets: [{{name: a, entry: [f]}}]\n{section}: {{zzz: 1}}\n")
    assert str(exc.value).endswith(f"{section}.zzz: unknown key; known keys: {', '.join(keys)}")


# ---- the JSON Schema ------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("agent.yaml", "agent-minimal.yaml", "agent-file.yaml")


def _validator() -> Any:
    import jsonschema  # dev: kubernetes-validate's dependency; a missing one fails here rather than skipping

    from retsnoop_otel.agent.config_schema import schema
    jsonschema.Draft202012Validator.check_schema(schema())
    return jsonschema.Draft202012Validator(schema())


def test_the_shipped_schema_is_the_declarations() -> None:
    from retsnoop_otel.agent.config_schema import schema_text
    assert (REPO / "config" / "agent.schema.json").read_text() == schema_text(), \
        "config/agent.schema.json is stale: python -m tests.gen_docs_reference"


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_configs_validate(name: str) -> None:
    text = (REPO / "config" / name).read_text()
    assert [e.message for e in _validator().iter_errors(yaml.safe_load(text))] == []
    parse_config(text, name)  # and the parser takes them


def test_the_daemonsets_config_validates() -> None:
    docs = list(yaml.safe_load_all((REPO / "config" / "k8s" / "base" / "daemonset.yaml").read_text()))
    text = next(d for d in docs if d and d.get("kind") == "ConfigMap")["data"]["agent.yaml"]
    assert [e.message for e in _validator().iter_errors(yaml.safe_load(text))] == []


@pytest.mark.parametrize(("text", "problem"), [
    ("probe_sets: [{name: a, entry: f, mode: trace}]", "'trace' is not one of"),
    ("probe_sets: [{name: a, entry: f}]\nmetrics: {max_workloads: 0}", "less than the minimum"),
    ("probe_sets: [{name: a, entry: f}]\nlimits: {user_stack_wait_s: 61}", "greater than the maximum"),
    ("probe_sets: [{name: a, entry: f}]\nlogging: {colour: true}", "'colour' was unexpected"),
    ("probe_sets: [{name: a}]", "is not valid under any of the given schemas"),  # needs entry or syscalls: true
    ("probe_sets: {a: {name: a, entry: f}}", "'name' was unexpected"),
    ("probe_sets: []", "should be non-empty"),
    ("exporter: {}", "'probe_sets' is a required property"),
    ("probe_sets: [{name: a, entry: f, capture_args: 1}]", "is not of type 'boolean'"),
])
def test_the_schema_refuses_what_the_parser_refuses(text: str, problem: str) -> None:
    messages = [e.message for e in _validator().iter_errors(yaml.safe_load(text))]
    assert any(problem in m for m in messages), messages
    with pytest.raises(ConfigError):
        parse_config(text)

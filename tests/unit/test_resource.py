"""The resource of a run: detected host attributes, then OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME."""

import pytest
from opentelemetry.sdk.resources import OTELResourceDetector

from retsnoop_otel import __version__
from retsnoop_otel.export.resource import (
    build_resource,
    parse_resource_attributes,
    read_machine_id,
    resource_attributes_problem,
)


def test_resource_attributes(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    attrs = build_resource(root=tmp_path, environ={}).attributes
    assert attrs["service.name"] == "retsnoop-otel" and attrs["service.version"] == __version__
    assert attrs["host.id"] == "0123456789abcdef0123456789abcdef"
    assert attrs["os.type"] == "linux" and attrs["os.version"]
    assert attrs["host.name"] and attrs["host.arch"]
    assert attrs["telemetry.sdk.name"] == "retsnoop-otel" and attrs["telemetry.sdk.language"] == "python"
    assert attrs["service.instance.id"] != build_resource(root=tmp_path, environ={}).attributes["service.instance.id"]


def test_resource_env_overrides(tmp_path):
    env = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,host.name=override",
           "OTEL_SERVICE_NAME": "kernel-tracer"}
    attrs = build_resource(root=tmp_path, environ=env).attributes
    assert attrs["service.name"] == "kernel-tracer"
    assert attrs["deployment.environment"] == "ci" and attrs["host.name"] == "override"
    assert "host.id" not in attrs and read_machine_id(tmp_path) is None
    only_attrs = build_resource(root=tmp_path, environ={"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs"})
    assert only_attrs.attributes["service.name"] == "from-attrs"  # OTEL_SERVICE_NAME would win over it


@pytest.mark.parametrize("text", ["a=1,b=2", "k=v%2Cw,x=y%3Dz", " spaced = out , b=2 ", "empty=", "a=1,,b=2",
                                  "url=http%3A%2F%2Fh%3A1%2Fp", "unicode=%C3%A9t%C3%A9"])
def test_parsing_matches_the_sdk_detector(text, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", text)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    assert parse_resource_attributes(text) == dict(OTELResourceDetector().detect().attributes)


def test_malformed_list_warning_shows_no_value():
    """Issue 47.4: 'secret=SECRETPW,bad' printed every value; an entry without '=' may be a value's tail."""
    from retsnoop_otel.export.otel_env import EnvWarnings
    from retsnoop_otel.runtime.settings import check_resource_attributes
    warnings = EnvWarnings()
    check_resource_attributes({"OTEL_RESOURCE_ATTRIBUTES": "secret=SECRETPW,bad,token=PW%zz"}, warnings)
    (text,) = warnings.messages
    assert text.startswith("OTEL_RESOURCE_ATTRIBUTES: entry 2 has no '='") and "SECRET" not in text, text
    assert "bad" not in text and "PW" not in text, text


@pytest.mark.parametrize("text,problem", [
    ("a=1,broken,b=2", "entry 2 has no '=' (not shown: it may be part of a value)"),
    ("=x", "entry 1 has an empty key"),
    ("a=%zz", "entry 1 ('a'): a '%' that starts no %XX escape in its value"),
    ("a=%C3", "entry 1 ('a'): its %XX escapes are not UTF-8")])
def test_malformed_list_is_named_and_discarded_as_a_whole(text, problem, tmp_path):
    """As the specification says: a malformed list is discarded, never used in part, with one warning that names
    the variable, the bad entry by its number and key (never a value) and says it is ignored (the run goes on)."""
    from retsnoop_otel.export.otel_env import EnvWarnings
    from retsnoop_otel.runtime.settings import check_resource_attributes
    assert resource_attributes_problem(text) == problem
    assert parse_resource_attributes(text) == {}
    env = {"OTEL_RESOURCE_ATTRIBUTES": text}
    attrs = build_resource(root=tmp_path, environ=env).attributes
    assert "a" not in attrs and "b" not in attrs and attrs["service.name"] == "retsnoop-otel"
    warnings = EnvWarnings()
    check_resource_attributes(env, warnings)
    assert warnings.messages == (f"OTEL_RESOURCE_ATTRIBUTES: {problem}; write it like key1=value1,key2=value2 "
                                 "with each value percent-encoded; ignored, as if unset",)

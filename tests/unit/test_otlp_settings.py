"""OTLP exporter settings: precedence, endpoints, headers, compression, timeout, TLS files and error messages,
as protocol/exporter.md and sdk-environment-variables.md define them (explicit environ dicts, no os.environ). A bad
config value is an error; a bad variable is warned about once and ignored (the next source applies)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from retsnoop_otel.export.otel_env import EnvWarnings
from retsnoop_otel.export.otlp_settings import OtlpConfig, OtlpConfigError, describe, resolve_settings
from tests.tls_certs import make_pki

CLI = {"endpoint": "--otlp-endpoint", "protocol": "--otlp-protocol", "headers": "--otlp-header",
       "compression": "--otlp-compression", "timeout_s": "--otlp-timeout", "insecure": "--otlp-insecure",
       "certificate": "--otlp-certificate", "client_key": "--otlp-client-key",
       "client_certificate": "--otlp-client-certificate"}
YAML = {k: f"exporter.otlp.{k}" for k in CLI}
HTTP = OtlpConfig(protocol="http/protobuf")
GRPC = OtlpConfig(protocol="grpc")


def resolve(cfg: OtlpConfig | None = None, env: dict[str, str] | None = None, signal: str = "traces",
            names: dict[str, str] | None = None):
    return resolve_settings(cfg or OtlpConfig(), signal, env or {}, names)


def error(cfg: OtlpConfig | None = None, env: dict[str, str] | None = None, signal: str = "traces",
          names: dict[str, str] | None = None) -> str:
    with pytest.raises(OtlpConfigError) as info:
        resolve(cfg, env, signal, names)
    text = str(info.value)
    assert "\n" not in text and text.strip() == text, text  # one line, for logs and the CLI
    assert info.value.variable is None, text  # only a config value is an error
    return text


def warned(cfg: OtlpConfig | None = None, env: dict[str, str] | None = None, signal: str = "traces",
           names: dict[str, str] | None = None) -> str:
    """The one warning a bad variable gets: one line, naming the variable first, saying it is ignored; and the
    settings are those of the same run without that variable (the next source applies)."""
    cfg, env, warnings = cfg or OtlpConfig(), env or {}, EnvWarnings()
    got = resolve_settings(cfg, signal, env, names, warnings)
    (text,) = warnings.messages
    assert "\n" not in text and text.strip() == text and text.endswith("; ignored, as if unset"), text
    var = re.match(r"OTEL_[A-Z_]+", text)
    assert var is not None and var.group() in env, text
    assert got == resolve_settings(cfg, signal, {k: v for k, v in env.items() if k != var.group()}, names)
    return text


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def pems(pki):
    """A CA bundle, a client key and its certificate, and a second client pair (another CA's)."""
    return {"ca.pem": str(pki.ca), "key.pem": str(pki.client_key), "cert.pem": str(pki.client_cert),
            "other.key": str(pki.other_client_key), "other.crt": str(pki.other_client_cert)}


# ---- defaults and precedence ----

def test_defaults_are_http_protobuf_plaintext_localhost_4318_ten_seconds():
    """The specification's default protocol (protocol/exporter.md): http/protobuf to localhost:4318."""
    s = resolve()
    assert (s.signal, s.protocol, s.url, s.target, s.tls) == ("traces", "http/protobuf",
                                                              "http://localhost:4318/v1/traces", "", False)
    assert (s.headers, s.compression, s.timeout_s) == ((), "none", 10.0)
    assert (s.certificate, s.client_key, s.client_certificate) == (None, None, None)
    assert describe(s) == "http/protobuf http://localhost:4318/v1/traces (plaintext)"
    assert resolve(signal="metrics").url == "http://localhost:4318/v1/metrics"
    assert resolve() == resolve(HTTP)  # no protocol given is the same as http/protobuf given


def test_http_defaults_per_signal():
    assert resolve(HTTP).url == "http://localhost:4318/v1/traces"
    assert resolve(HTTP, signal="metrics").url == "http://localhost:4318/v1/metrics"
    assert resolve(HTTP).target == ""


def test_default_protocol_appends_the_signal_path_to_a_base_url():
    """No protocol anywhere: an endpoint is an OTLP/HTTP base URL (generic variable, config) or the full URL
    (per-signal variable), as for http/protobuf given explicitly."""
    assert resolve(OtlpConfig(endpoint="http://gw:4318")).url == "http://gw:4318/v1/traces"
    assert resolve(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw/otlp"}, signal="metrics").url == \
        "https://gw/otlp/v1/metrics"
    assert resolve(env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://gw:4318/x"}).url == "http://gw:4318/x"


@pytest.mark.parametrize("how", ["config", "signal", "generic"])
def test_grpc_is_one_setting_away(how):
    """protocol: grpc (or --otlp-protocol), OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL:
    gRPC with its own default endpoint, localhost:4317."""
    cfg = GRPC if how == "config" else OtlpConfig()
    env = {} if how == "config" else {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" if how == "signal" else "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    s = resolve(cfg, env)
    assert (s.protocol, s.url, s.target, s.tls) == ("grpc", "http://localhost:4317", "localhost:4317", False)
    assert describe(s) == "grpc localhost:4317 (plaintext)"
    assert resolve(cfg, env, signal="metrics").protocol == ("grpc" if how != "signal" else "http/protobuf")


@pytest.mark.parametrize("cfg,env,setting,which", [
    (OtlpConfig(endpoint="collector:4317"), {}, "--otlp-endpoint='collector:4317'", "http/protobuf, the default)"),
    (OtlpConfig(endpoint="collector"), {}, "--otlp-endpoint='collector'", "http/protobuf, the default)"),
    (OtlpConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT='c:4317'",
     "http/protobuf, the default)"),
    (OtlpConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "[::1]:4317"},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='[::1]:4317'", "http/protobuf, the default)"),
    (HTTP._replace(endpoint="c:4318"), {}, "--otlp-endpoint='c:4318'", "the protocol is http/protobuf)"),
    (OtlpConfig(endpoint="c:4317"), {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "--otlp-endpoint='c:4317'",
     "the protocol is http/protobuf)"),
])
def test_scheme_less_endpoint_with_http_protobuf_says_add_http_or_use_grpc(cfg, env, setting, which):
    """host:port without a scheme is gRPC's form (the specification lets only gRPC endpoints omit it): with
    OTLP/HTTP, whether by default or chosen, it is refused, naming both fixes."""
    text = (warned if cfg.endpoint is None else error)(cfg, env, names=CLI)
    assert text.startswith(f"{setting}: not an http:// or https:// URL (a host:port without a scheme is for "
                           "OTLP/gRPC"), text
    assert which in text and "write it like http://collector:4318" in text, text
    assert "or set --otlp-protocol=grpc" in text and len(text) < 330, text  # one source named: bounded
    # the fix it names works: the same endpoint with the gRPC protocol
    assert resolve(cfg._replace(protocol="grpc"), env).protocol == "grpc"


def test_scheme_less_endpoint_error_names_the_config_keys_and_hides_secrets():
    text = error(OtlpConfig(endpoint="TOKEN:pw@c:4317?key=SECRET"), names=YAML)
    assert text.startswith("exporter.otlp.endpoint='***@c:4317?***': not an http:// or https:// URL"), text
    assert "exporter.otlp.protocol=grpc" in text and "TOKEN" not in text and "SECRET" not in text, text


@pytest.mark.parametrize("field,var,config_value,signal_value,generic_value,attr,expected", [
    ("protocol", "PROTOCOL", "grpc", "http/protobuf", "grpc", "protocol", ("grpc", "http/protobuf", "grpc")),
    ("compression", "COMPRESSION", "deflate", "gzip", "none", "compression", ("deflate", "gzip", "none")),
    ("compression", "COMPRESSION", "gzip", "none", "gzip", "compression", ("gzip", "none", "gzip")),
    ("timeout_s", "TIMEOUT", 2.5, "1500", "3000", "timeout_s", (2.5, 1.5, 3.0)),
    ("insecure", "INSECURE", False, "true", "false", "tls", (True, False, True)),
])
def test_precedence_config_then_signal_variable_then_generic(field, var, config_value, signal_value, generic_value,
                                                             attr, expected):
    env = {f"OTEL_EXPORTER_OTLP_TRACES_{var}": signal_value, f"OTEL_EXPORTER_OTLP_{var}": generic_value}
    base = {"endpoint": "collector:4317", "protocol": "grpc"} if field == "insecure" else {}
    assert getattr(resolve(OtlpConfig(**base, **{field: config_value}), env), attr) == expected[0]
    assert getattr(resolve(OtlpConfig(**base), env), attr) == expected[1]
    # the metrics signal does not read the traces variable: the generic one applies
    assert getattr(resolve(OtlpConfig(**base), env, signal="metrics"), attr) == expected[2]


def test_precedence_for_endpoint_headers_and_files(pems):
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://all:4317",
           "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=traces", "OTEL_EXPORTER_OTLP_HEADERS": "a=all,b=all",
           "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": pems["ca.pem"], "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nowhere",
           "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": pems["key.pem"],
           "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": pems["cert.pem"]}
    s = resolve(GRPC, env)
    assert s.target == "traces:4317" and s.headers == (("a", "traces"),)  # per-signal headers replace the generic
    assert (s.certificate, s.client_key, s.client_certificate) == (pems["ca.pem"], pems["key.pem"], pems["cert.pem"])
    m = resolve(GRPC, {k: v for k, v in env.items() if "CERTIFICATE" not in k and "KEY" not in k},
                signal="metrics")
    assert m.target == "all:4317" and m.headers == (("a", "all"), ("b", "all"))
    c = resolve(GRPC._replace(endpoint="http://mine:1234", headers=(("X-Key", "v"),), certificate=pems["cert.pem"],
                           client_key=pems["other.key"], client_certificate=pems["other.crt"]), env)
    assert c.target == "mine:1234" and c.headers == (("x-key", "v"),)  # config headers replace the environment's
    assert (c.certificate, c.client_key, c.client_certificate) == (pems["cert.pem"], pems["other.key"],
                                                                   pems["other.crt"])


def test_metrics_protocol_variable_is_read_for_metrics_only():
    env = {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    m = resolve(OtlpConfig(), env, signal="metrics")
    assert (m.protocol, m.url) == ("http/protobuf", "http://localhost:4318/v1/metrics")
    assert resolve(OtlpConfig(), env).protocol == "grpc"  # traces: the generic variable
    assert resolve(OtlpConfig(protocol="grpc"), env, signal="metrics").protocol == "grpc"  # config wins


def test_empty_variables_count_as_unset():
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": " ", "OTEL_EXPORTER_OTLP_COMPRESSION": ""}
    s = resolve(OtlpConfig(), env)
    assert (s.protocol, s.timeout_s, s.compression) == ("grpc", 10.0, "none")
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_PROTOCOL": " "}).protocol == "http/protobuf"  # the default


# ---- a variable that cannot work: warned about once, ignored, the next source applies ----

def test_a_bad_signal_endpoint_falls_back_to_the_generic_one_with_one_warning():
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://user:SECRET@[::1/x?key=SECRET",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    warnings = EnvWarnings()
    s = resolve_settings(OtlpConfig(), "traces", env, None, warnings)
    assert (s.url, s.endpoint_from) == ("http://collector:4318/v1/traces", "generic")  # a base URL, as always
    assert warnings.messages == (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='http://***@[::1/x?***': not a valid URL (Invalid IPv6 URL); write it "
        "like http://collector:4318 (IPv6: http://[::1]:4317); ignored, as if unset",)
    # without the generic one, the specification's default
    s = resolve_settings(OtlpConfig(), "traces", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c"}, None, warnings)
    assert (s.url, s.endpoint_from) == ("http://localhost:4318/v1/traces", "default")


def test_a_bad_generic_variable_is_warned_about_once_for_both_signals():
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2000"}
    warnings = EnvWarnings()
    traces = resolve_settings(OtlpConfig(), "traces", env, None, warnings)
    metrics = resolve_settings(OtlpConfig(), "metrics", env, None, warnings)
    assert (traces.timeout_s, metrics.timeout_s) == (10.0, 2.0)
    assert warnings.messages == ("OTEL_EXPORTER_OTLP_TIMEOUT='soon': not a positive number; write a timeout > 0 in "
                                 "milliseconds, such as 10000; ignored, as if unset",)


def test_several_bad_variables_each_get_their_warning_and_the_rest_applies():
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd",
           "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_HEADERS": "api-key=SECRET,broken",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c.example:4318"}
    warnings = EnvWarnings()
    s = resolve_settings(OtlpConfig(), "traces", env, None, warnings)
    assert (s.protocol, s.url, s.compression, s.headers) == ("http/protobuf", "https://c.example:4318/v1/traces",
                                                             "gzip", ())
    assert [m.split("=")[0].split(":")[0] for m in warnings.messages] == [
        "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"]
    assert "SECRET" not in " ".join(warnings.messages)


def test_a_bad_config_value_stays_an_error_whatever_the_environment_says():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}
    with pytest.raises(OtlpConfigError) as info:
        resolve_settings(OtlpConfig(endpoint="ftp://c"), "traces", env, CLI, EnvWarnings())
    assert str(info.value).startswith("--otlp-endpoint='ftp://c': not an http:// or https:// URL")
    assert info.value.variable is None


# ---- protocol ----

def test_protocol_values_and_errors():
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/Protobuf"}).protocol == "http/protobuf"
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "GRPC"}).protocol == "grpc"
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"}, signal="metrics")
    assert text.startswith("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=") and "not supported" in text
    assert "http/protobuf" in text and "grpc" in text
    text = error(OtlpConfig(protocol="thrift"), names=CLI)
    assert text.startswith("--otlp-protocol='thrift'") and "grpc, http/protobuf" in text


# ---- OTLP/HTTP endpoints ----

@pytest.mark.parametrize("env,signal,url", [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318"}, "traces", "http://gw:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318/"}, "metrics", "http://gw:4318/v1/metrics"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318/otlp"}, "traces", "http://gw:4318/otlp/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw/mycollector/"}, "traces", "https://gw/mycollector/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://gw:4318"}, "traces", "http://gw:4318/"),  # as is (root path)
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://gw:4318/custom/path"}, "traces", "http://gw:4318/custom/path"),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://c.example.com/v1/metrics/"}, "metrics",
     "https://c.example.com/v1/metrics/"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://all:2"}, "metrics",
     "http://all:2/v1/metrics"),
])
def test_http_endpoint_from_environment(env, signal, url):
    assert resolve(HTTP, env, signal).url == url


@pytest.mark.parametrize("endpoint,url", [
    ("http://gw:4318", "http://gw:4318/v1/traces"),  # a config endpoint is a base URL, like the generic variable
    ("http://gw:4318/otlp", "http://gw:4318/otlp/v1/traces"),
    ("http://gw:4318/otlp/v1/traces", "http://gw:4318/otlp/v1/traces"),  # unless it already names the signal path
    ("https://gw/v1/traces/", "https://gw/v1/traces/"),
])
def test_http_endpoint_from_config(endpoint, url):
    s = resolve(OtlpConfig(protocol="http/protobuf", endpoint=endpoint),
                {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://ignored:1/"})
    assert s.url == url and s.tls == url.startswith("https")


def test_http_tls_from_scheme_and_describe_hides_secrets():
    s = resolve(OtlpConfig(protocol="http/protobuf", endpoint="https://user:pw@gw.example/otlp?api_key=secret",
                           headers=(("authorization", "Bearer secret"),), compression="gzip"))
    assert s.tls and s.url == "https://user:pw@gw.example/otlp/v1/traces?api_key=secret"
    assert describe(s) == "http/protobuf https://gw.example/otlp/v1/traces (TLS, gzip)"
    assert "secret" not in describe(s) and "pw" not in describe(s)


@pytest.mark.parametrize("endpoint,problem", [
    ("gw:4318", "http:// or https://"),
    ("ftp://gw:4318", "http:// or https://"),
    ("http://", "no host"),
    ("http://gw:0", "port 0"),
    ("http://gw:99999", "bad port"),
    ("http://gw:abc", "bad port"),
    ("http://g w:4318", "http:// or https://"),
])
def test_http_endpoint_errors_name_the_setting(endpoint, problem):
    text = error(OtlpConfig(protocol="http/protobuf", endpoint=endpoint), names=YAML)
    assert text.startswith(f"exporter.otlp.endpoint={endpoint!r}:") and problem in text
    text = warned(HTTP, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": endpoint}, signal="metrics")
    assert text.startswith("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=") and problem in text


# ---- OTLP/gRPC endpoints ----

@pytest.mark.parametrize("endpoint,insecure,url,target,tls", [
    ("http://c:4317", None, "http://c:4317", "c:4317", False),
    ("https://c:4317", None, "https://c:4317", "c:4317", True),
    ("https://c:4317/", True, "https://c:4317", "c:4317", True),  # the scheme wins over insecure
    ("http://c", False, "http://c:4317", "c:4317", False),
    ("c:5555", None, "https://c:5555", "c:5555", True),  # no scheme: TLS unless insecure
    ("c:5555", True, "http://c:5555", "c:5555", False),
    ("c", True, "http://c:4317", "c:4317", False),
    ("http://[::1]:4317", None, "http://[::1]:4317", "[::1]:4317", False),
    ("[::1]", True, "http://[::1]:4317", "[::1]:4317", False),
])
def test_grpc_endpoints(endpoint, insecure, url, target, tls):
    s = resolve(GRPC._replace(endpoint=endpoint, insecure=insecure))
    assert (s.url, s.target, s.tls) == (url, target, tls)
    assert describe(s) == f"grpc {target} ({'TLS' if tls else 'plaintext'})"


def test_grpc_insecure_from_environment():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert resolve(OtlpConfig(), {**env, "OTEL_EXPORTER_OTLP_INSECURE": "TRUE"}).tls is False
    assert resolve(OtlpConfig(), {**env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "False",
                                  "OTEL_EXPORTER_OTLP_INSECURE": "true"}).tls is True
    assert resolve(OtlpConfig(), {**env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}, signal="metrics").tls is True
    text = warned(OtlpConfig(), {**env, "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "yes"})
    assert text.startswith("OTEL_EXPORTER_OTLP_TRACES_INSECURE='yes'") and "true or false" in text


def test_grpc_endpoint_with_a_path_points_at_otlp_http():
    text = error(GRPC._replace(endpoint="http://c:4317/v1/traces"), names=CLI)
    assert text.startswith("--otlp-endpoint='http://c:4317/v1/traces'") and "take no path" in text
    assert "--otlp-protocol=http/protobuf" in text and "drop the path" in text
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:4317/v1/traces",
                                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, names=YAML)
    assert text.startswith("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=") and "exporter.otlp.protocol=http/protobuf" in text


def test_endpoint_errors_hide_passwords_and_query_strings():
    text = error(GRPC._replace(endpoint="http://user:SECRET@c:4317/v1/traces?key=SECRET"))
    assert text.startswith("endpoint='http://***@c:4317/v1/traces?***'") and "SECRET" not in text
    text = warned(HTTP, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:0/?api_key=SECRET"})
    assert "port 0" in text and "SECRET" not in text


@pytest.mark.parametrize("endpoint,problem", [
    ("unix:///tmp/otlp.sock", "http:// or https://"),
    ("http://c:0", "port 0"),
    ("c:notaport", "bad port"),
])
def test_grpc_endpoint_errors(endpoint, problem):
    text = error(GRPC._replace(endpoint=endpoint))
    assert text.startswith(f"endpoint={endpoint!r}:") and problem in text  # no `names`: the field name


# ---- headers ----

def test_headers_parsing_decoding_and_case():
    env = {"OTEL_EXPORTER_OTLP_HEADERS": " API-Key = a%20b%3Dc , x-tenant=t1,,token=abc== ,"}
    assert resolve(GRPC, env).headers == (("api-key", "a b=c"), ("x-tenant", "t1"), ("token", "abc=="))
    assert resolve(HTTP, env).headers == (("API-Key", "a b=c"), ("x-tenant", "t1"), ("token", "abc=="))
    assert resolve(GRPC._replace(headers=(("Authorization", "Bearer x"),))).headers == (("authorization", "Bearer x"),)
    assert resolve(OtlpConfig(headers=(("Authorization", "Bearer x"),))).headers == (("Authorization", "Bearer x"),)
    assert resolve(HTTP, {"OTEL_EXPORTER_OTLP_HEADERS": "k="}).headers == (("k", ""),)


@pytest.mark.parametrize("protocol,value,problem", [
    ("grpc", "api-key=SECRET,broken", "header #2 (not shown: it may hold a secret) has no '='"),
    ("http/protobuf", "Authorization: Bearer SECRET", "header 'Authorization' has no '='"),
    ("grpc", "=SECRET", "header #1 has an empty name"),
    ("grpc", "ok=1,%20=SECRET", "header #2 has an empty name"),
    ("http/protobuf", "Authorization: Bearer SECRET=x", "header #1 (its name starts 'Authorization') has an invalid"),
    ("http/protobuf", "a b=SECRET", "header #1 (its name starts 'a') has an invalid name"),
    ("grpc", "trace-bin=SECRET", "header 'trace-bin' has an invalid name"),  # binary metadata needs bytes
    ("grpc", "k=SECRET%0Aevil: 1", "header 'k' has a control character in its value"),
    ("http/protobuf", "k=SECRET%0D%0Aevil: 1", "header 'k' has a control character in its value"),
])
def test_header_errors_name_the_variable_and_hide_values(protocol, value, problem):
    text = warned(OtlpConfig(protocol=protocol), {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": value})
    assert text.startswith("OTEL_EXPORTER_OTLP_TRACES_HEADERS:") and problem in text
    assert "SECRET" not in text and "Bearer" not in text


def test_config_header_errors_name_the_config_key():
    text = error(OtlpConfig(headers=(("x-ok", "1"), ("", "SECRET"))), names=YAML)
    assert text.startswith("exporter.otlp.headers: header #2") and "SECRET" not in text
    text = error(OtlpConfig(headers=(("x-ok", "SECRET\nx"),), protocol="http/protobuf"), names=CLI)
    assert text.startswith("--otlp-header: header 'x-ok' has a control character") and "SECRET" not in text


# ---- compression and timeout ----

@pytest.mark.parametrize("value,expected", [("gzip", "gzip"), ("GZIP", "gzip"), ("none", "none")])
def test_compression_values(value, expected):
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_COMPRESSION": value}).compression == expected
    assert resolve(OtlpConfig(compression=value)).compression == expected


def test_deflate_is_the_configs_not_the_variables():
    """The specification's variables take gzip or none: deflate there is warned about and ignored (the generic
    variable, then the default, apply); the config key keeps it (the senders have it)."""
    assert resolve(OtlpConfig(compression="deflate")).compression == "deflate"
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"})
    assert text.startswith("OTEL_EXPORTER_OTLP_COMPRESSION='deflate': not a compression of the OTLP exporter "
                           "variables; use gzip or none"), text
    env = {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "deflate", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    assert resolve(OtlpConfig(), env).compression == "gzip"


def test_compression_errors():
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"})
    assert text.startswith("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION='zstd'") and "gzip, none" in text
    assert error(OtlpConfig(compression="br"), names=CLI).startswith("--otlp-compression='br'")


def test_timeout_over_an_hour():
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TIMEOUT": "1e30"})
    assert text.startswith("OTEL_EXPORTER_OTLP_TIMEOUT='1e30': longer than an hour; write a timeout of at most "
                           "3600000 milliseconds"), text
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TIMEOUT": "3600000"}).timeout_s == 3600.0
    assert "='3601': longer than an hour; write a timeout of at most 3600 seconds" in error(OtlpConfig(timeout_s=3601))


def test_timeout_units():
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}).timeout_s == 2.5
    assert resolve(OtlpConfig(), {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "12.5"}).timeout_s == 0.0125
    assert resolve(OtlpConfig(timeout_s=3)).timeout_s == 3.0


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "10s"])
def test_timeout_variable_errors(value):
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": value}, signal="metrics")
    assert text.startswith(f"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT={value!r}") and "milliseconds" in text


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_timeout_config_errors(value):
    text = error(OtlpConfig(timeout_s=value), names=CLI)
    assert text.startswith("--otlp-timeout=") and "seconds" in text


# ---- certificate files ----

def test_missing_certificate_files_name_the_setting_and_path(tmp_path):
    missing = str(tmp_path / "nope.pem")
    text = error(OtlpConfig(certificate=missing), names=CLI)
    assert text.startswith(f"--otlp-certificate: {missing}: cannot read")
    warnings = EnvWarnings()  # the certificate cannot be read: ignored; then the key alone is no pair: ignored too
    s = resolve_settings(OtlpConfig(), "traces", {"OTEL_EXPORTER_OTLP_CLIENT_KEY": missing,
                                                  "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": missing}, None, warnings)
    cert, key = warnings.messages
    assert cert.startswith(f"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: {missing}: cannot read") and \
        cert.endswith("; ignored, as if unset"), cert
    assert key.startswith("OTEL_EXPORTER_OTLP_CLIENT_KEY=") and "client_certificate is not set" in key, key
    assert (s.client_key, s.client_certificate) == (None, None)
    text = error(OtlpConfig(client_certificate=str(tmp_path), client_key=str(tmp_path)), names=YAML)  # directories
    assert text.startswith("exporter.otlp.client_certificate: ") and "a directory, not a regular file" in text


def _der(pem: str, out: Path, kind: str) -> str:
    subprocess.run(["openssl", kind, "-in", pem, "-outform", "der", "-out", str(out)], check=True,
                   capture_output=True, timeout=60)
    return str(out)


def test_certificate_files_are_parsed_not_only_read(tmp_path, pems):
    """Random bytes, an empty file, DER, a key for a CA: refused at start-up, naming the setting and the fix."""
    junk = tmp_path / "junk.pem"
    junk.write_bytes(bytes(range(256)) * 4)
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    for bad in (junk, empty, pems["key.pem"]):
        text = error(OtlpConfig(certificate=str(bad)), names=CLI)
        assert text == f"--otlp-certificate: {bad}: no PEM CA certificate in the file (a file that holds " \
                       "-----BEGIN CERTIFICATE-----)", text
    text = error(OtlpConfig(certificate=str(broken)), names=CLI)
    assert text.startswith(f"--otlp-certificate: {broken}: a certificate in the file does not parse"), text
    der = _der(pems["ca.pem"], tmp_path / "ca.der", "x509")
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_CERTIFICATE": der})
    assert text.startswith(f"OTEL_EXPORTER_OTLP_CERTIFICATE: {der}: a DER certificate, PEM is expected; convert it "
                           "with openssl x509 -inform der"), text


def test_client_key_is_the_certificates_own_unencrypted_pem_key(tmp_path, pems):
    text = error(OtlpConfig(client_key=pems["other.key"], client_certificate=pems["cert.pem"]), names=YAML)
    assert text == f"exporter.otlp.client_key: {pems['other.key']} does not match the certificate in " \
                   f"{pems['cert.pem']}", text
    text = error(OtlpConfig(client_key=pems["cert.pem"], client_certificate=pems["cert.pem"]), names=YAML)
    assert text.startswith(f"exporter.otlp.client_key: {pems['cert.pem']}: no PEM private key in the file"), text
    enc = tmp_path / "enc.key"
    subprocess.run(["openssl", "pkey", "-in", pems["key.pem"], "-aes256", "-passout", "pass:secret", "-out",
                    str(enc)], check=True, capture_output=True, timeout=60)
    text = error(OtlpConfig(client_key=str(enc), client_certificate=pems["cert.pem"]), names=CLI)
    assert text.startswith(f"--otlp-client-key: {enc}: the key is encrypted; give it unencrypted"), text
    der = _der(pems["key.pem"], tmp_path / "key.der", "pkey")
    text = error(OtlpConfig(client_key=der, client_certificate=pems["cert.pem"]), names=CLI)
    assert text.startswith(f"--otlp-client-key: {der}: no PEM private key") and "-inform der" in text, text


def test_client_key_and_certificate_go_together(pems):
    text = error(OtlpConfig(client_key=pems["key.pem"]), names=CLI)
    assert text.startswith("--otlp-client-key=") and "--otlp-client-certificate" in text
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": pems["cert.pem"]}, signal="metrics")
    assert text.startswith("OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE=") and "client_key" in text
    s = resolve(OtlpConfig(client_key=pems["key.pem"]), {"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": pems["cert.pem"]})
    assert (s.client_key, s.client_certificate) == (pems["key.pem"], pems["cert.pem"])


def test_certificate_with_plaintext_grpc_endpoint_is_accepted_but_plaintext(pems):
    s = resolve(GRPC._replace(endpoint="http://c:4317", certificate=pems["ca.pem"]))
    assert s.tls is False and s.certificate == pems["ca.pem"]


def test_unknown_signal_is_a_programming_error():
    with pytest.raises(ValueError, match="signal"):
        resolve(signal="logs")


# ---- endpoints a URL parser refuses: one OtlpConfigError, never a ValueError from urlsplit ----

@pytest.mark.parametrize("endpoint,problem", [
    ("http://[::1", "not a valid URL"),
    ("http://user:SECRET@[::1", "not a valid URL"),
    ("[::1", "URL"),  # grpc: host[:port] that does not parse; http: not a URL at all
    ("http://c\n:4317", "control character"),
    ("http://c\x00:4317", "control character"),
    ("http://" + "h" * 254 + ":4317", "254 characters, more than a host name can have (253)"),
])
@pytest.mark.parametrize("cfg", [GRPC, HTTP], ids=["grpc", "http"])
def test_unparseable_endpoints_are_config_errors(endpoint, problem, cfg):
    text = error(cfg._replace(endpoint=endpoint), names=CLI)
    assert text.startswith("--otlp-endpoint=") and problem in text and "write it like" in text, text
    assert "SECRET" not in text and "\n" not in text and len(text) < 300, text
    text = warned(OtlpConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert text.startswith("OTEL_EXPORTER_OTLP_ENDPOINT=") and problem in text, text


def test_endpoint_userinfo_never_echoed():
    text = error(OtlpConfig(endpoint="ftp://TOKEN@c:4317"), names=CLI)
    assert "TOKEN" not in text and "***@c:4317" in text
    text = error(OtlpConfig(endpoint="TOKEN:pw@c:notaport"), names=CLI)
    assert "TOKEN" not in text and "pw" not in text


def test_a_long_endpoint_is_echoed_cut():
    text = error(OtlpConfig(endpoint="ftp://" + "x" * 100000), names=CLI)
    assert "(100006 characters)" in text and len(text) < 300


def test_the_settings_hold_the_checked_bytes_and_never_show_the_key(tmp_path):
    """The senders are built from the bytes read at start (not the files again); a printed setting hides the key."""
    pki = make_pki(tmp_path)
    s = resolve_settings(OtlpConfig(endpoint="https://localhost:4317", certificate=str(pki.ca),
                                    client_certificate=str(pki.client_cert), client_key=str(pki.client_key)),
                         "traces", {})
    assert s.ca_data == pki.ca.read_bytes()
    assert s.client_pair == (pki.client_cert.read_bytes(), pki.client_key.read_bytes())
    assert "PRIVATE KEY" not in repr(s) and "not shown" in repr(s)

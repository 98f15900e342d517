"""The exporter-toolkit web config file: what is accepted and refused, judged against promtool.

`promtool check web-config` (Debian's prometheus 2.42, exporter-toolkit 0.8) runs the toolkit's own
validation. Every case of the table goes through both; they agree except where a case says why not:
features Python's ssl module cannot honour (refused with the reason), settings that would silently do
nothing or let anyone in (refused), and client_allowed_sans, newer than Debian's promtool.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retsnoop_otel.metrics.web_config import TLS12_CIPHERS, TLS13_CIPHERS, WebConfigError, parse_web_config
from retsnoop_otel.metrics.web_tls import load_web_config
from tests.tls_certs import Pki, make_pki

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()
TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
MTLS = TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
CANT = "Python's ssl module"


@dataclass(frozen=True)
class Case:
    text: str
    refusal: str | None = None  # None: we accept; else the start of the message after 'file:line: '
    promtool_accepts: bool | None = None  # None: promtool agrees with us
    why: str = ""  # why we differ from promtool


CASES = {
    # accepted by both
    "empty_file": Case(""),
    "tls": Case(TLS),
    "tls_absolute_paths": Case("tls_server_config:\n  cert_file: {dir}/server.crt\n  key_file: {dir}/server.key\n"),
    "tls_null": Case("tls_server_config:\n"),
    "tls_empty_mapping": Case("tls_server_config: {{}}\n"),
    "tls_blank_values": Case("tls_server_config:\n  cert_file: ''\n  key_file:\n  cipher_suites: []\n"),
    "no_client_cert": Case(TLS + "  client_auth_type: NoClientCert\n"),
    "client_auth_blank": Case(TLS + "  client_auth_type: ''\n"),
    "mtls": Case(MTLS),
    "verify_if_given": Case(TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.crt\n"),
    "versions": Case(TLS + "  min_version: TLS12\n  max_version: TLS13\n"),
    "tls13_only": Case(TLS + "  min_version: TLS13\n"),
    "ciphers_tls12": Case(TLS + "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, "
                          "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256]\n"),
    "ciphers_tls13": Case(TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"),
    "ciphers_empty": Case(TLS + "  cipher_suites: []\n"),
    "curve_x25519": Case(TLS + "  curve_preferences: [X25519]\n"),
    "curve_p384": Case(TLS + "  curve_preferences: [CurveP384]\n"),
    "prefer_server_false": Case(TLS + "  prefer_server_cipher_suites: false\n"),
    "headers": Case("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
                    "    Strict-Transport-Security: max-age=31536000\n    X-XSS-Protection: 1\n"
                    "    Content-Security-Policy: default-src 'self'\n"),
    "http2_false": Case(TLS + "http_server_config:\n  http2: false\n"),
    "http2_yes": Case("http_server_config:\n  http2: yes\n"),
    "users": Case("basic_auth_users:\n  alice: '{hash}'\n  bob: '{hash2y}'\n  carol: '{hash2a}'\n  dan: '{hash2x}'\n"),
    "users_numeric_name": Case("basic_auth_users:\n  123: '{hash}'\n"),
    "users_empty": Case("basic_auth_users: {{}}\n"),
    "users_null": Case("basic_auth_users:\n"),
    "users_cost_14": Case("basic_auth_users:\n  alice: '$2y$14${salthash}'\n"),
    "all_together": Case(MTLS + "  min_version: TLS12\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
                         "basic_auth_users:\n  alice: '{hash}'\n"),
    # refused by both
    "not_yaml": Case("tls_server_config: [\n", "not valid YAML"),
    "not_a_mapping": Case("- a\n", "expected a mapping, got a list"),
    "unknown_key": Case("basic_auth_user:\n  alice: '{hash}'\n", "basic_auth_user: unknown key; did you mean "
                        "'basic_auth_users'?"),
    "unknown_tls_key": Case(TLS + "  cert_fille: x\n", "tls_server_config.cert_fille: unknown key; did you mean"),
    "duplicate_key": Case("basic_auth_users:\n  alice: '{hash}'\n  alice: '{hash}'\n",
                          "basic_auth_users.alice: duplicate key"),
    "rate_limit": Case("rate_limit:\n  interval: 1s\n  burst: 2\n", "rate_limit: rate limiting is not supported"),
    "inline_cert": Case("tls_server_config:\n  cert: x\n  key_file: server.key\n",
                        "tls_server_config.cert: inline PEM is not supported"),
    "no_key_file": Case("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config: missing key_file"),
    "ca_without_cert": Case("tls_server_config:\n  client_ca_file: ca.crt\n", "tls_server_config: missing cert_file"),
    "cert_missing": Case("tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n",
                         "tls_server_config.cert_file: {dir}/nope.crt: cannot read the certificate: No such file or "
                         "directory"),
    "key_of_another_cert": Case("tls_server_config:\n  cert_file: server.crt\n  key_file: client.key\n",
                                "tls_server_config.key_file: {dir}/client.key does not match the certificate in"),
    "key_of_another_type": Case("tls_server_config:\n  cert_file: server.crt\n  key_file: rsa.key\n",
                                "tls_server_config.key_file: {dir}/rsa.key does not match the certificate in"),
    "ca_without_auth_policy": Case(TLS + "  client_ca_file: ca.crt\n",
                                   "tls_server_config.client_ca_file: client CA configured without a client auth"),
    "ca_file_missing": Case(TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: nope.crt\n",
                            "tls_server_config.client_ca_file: {dir}/nope.crt: cannot read the CA certificate: No "
                            "such file"),
    "bogus_auth_type": Case(TLS + "  client_auth_type: Always\n",
                            "tls_server_config.client_auth_type: unknown value 'Always'"),
    "version_tls14": Case(TLS + "  min_version: TLS14\n", "tls_server_config.min_version: unknown value 'TLS14'"),
    "version_lowercase": Case(TLS + "  max_version: tls13\n", "tls_server_config.max_version: unknown value"),
    "cipher_rc4": Case(TLS + "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
                       "tls_server_config.cipher_suites: unknown cipher 'TLS_RSA_WITH_RC4_128_SHA'"),
    "cipher_openssl_name": Case(TLS + "  cipher_suites: [ECDHE-RSA-AES128-GCM-SHA256]\n",
                                "tls_server_config.cipher_suites: unknown cipher"),
    "ciphers_not_a_list": Case(TLS + "  cipher_suites: TLS_AES_128_GCM_SHA256\n",
                               "tls_server_config.cipher_suites: expected a list of strings"),
    "curve_unknown": Case(TLS + "  curve_preferences: [P256]\n", "tls_server_config.curve_preferences: unknown curve"),
    "http2_number": Case("http_server_config:\n  http2: 1\n", "http_server_config.http2: expected true or false"),
    "prefer_string": Case(TLS + "  prefer_server_cipher_suites: 'x'\n",
                          "tls_server_config.prefer_server_cipher_suites: expected true or false"),
    "header_not_allowed": Case("http_server_config:\n  headers:\n    X-Other: 1\n",
                               "http_server_config.headers.X-Other: this header cannot be set"),
    "header_lowercase": Case("http_server_config:\n  headers:\n    x-frame-options: deny\n",
                             "http_server_config.headers.x-frame-options: this header cannot be set"),
    "header_bad_value": Case("http_server_config:\n  headers:\n    X-Frame-Options: DENY\n",
                             "http_server_config.headers.X-Frame-Options: 'DENY' is not allowed"),
    "user_without_hash": Case("basic_auth_users:\n  alice:\n", "basic_auth_users.alice: the value for user 'alice' "
                              "is missing: expected a bcrypt hash"),
    "hash_too_short": Case("basic_auth_users:\n  alice: '{short}'\n", "basic_auth_users.alice: the value for user "
                           "'alice' is a string that is not a bcrypt hash (not shown"),
    "hash_plain_password": Case("basic_auth_users:\n  alice: secret\n",
                                "basic_auth_users.alice: the value for user 'alice' is a string that is not a bcrypt"),
    "hash_version_3": Case("basic_auth_users:\n  alice: '$3a$10${salthash}'\n",
                           "basic_auth_users.alice: the value for user 'alice'"),
    "hash_cost_3": Case("basic_auth_users:\n  alice: '$2y$03${salthash}'\n",
                        "basic_auth_users.alice: bcrypt cost 3 is outside 4..14"),
    "hash_cost_32": Case("basic_auth_users:\n  alice: '$2y$32${salthash}'\n", "basic_auth_users.alice: bcrypt cost 32"),
    # where we differ, and why
    "request_client_cert": Case(TLS + "  client_auth_type: RequestClientCert\n",
                                f"tls_server_config.client_auth_type: {CANT} verifies every client certificate", True,
                                "OpenSSL through ssl cannot ask for a certificate without verifying it"),
    "require_any_client_cert": Case(TLS + "  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.crt\n",
                                    f"tls_server_config.client_auth_type: {CANT}", True, "the same"),
    "require_client_cert_alias": Case(TLS + "  client_auth_type: RequireClientCert\n",
                                      f"tls_server_config.client_auth_type: {CANT}", True, "the same (old alias)"),
    "min_tls10": Case(TLS + "  min_version: TLS10\n", "tls_server_config.min_version: OpenSSL 3 refuses TLS 1.0",
                      True, "OpenSSL 3 will not negotiate TLS 1.0/1.1 at security level 1 or above"),
    "max_tls11": Case(TLS + "  max_version: TLS11\n", "tls_server_config.max_version: OpenSSL 3 refuses", True,
                      "the same"),
    "min_above_max": Case(TLS + "  min_version: TLS13\n  max_version: TLS12\n",
                          "tls_server_config.min_version: is above max_version", True,
                          "Go fails every handshake later; we say so at start"),
    "tls13_suites_with_max_tls12": Case(TLS + "  max_version: TLS12\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
                                        "tls_server_config.cipher_suites: lists TLS 1.3 suites only", True,
                                        "Go fails every handshake later; we say so at start"),
    "two_curves": Case(TLS + "  curve_preferences: [X25519, CurveP256]\n",
                       f"tls_server_config.curve_preferences: {CANT} sets one curve only", True,
                       "SSLContext.set_ecdh_curve takes one group"),
    "verify_without_ca": Case(TLS + "  client_auth_type: RequireAndVerifyClientCert\n",
                              "tls_server_config.client_auth_type: RequireAndVerifyClientCert needs client_ca_file",
                              True, "Go verifies against the system's public CAs: anyone with a certificate gets in"),
    "ca_file_without_certificates": Case(TLS + "  client_auth_type: VerifyClientCertIfGiven\n"
                                         "  client_ca_file: server.key\n",
                                         "tls_server_config.client_ca_file: {dir}/server.key: no PEM CA certificate",
                                         True, "Go keeps an empty CA pool, so no client certificate ever verifies"),
    "option_without_cert": Case("tls_server_config:\n  min_version: TLS13\n",
                                "tls_server_config.min_version: has no effect without cert_file and key_file", True,
                                "Go serves plain HTTP and ignores the option"),
    "users_cost_15": Case("basic_auth_users:\n  alice: '$2y$15${salthash}'\n",
                          "basic_auth_users.alice: bcrypt cost 15 is outside 4..14 (each login with a wrong password",
                          True, "Go takes any cost up to 31: one login at cost 31 keeps a core busy for over a day"),
    "users_cost_31": Case("basic_auth_users:\n  alice: '$2y$31${salthash}'\n",
                          "basic_auth_users.alice: bcrypt cost 31 is outside 4..14", True, "the same"),
    "hash_2_prefix": Case("basic_auth_users:\n  alice: '$2$10${salthash}'\n",
                          "basic_auth_users.alice: the $2$ variant is not supported", True,
                          "the bcrypt package cannot check $2$ hashes"),
    "hash_bad_characters": Case("basic_auth_users:\n  alice: '{badchars}'\n", "basic_auth_users.alice: the value for "
                                "user 'alice' is a string that is not a bcrypt hash", True,
                                "Go checks the prefix only; no password could ever match"),
    "client_allowed_sans": Case(MTLS + "  client_allowed_sans: [scraper]\n", None, False,
                                "exporter-toolkit 0.9 added the key; Debian's promtool 2.42 predates it"),
    "sans_without_required_cert": Case(TLS + "  client_allowed_sans: [scraper]\n",
                                       "tls_server_config.client_allowed_sans: needs client_auth_type: "
                                       "RequireAndVerifyClientCert", False, "the key is newer than promtool (above)"),
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out",
                    pki.dir / "rsa.key"], check=True, capture_output=True)
    return pki


def _fill(text: str, pki: Pki) -> str:
    return text.format(dir=pki.dir, hash=HASH, hash2y="$2y$" + HASH[4:], hash2a="$2a$" + HASH[4:],
                       hash2x="$2x$" + HASH[4:], salthash=HASH[7:], short=HASH[:58], badchars=HASH[:50] + "!" * 10)


def _promtool(path: Path) -> tuple[bool, str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus' (make setup does)")
    res = subprocess.run([exe, "check", "web-config", str(path)], capture_output=True, text=True, timeout=60)
    return res.returncode == 0, (res.stdout + res.stderr).strip()


def _ours(path: Path) -> str | None:
    try:
        load_web_config(str(path))
    except WebConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_against_promtool(name: str, pki: Pki) -> None:
    case = CASES[name]
    path = pki.dir / f"{name}.yml"
    path.write_text(_fill(case.text, pki))
    ours = _ours(path)
    if case.refusal is None:
        assert ours is None, ours
    else:
        assert ours is not None, "accepted"
        assert len(ours.splitlines()) == 1, ours
        where, _, message = ours.partition(": ")
        assert where.startswith(f"{path}:") and where[len(f"{path}:"):].isdigit(), ours  # file:line
        assert message.startswith(_fill(case.refusal, pki)), ours
    accepted, said = _promtool(path)
    expected = (ours is None) if case.promtool_accepts is None else case.promtool_accepts
    assert accepted == expected, f"promtool: {said}"
    assert (case.promtool_accepts is None) != bool(case.why), "a case that differs from promtool says why"


def test_every_go_cipher_name_promtool_knows_maps_to_openssl(pki: Pki) -> None:
    """The name table is the toolkit's: each name promtool accepts is mapped, and OpenSSL here knows the result."""
    import ssl
    for name in [*TLS12_CIPHERS, *TLS13_CIPHERS]:
        path = pki.dir / "cipher.yml"
        path.write_text(TLS + f"  cipher_suites: [{name}]\n")
        assert _promtool(path)[0], name
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for name, openssl_name in TLS12_CIPHERS.items():
        ctx.set_ciphers(openssl_name)
        assert [c["name"] for c in ctx.get_ciphers() if c["protocol"] != "TLSv1.3"] == [openssl_name], name


def test_paths_are_relative_to_the_config_file(pki: Pki, tmp_path: Path) -> None:
    cfg = load_web_config(str(_write(pki.dir / "rel.yml", MTLS)))
    assert cfg.tls is not None and cfg.context is not None
    assert (cfg.tls.cert_file, cfg.tls.key_file, cfg.tls.client_ca_file) == (
        str(pki.server_cert), str(pki.server_key), str(pki.ca))
    assert cfg.files == (str(pki.dir / "rel.yml"), str(pki.server_cert), str(pki.server_key), str(pki.ca))


def test_settings_become_typed_values(pki: Pki) -> None:
    import ssl
    text = (MTLS + "  min_version: TLS13\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
            "  curve_preferences: [CurveP384]\n  prefer_server_cipher_suites: false\n"
            "  client_allowed_sans: [scraper, 'spiffe://x']\n"
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
            "    Content-Security-Policy: ''\nbasic_auth_users:\n  alice: '" + HASH + "'\n  '0123': '" + HASH + "'\n")
    cfg, _ = parse_web_config(text, "web.yml")
    tls = cfg.tls
    assert tls is not None
    assert (tls.client_auth, tls.min_version, tls.max_version) == (
        "RequireAndVerifyClientCert", ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)
    assert (tls.ciphers, tls.curve, tls.prefer_server_ciphers) == (("ECDHE-RSA-AES128-GCM-SHA256",), "secp384r1", False)
    assert tls.allowed_sans == ("scraper", "spiffe://x")
    assert cfg.headers == (("X-Frame-Options", "deny"),)  # a blank header is unset, as in the toolkit
    assert dict(cfg.users) == {"alice": HASH, "0123": HASH}  # names as written, not as YAML numbers


def test_tls13_suites_only_leave_no_tls12(pki: Pki) -> None:
    """In Go, TLS 1.3 suites are always on and listing only them leaves TLS 1.2 nothing to negotiate."""
    import ssl
    cfg, _ = parse_web_config(TLS + "  cipher_suites: [TLS_AES_256_GCM_SHA384]\n", "web.yml")
    assert cfg.tls is not None and cfg.tls.min_version == ssl.TLSVersion.TLSv1_3 and cfg.tls.ciphers == ()


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"^/no/such/web.yml: cannot read the web config file: No such file"):
        load_web_config("/no/such/web.yml")
    binary = tmp_path / "web.yml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WebConfigError, match=r"web.yml: not a text file"):
        load_web_config(str(binary))


def test_encrypted_key_is_refused_without_a_prompt(pki: Pki) -> None:
    subprocess.run(["openssl", "pkey", "-in", pki.server_key, "-out", pki.dir / "enc.key", "-aes256", "-passout",
                    "pass:x"], check=True, capture_output=True)
    path = _write(pki.dir / "enc.yml", "tls_server_config:\n  cert_file: server.crt\n  key_file: enc.key\n")
    with pytest.raises(WebConfigError, match=r"enc.yml:3: tls_server_config.key_file: .*enc.key: the key is encrypted"):
        load_web_config(str(path))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


WEB_KEYS = ["tls_server_config", "http_server_config", "basic_auth_users", "cert_file", "key_file",
            "client_auth_type", "client_ca_file", "min_version", "max_version", "cipher_suites", "curve_preferences",
            "prefer_server_cipher_suites", "client_allowed_sans", "http2", "headers", "X-Frame-Options", "alice",
            "rate_limit", "cert", "bogus"]
WEB_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 65), st.floats(allow_nan=True),
                        st.sampled_from(["server.crt", "server.key", "ca.crt", "/no/such", "TLS10", "TLS13",
                                         "RequireAndVerifyClientCert", "RequestClientCert", "X25519", "deny",
                                         "TLS_AES_128_GCM_SHA256", HASH, HASH[:40], ""]),
                        st.text(max_size=8))
WEB_TREES = st.recursive(WEB_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(WEB_KEYS), inner, max_size=4)), max_leaves=16)


def _loads_or_one_line(path: Path, text: str | bytes) -> None:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    try:
        load_web_config(str(path))
    except WebConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)


@settings(max_examples=300, deadline=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(st.sampled_from(WEB_KEYS), WEB_TREES, max_size=4))
def test_web_config_trees_never_trace_back(pki: Pki, tree: dict) -> None:
    _loads_or_one_line(pki.dir / "fuzz.yml", yaml.safe_dump(tree, allow_unicode=True))


@settings(max_examples=200, deadline=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.text(max_size=200), st.binary(max_size=64)))
def test_web_config_text_never_traces_back(pki: Pki, data: str | bytes) -> None:
    _loads_or_one_line(pki.dir / "fuzz.yml", data)


def test_a_deep_tree_is_an_error_not_a_crash(pki: Pki) -> None:
    _loads_or_one_line(pki.dir / "deep.yml", "tls_server_config: " + "[" * 5000)


@pytest.mark.parametrize("value", ["hunter2", "'$2y$10$hunter2'", "12345678", "[hunter2]"])
def test_basic_auth_value_never_echoed(tmp_path: Path, value: str) -> None:
    """A password typed in plain text by mistake must not reach the logs: the user is named, the value is not."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: {value}\n")
    text = _ours(path)
    assert text is not None and "basic_auth_users.alice" in text and "'alice'" in text
    assert "hunter2" not in text and "12345678" not in text

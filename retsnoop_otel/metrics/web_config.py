"""The exporter-toolkit web configuration file (node_exporter's `--web.config.file`): TLS and basic auth for
/metrics and /healthz.

The format and the refusals are the toolkit's (unknown keys, bad bcrypt hashes, a cert without its key, a
client CA without a client auth policy...), read so that each error names the file, the line and the key.
What Python's ssl module cannot do is refused with the reason rather than ignored: RequestClientCert and
RequireAnyClientCert (OpenSSL verifies every client certificate it asks for), TLS 1.0/1.1 (OpenSSL 3 refuses
them), several curves (ssl sets one), inline PEM (`cert`, `key`, `client_ca`) and `rate_limit`. The files it names are
loaded by web_tls, with errors at the line of their key.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from retsnoop_otel.inputs.files import shown
from retsnoop_otel.inputs.keys import unknown_key

# Go crypto/tls names (tls.CipherSuites(), the ones the toolkit accepts) -> OpenSSL names
TLS12_CIPHERS = MappingProxyType({
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
})
# always on in Go and in OpenSSL alike ("TLS 1.3 cipher suites are not configurable")
TLS13_CIPHERS = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
CURVES = MappingProxyType({"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1",
                           "X25519": "X25519"})
VERSIONS = MappingProxyType({"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3})
OLD_VERSIONS = ("TLS10", "TLS11")
CLIENT_AUTH = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# the toolkit's only settable headers, and the values it allows (None: any)
HEADERS: Mapping[str, tuple[str, ...] | None] = MappingProxyType({
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None})
_BCRYPT = re.compile(r"\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}")
# The highest bcrypt cost accepted. Each login with a wrong password or an unknown user runs one full check
# (2^cost rounds: about 1 s of one core at 14, twice that per step above; cost 31 over a day). 14 leaves room above
# the 10-12 that exporter-toolkit's users write (htpasswd -nBC 10) while keeping a check within a scrape timeout
# even on a slow core; the check cap and the 503 of basic_auth.py bound how many run at once.
MAX_BCRYPT_COST = 14

_TOP = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
        "cipher_suites", "curve_preferences", "prefer_server_cipher_suites", "client_allowed_sans")
_HTTP = ("http2", "headers")
# keys of newer exporter-toolkit versions that this server does not do: refused with the reason
_NOT_DONE = MappingProxyType({
    "rate_limit": "rate limiting is not supported; remove rate_limit (or rate-limit in a proxy)",
    "cert": "inline PEM is not supported; put the certificate in a file and give cert_file",
    "key": "inline PEM is not supported; put the key in a file (mode 0600) and give key_file",
    "client_ca": "inline PEM is not supported; put the CA certificates in a file and give client_ca_file",
})


class WebConfigError(ValueError):
    """One problem: `file:line: key: what is wrong and what to write instead`."""


Locate = Callable[[str, str], WebConfigError]  # (key, message) -> the error at that key's line


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_auth: str = "NoClientCert"  # one of CLIENT_AUTH
    client_ca_file: str | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: tuple[str, ...] = ()  # OpenSSL names of TLS 1.2 suites; () = OpenSSL's defaults
    curve: str | None = None  # OpenSSL name of the one ECDHE group; None = OpenSSL's list
    prefer_server_ciphers: bool = True
    allowed_sans: tuple[str, ...] = ()  # the client certificate needs one of these SANs; () = any


@dataclass(frozen=True)
class WebConfig:
    """A parsed web config. `context` is the loaded TLS context (None: plain HTTP); `files` are the paths
    whose change means reloading (the config itself, cert, key and client CA)."""

    path: str
    tls: TlsSettings | None = None
    headers: tuple[tuple[str, str], ...] = ()
    users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # user -> bcrypt hash
    http2: bool = True  # allowed, never offered: HTTP/1.1 only (ALPN is not set)
    context: ssl.SSLContext | None = field(default=None, compare=False)
    files: tuple[str, ...] = ()


class _Reader:
    """One file's YAML nodes; every error carries file, line and key."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._loader = yaml.SafeLoader("")
        self.lines: dict[str, int] = {}  # key -> line, for errors found after parsing (files, certificates)

    def fail(self, node: yaml.Node | int, key: str, msg: str) -> WebConfigError:
        line = node if isinstance(node, int) else node.start_mark.line + 1
        return WebConfigError(f"{self.path}:{line}: {key}: {msg}" if key else f"{self.path}:{line}: {msg}")

    def at(self, key: str, msg: str) -> WebConfigError:
        return self.fail(self.lines.get(key, 1), key, msg)

    def value(self, node: yaml.Node) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise self.fail(node, "", f"not valid YAML here: {' '.join(str(why).split())}") from None

    def mapping(self, node: yaml.Node, key: str, known: tuple[str, ...] | None) -> dict[str, yaml.Node]:
        """Keys as written (raw scalars); unknown and duplicate keys are errors, as in the toolkit."""
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, key, f"expected a mapping, got {_kind(node)}")
        out: dict[str, yaml.Node] = {}
        for knode, vnode in node.value:
            name = knode.value if isinstance(knode, yaml.ScalarNode) else None
            where = f"{key}.{name}" if key else str(name)
            if name is None:
                raise self.fail(knode, key, f"keys must be plain strings, got {_kind(knode)}")
            if known is not None and name not in known:
                if name in _NOT_DONE:
                    raise self.fail(knode, where, _NOT_DONE[name])
                raise self.fail(knode, where, unknown_key(name, known))
            if name in out:
                raise self.fail(knode, where, "duplicate key")
            out[name] = vnode
            self.lines[where] = knode.start_mark.line + 1
        return out

    def string(self, node: yaml.Node, key: str, scalars: tuple[type, ...] = (str,), null_is_blank: bool = False) -> str:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else None
        if null_is_blank and value is None and isinstance(node, yaml.ScalarNode):
            return ""  # as Go's YAML decoding leaves a string it gets null for
        if value is None or not isinstance(value, scalars):
            raise self.fail(node, key, f"expected a string, got {_kind(node)}")
        return value if isinstance(value, str) else node.value

    def boolean(self, node: yaml.Node, key: str) -> bool:
        value = self.value(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, bool):
            raise self.fail(node, key, f"expected true or false, got {_kind(node)}")
        return value

    def strings(self, node: yaml.Node, key: str) -> list[tuple[yaml.Node, str]]:
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, f"expected a list of strings, got {_kind(node)}")
        return [(n, self.string(n, f"{key}[{i}]")) for i, n in enumerate(node.value)]


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    tag = node.tag.rsplit(":", 1)[-1]
    return "nothing" if tag == "null" else f"{ {'str': 'string'}.get(tag, tag)} {node.value!r}"


def _relative(path: str, base: str) -> str:
    """Paths in the file are relative to its directory, as in the toolkit."""
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(os.path.abspath(base)), path)


def _choice(r: _Reader, node: yaml.Node, key: str, known: tuple[str, ...], refused: Mapping[str, str]) -> str:
    value = r.string(node, key)
    if value in refused:
        raise r.fail(node, key, refused[value])
    if value not in known:
        raise r.fail(node, key, f"unknown value '{value}'; expected one of {', '.join(known)}")
    return value


def _tls(r: _Reader, node: yaml.Node) -> TlsSettings | None:
    k = "tls_server_config"
    m = r.mapping(node, k, _TLS)
    files = {f: r.string(m[f], f"{k}.{f}", null_is_blank=True) for f in ("cert_file", "key_file", "client_ca_file")
             if f in m}
    files = {f: v for f, v in files.items() if v}  # "" is unset, as in the toolkit
    auth = "NoClientCert"
    if "client_auth_type" in m:
        why = ("Python's ssl module verifies every client certificate it asks for: use RequireAndVerifyClientCert "
               "(or VerifyClientCertIfGiven) with client_ca_file")
        auth = _choice(r, m["client_auth_type"], f"{k}.client_auth_type", ("", *CLIENT_AUTH),
                       dict.fromkeys(UNVERIFIED_CLIENT_AUTH, why)) or "NoClientCert"
    if not files and auth == "NoClientCert":
        given = [key for key, v in m.items() if not (isinstance(v, yaml.ScalarNode) and v.value in ("", "~", "null")
                                                     and v.tag.endswith((":null", ":str")))
                 and not (isinstance(v, yaml.SequenceNode) and not v.value)]
        if given:  # the toolkit serves plain HTTP here and ignores the rest: say so instead
            raise r.fail(m[given[0]], f"{k}.{given[0]}", "has no effect without cert_file and key_file: give both "
                         "for TLS, or remove tls_server_config")
        return None
    for need in ("cert_file", "key_file"):
        if need not in files:
            raise r.fail(node, k, f"missing {need} (TLS needs both cert_file and key_file)")
    if "client_ca_file" in files and auth == "NoClientCert":
        raise r.at(f"{k}.client_ca_file", "client CA configured without a client auth policy: set client_auth_type "
                   "to RequireAndVerifyClientCert (or VerifyClientCertIfGiven)")
    if auth != "NoClientCert" and "client_ca_file" not in files:
        raise r.at(f"{k}.client_auth_type", f"{auth} needs client_ca_file: the CA that signs the client "
                   "certificates (the system's public CAs would let anyone with a certificate in)")
    versions = {}
    old = ("OpenSSL 3 refuses TLS 1.0 and 1.1 at its default security level; use TLS12 or TLS13")
    for end, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = _choice(r, m[end], f"{k}.{end}", tuple(VERSIONS), dict.fromkeys(OLD_VERSIONS, old)) \
            if end in m else default
        versions[end] = VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise r.at(f"{k}.min_version", "is above max_version: no TLS version is left")
    ciphers: list[str] = []
    if "cipher_suites" in m:
        for n, name in r.strings(m["cipher_suites"], f"{k}.cipher_suites"):
            if name not in TLS12_CIPHERS and name not in TLS13_CIPHERS:
                raise r.fail(n, f"{k}.cipher_suites", f"unknown cipher '{name}' (Go names, such as "
                             "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256; insecure ones are refused, as in the toolkit)")
            if name in TLS12_CIPHERS:
                ciphers.append(TLS12_CIPHERS[name])
        if not ciphers and r.strings(m["cipher_suites"], f"{k}.cipher_suites"):
            if versions["max_version"] < ssl.TLSVersion.TLSv1_3:
                raise r.at(f"{k}.cipher_suites", "lists TLS 1.3 suites only, and max_version leaves no TLS 1.3")
            versions["min_version"] = ssl.TLSVersion.TLSv1_3  # as in Go: TLS 1.3 suites only leave no TLS 1.2
    curve = None
    if "curve_preferences" in m:
        curves = r.strings(m["curve_preferences"], f"{k}.curve_preferences")
        for n, name in curves:
            if name not in CURVES:
                raise r.fail(n, f"{k}.curve_preferences", f"unknown curve '{name}'; expected one of "
                             f"{', '.join(CURVES)}")
        if len(curves) > 1:
            raise r.fail(m["curve_preferences"], f"{k}.curve_preferences", "Python's ssl module sets one curve only "
                         "(SSLContext.set_ecdh_curve): keep one entry, or remove the key for OpenSSL's list")
        curve = CURVES[curves[0][1]] if curves else None
    sans: tuple[str, ...] = ()
    if "client_allowed_sans" in m:
        sans = tuple(s for _, s in r.strings(m["client_allowed_sans"], f"{k}.client_allowed_sans"))
        if sans and auth != "RequireAndVerifyClientCert":
            raise r.at(f"{k}.client_allowed_sans", "needs client_auth_type: RequireAndVerifyClientCert (without a "
                       "required certificate there is no SAN to check)")
    return TlsSettings(
        cert_file=_relative(files["cert_file"], r.path), key_file=_relative(files["key_file"], r.path),
        client_auth=auth,
        client_ca_file=_relative(files["client_ca_file"], r.path) if "client_ca_file" in files else None,
        min_version=versions["min_version"], max_version=versions["max_version"], ciphers=tuple(ciphers),
        curve=curve,
        prefer_server_ciphers=r.boolean(m["prefer_server_cipher_suites"], f"{k}.prefer_server_cipher_suites")
        if "prefer_server_cipher_suites" in m else True,
        allowed_sans=sans)


def _http(r: _Reader, node: yaml.Node) -> tuple[bool, tuple[tuple[str, str], ...]]:
    k = "http_server_config"
    m = r.mapping(node, k, _HTTP)
    http2 = r.boolean(m["http2"], f"{k}.http2") if "http2" in m else True
    headers = []
    for name, vnode in r.mapping(m["headers"], f"{k}.headers", None).items() if "headers" in m else ():
        key = f"{k}.headers.{name}"
        if name not in HEADERS:
            raise r.at(key, f"this header cannot be set; the toolkit allows {', '.join(HEADERS)}")
        value = r.string(vnode, key, (str, int, float, bool))  # a number as written, as Go's YAML reads it
        if any(ord(c) < 32 or ord(c) == 127 for c in value):  # CR/LF would add headers of its own to each answer
            raise r.fail(vnode, key, "a control character (such as a line break) in the value; write it on one "
                         "line, without control characters")
        allowed = HEADERS[name]
        if allowed is not None and value not in allowed:
            raise r.fail(vnode, key, f"'{value}' is not allowed; expected one of {', '.join(allowed)}")
        if value:  # blank: unset, as in the toolkit
            headers.append((name, value))
    return http2, tuple(headers)


def _users(r: _Reader, node: yaml.Node) -> Mapping[str, str]:
    users = {}
    for name, vnode in r.mapping(node, "basic_auth_users", None).items():
        key = f"basic_auth_users.{name}"
        if not name.strip() or any(ord(c) < 32 or ord(c) == 127 or c == ":" for c in name):
            # Basic credentials are user:password: such a user can never log in
            raise r.fail(vnode, "basic_auth_users", f"the user name {shown(name, 40)} cannot log in: give a name "
                         "that is not empty, without ':' or control characters")
        value = r.value(vnode) if isinstance(vnode, yaml.ScalarNode) else None
        text = value if isinstance(value, str) else ""
        m = _BCRYPT.fullmatch(text)
        if not m:
            # never the value: a password typed here in plain text by mistake must not reach the logs
            what = "a string" if isinstance(value, str) else _kind(vnode).split(" ", 1)[0]
            user = f"the value for user {shown(name, 40)}"
            if text.startswith("$2$"):
                why = "the $2$ variant is not supported by the bcrypt library"
            elif what == "nothing":
                why = f"{user} is missing: expected a bcrypt hash ($2y$10$ and 53 characters of ./A-Za-z0-9)"
            else:
                why = (f"{user} is {what} that is not a bcrypt hash (not shown: it may be a password); expected "
                       "$2y$10$ and 53 characters of ./A-Za-z0-9")
            raise r.fail(vnode, key, f"{why}; make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'")
        cost = int(m.group(1))
        if not 4 <= cost <= MAX_BCRYPT_COST:
            why = ("4 is bcrypt's least" if cost < 4 else
                   f"each login with a wrong password or an unknown user runs one check of 2^{cost} rounds, and "
                   f"2^{MAX_BCRYPT_COST} already takes about a second of CPU")
            raise r.fail(vnode, key, f"bcrypt cost {cost} is outside 4..{MAX_BCRYPT_COST} ({why}); make one with: "
                         "htpasswd -nBC 10 \"\" | tr -d ':\\n'")
        users[name] = text
    return MappingProxyType(users)


def parse_web_config(text: str, path: str) -> tuple[WebConfig, Locate]:
    """The settings of a file's text, and where each key is (nothing else is read: web_tls loads the files)."""
    r = _Reader(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        line = mark.line + 1 if mark is not None else 1
        raise r.fail(line, "", f"not valid YAML: {' '.join(str(why).split())}") from None
    except RecursionError:
        raise WebConfigError(f"{path}: not valid YAML: nested too deeply") from None
    if root is None:  # an empty file: plain HTTP, no auth (the toolkit accepts it too)
        return WebConfig(path=path, files=(path,)), r.at
    m = r.mapping(root, "", _TOP)
    tls = _tls(r, m["tls_server_config"]) if "tls_server_config" in m else None
    http2, headers = _http(r, m["http_server_config"]) if "http_server_config" in m else (True, ())
    users = _users(r, m["basic_auth_users"]) if "basic_auth_users" in m else MappingProxyType({})
    files = (path,) + ((tls.cert_file, tls.key_file) if tls else ()) + \
        ((tls.client_ca_file,) if tls and tls.client_ca_file else ())
    return WebConfig(path=path, tls=tls, headers=headers, users=users, http2=http2, files=files), r.at
